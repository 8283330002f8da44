#!/usr/bin/env bash
# s26 call 1: is dqalt hanging? small cases with timeouts, then compute-sanitizer synccheck
set -u
O=${OUT:-./gpu_out}; mkdir -p $O/r
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
start=$SECONDS
t() { echo "[$((SECONDS - start))s] $*" >> $O/r/timeline.txt; }
timeout 60 python3 .s26/small.py 128 1 dqalt 50 > $O/r/s128_1.txt 2>&1; t "s128 k1 rc=$?"
timeout 40 python3 .s26/small.py 256 1 dqalt 35 > $O/r/s256_1.txt 2>&1; t "s256 k1 rc=$?"
timeout 40 python3 .s26/small.py 512 3 dqalt 35 > $O/r/s512_3.txt 2>&1; t "s512 k3 rc=$?"
timeout 150 compute-sanitizer --tool synccheck --print-limit 20 python3 .s26/small.py 256 1 dqalt 140 > $O/r/sync.txt 2>&1; t "synccheck rc=$?"
