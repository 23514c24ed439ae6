# Sourced by scripts/gpu_suite.sh and scripts/gpu_peer.sh. Triton's compiled kernels travel between
# machines (a fresh machine spends minutes compiling specdec's): an earlier call's $OUT/triton-cache.tgz,
# put (`gpu_peer.sh put .peer/tc`) or carried as .peer/tc/triton-cache.tgz, is unpacked before the run, and
# return_triton_cache hands it back when it grew.
export TRITON_CACHE_DIR=/tmp/triton-cache
for cache in .peer/tc/triton-cache.tgz /tmp/peer-parts/triton-cache.tgz; do
  if [ -f $cache ] && [ ! -d $TRITON_CACHE_DIR ]; then
    mkdir -p $TRITON_CACHE_DIR && tar xzf $cache -C $TRITON_CACHE_DIR
  fi
done
cache_before=$(du -sk $TRITON_CACHE_DIR 2>/dev/null | cut -f1)

return_triton_cache() {  # $OUT/triton-cache.tgz where the cache grew and fits what a call hands back (8 files
  # of 16 MiB at most: the run's own files first)
  [ -d $TRITON_CACHE_DIR ] && [ "$(du -sk $TRITON_CACHE_DIR | cut -f1)" != "$cache_before" ] || return 0
  [ "$(ls "$OUT" | wc -l)" -lt 8 ] || { echo "Triton cache not handed back: \$OUT holds 8 files"; return 0; }
  tar czf /tmp/triton-cache.tgz -C $TRITON_CACHE_DIR . || return 0
  if [ "$(stat -c %s /tmp/triton-cache.tgz)" -le $((16 * 1024 * 1024)) ]; then cp /tmp/triton-cache.tgz "$OUT/"
  else echo "Triton cache $(du -h /tmp/triton-cache.tgz | cut -f1): over 16 MiB, not handed back"; fi
}
