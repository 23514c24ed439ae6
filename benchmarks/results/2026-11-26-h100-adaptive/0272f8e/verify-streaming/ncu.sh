#!/usr/bin/env bash
export PYTHONPATH=$PWD
OUT=${OUT:-$PWD/out}; mkdir -p $OUT
python3 benchmarks/results/2026-11-26-h100-adaptive/0272f8e/verify-streaming/ncu_attn.py > $OUT/times.txt 2>&1; cat $OUT/times.txt
which ncu || ls /opt/nvidia/nsight-compute/*/ncu
NCU=$(which ncu || ls /opt/nvidia/nsight-compute/*/ncu | head -1)
for c in A B C; do
  timeout 150 $NCU --clock-control none --nvtx --nvtx-include "case$c/" --launch-count 2 \
    --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
    --section MemoryWorkloadAnalysis --section SchedulerStats \
    python3 benchmarks/results/2026-11-26-h100-adaptive/0272f8e/verify-streaming/ncu_attn.py $c > $OUT/ncu_$c.txt 2>&1
  echo "case $c rc=$?"; grep -E "Duration|DRAM Throughput|Memory Throughput|Achieved Occupancy|Theoretical Occupancy|Registers Per|Block Limit|Grid Size|Block Size|Waves Per SM|Stall|Dynamic Shared|Static Shared|Eligible|Issued Warp" $OUT/ncu_$c.txt | head -60
done
