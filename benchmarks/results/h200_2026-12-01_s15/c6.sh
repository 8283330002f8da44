#!/usr/bin/env bash
# compute-sanitizer memcheck of the garbage-metadata cases on the new defaults: BSA sm90ws bwd
# blk64/D128 dQ after dV/dK, deterministic with the dQ writer warp, HSTU sm90 bwd D=256 tile dQ
set -u
O=${OUT:-./gpu_out}; mkdir -p $O/logs
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
export JAX_COMPILATION_CACHE_DIR=/tmp/san_jcc JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=0 \
       JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES=0 JAX_SPARSE_ATTN_CACHE_DIR=/tmp/san_kc \
       XLA_FLAGS=--xla_gpu_autotune_level=0
start=$SECONDS
t() { echo "[$((SECONDS - start))s] $*" >> $O/timeline.txt; }
run() { # phase name only shard
  local pre=""; [ $1 = san ] && pre="compute-sanitizer --tool memcheck --report-api-errors no --error-exitcode 9"
  (timeout $([ $1 = warm ] && echo 120 || echo 210) $pre python3 tests/sanitize_grid.py --only "$3" --shard $4 > $O/logs/${1}_$2.log 2>&1; echo "rc=$?" >> $O/logs/${1}_$2.log) &
}
for ph in warm san; do
  for i in 0 1 2 3; do run $ph a$i "bsa fwd=auto bwd=" $i/4; done
  for i in 0 1 2; do run $ph d$i "bsa deterministic" $i/3; done
  for i in 0 1; do run $ph h$i "hstu bwd=default" $i/2; done
  run $ph s0 "hstu bwd=sm90" 0/1
  wait; t "$ph done"
done
for f in $O/logs/san_*.log; do echo "$(basename $f): $(grep -E 'cases ok|ERROR SUMMARY' $f | tr '\n' ' ') $(tail -1 $f)"; done > $O/san_summary.txt
cat $O/san_summary.txt >> $O/timeline.txt
cd $O && tar czf /tmp/c6.tgz logs && rm -rf logs && mv /tmp/c6.tgz $O/c6.tgz
