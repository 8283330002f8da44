#!/usr/bin/env bash
# s26 call 3: dqalt with the final hand-back fixed: a small comparison with the default, the
# GPU tests of dqalt, then (time permitting) the benchmark's blk128 row, default vs dqalt.
# $1: seconds this call may take
set -u
O=${OUT:-./gpu_out}; mkdir -p $O/r
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
BUDGET=${1:-250}
start=$SECONDS
t() { echo "[$((SECONDS - start))s] $*" >> $O/r/timeline.txt; }
left() { echo $((BUDGET - (SECONDS - start))); }
PYT="python3 -m pytest -m gpu -q -rA -p no:cacheprovider"
W=JAX_SPARSE_ATTN_BSA_BWD_WS
timeout 45 python3 .s26/small.py 512 3 dqalt 40 > $O/r/small.txt 2>&1; rc=$?; t "small rc=$rc"
[ $rc -ne 0 ] && exit 0
T=$(( $(left) > 200 ? 140 : $(left) - 10 ))
(timeout $T $PYT tests/test_gpu_bwd_variants.py -k dqalt > $O/r/t_dqalt.txt 2>&1; t "dqalt variants: $(tail -1 $O/r/t_dqalt.txt)") &
for i in 0 1 2; do (timeout $T env BSA_TEST_IMPLS=dqalt,nodefault BSA_TEST_SHARD=$i/3 $PYT tests/test_gpu_bsa.py -k "Grid" > $O/r/t_bsa_alt_$i.txt 2>&1; t "bsa grid dqalt $i: $(tail -1 $O/r/t_bsa_alt_$i.txt)") & done
wait
grep -h "FAILED\|^E  " $O/r/t_*.txt | head -20 >> $O/r/timeline.txt
L=$(left); t "left $L"
if [ $L -gt 40 ]; then
  timeout $((L - 5)) python3 -m benchmarks.bsa_bench --table ";$W=dqalt" --table-pass bwd --rows 3 --out $O/r/bsa_dqalt.json > $O/r/bsa_dqalt.txt 2>&1; t "bench rc=$?"
fi
