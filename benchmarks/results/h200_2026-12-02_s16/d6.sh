#!/usr/bin/env bash
# memcheck (garbage metadata grid) on the dQ writer paths, with the session-15 environment
set -u
O=${OUT:-./gpu_out}; mkdir -p $O/r
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
export JAX_COMPILATION_CACHE_DIR=/tmp/san_jcc JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=0 \
       JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES=0 JAX_SPARSE_ATTN_CACHE_DIR=/tmp/san_kc \
       XLA_FLAGS=--xla_gpu_autotune_level=0
start=$SECONDS
t() { echo "[$((SECONDS - start))s] $*" >> $O/r/timeline.txt; }
san() {
  (timeout 55 python3 tests/sanitize_grid.py --only "$2" > $O/r/warm_$1.log 2>&1; echo "rc=$?" >> $O/r/warm_$1.log; t "warm $1"
   timeout 110 compute-sanitizer --tool memcheck --report-api-errors no --error-exitcode 9 python3 tests/sanitize_grid.py --only "$2" > $O/r/san_$1.log 2>&1; echo "rc=$?" >> $O/r/san_$1.log; t "san $1 done") &
}
san bsa_auto "bsa fwd=auto bwd=auto"
san hstu "hstu bwd=default"
wait
for f in $O/r/san_*.log; do echo "$(basename $f): $(grep -E 'cases ok|ERROR SUMMARY' $f | tr '\n' ' ') $(tail -1 $f)"; done >> $O/r/timeline.txt
cd $O && tar czf r.tgz r && rm -rf r
