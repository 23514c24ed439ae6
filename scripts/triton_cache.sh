# Sourced by scripts/gpu_suite.sh and scripts/gpu_peer.sh. Triton's compiled kernels travel between
# machines (a fresh machine spends minutes compiling specdec's: a whole GPU test run did not fit one call).
# An earlier call's $OUT/triton-cache.tgz (or its parts, triton-cache.tgz.00, .01, ...: a call hands back
# files of 16 MiB at most), put (`gpu_peer.sh put .peer/tc`) or carried in .peer/tc/, is unpacked before
# the run, and return_triton_cache hands it back when it grew.
export TRITON_CACHE_DIR=${TRITON_CACHE_DIR:-/tmp/triton-cache}
part_mb=${TRITON_CACHE_PART_MB:-15}
for dir in .peer/tc /tmp/peer-parts; do
  parts=$(ls $dir/triton-cache.tgz.[0-9]* 2>/dev/null || ls $dir/triton-cache.tgz 2>/dev/null)
  if [ -n "$parts" ] && [ ! -d $TRITON_CACHE_DIR ]; then
    mkdir -p $TRITON_CACHE_DIR && cat $parts | tar xz -C $TRITON_CACHE_DIR
  fi
done
cache_before=$(du -sk $TRITON_CACHE_DIR 2>/dev/null | cut -f1)

return_triton_cache() {  # $OUT/triton-cache.tgz, in parts of 15 MiB where it is larger, when the cache grew
  # and the parts fit beside the run's own files (8 files a call)
  [ -d $TRITON_CACHE_DIR ] && [ "$(du -sk $TRITON_CACHE_DIR | cut -f1)" != "$cache_before" ] || return 0
  local tgz=$TRITON_CACHE_DIR.tgz size room parts
  tar czf $tgz -C $TRITON_CACHE_DIR . || return 0
  size=$(stat -c %s $tgz)
  room=$((8 - $(find "$OUT" -type f | wc -l)))
  parts=$(( (size + part_mb * 1024 * 1024 - 1) / (part_mb * 1024 * 1024) ))
  if [ "$parts" -gt "$room" ]; then
    echo "Triton cache $(du -h $tgz | cut -f1) not handed back: $parts parts, room for $room"
  elif [ "$parts" -le 1 ]; then cp $tgz "$OUT/triton-cache.tgz"
  else split -b "${part_mb}M" -d $tgz "$OUT/triton-cache.tgz."; fi
}
