#!/usr/bin/env bash
# final: GPU fuzz test, HSTU D256 deterministic with the writer, memcheck on the writer paths
set -u
O=${OUT:-./gpu_out}; mkdir -p $O/r
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
export JAX_SPARSE_ATTN_CACHE_DIR=/tmp/jsa_kc
start=$SECONDS
t() { echo "[$((SECONDS - start))s] $*" >> $O/r/timeline.txt; }
(timeout 400 python3 -m pytest -m gpu -q -n 4 tests/test_gpu_fuzz.py > $O/r/t_fuzz.txt 2>&1; t "fuzz rc=$?") &
(timeout 200 python3 -m pytest -m gpu -q tests/test_gpu_hstu_bwd_d256.py -k deterministic > $O/r/t_d256_det.txt 2>&1; t "d256 det rc=$?"; timeout 100 python3 -m pytest -m gpu -q tests/test_gpu_det_writer.py -k "d256" > $O/r/t_d256_det_off.txt 2>&1; t "d256 det off rc=$?"; timeout 100 python3 -m pytest -m gpu -q tests/test_gpu_bsa.py -k deterministic > $O/r/t_bsa_det.txt 2>&1; t "bsa det rc=$?") &
san() { # name only
  (timeout 150 python3 tests/sanitize_grid.py --only "$2" > $O/r/warm_$1.log 2>&1; echo "rc=$?" >> $O/r/warm_$1.log
   timeout 230 compute-sanitizer --tool memcheck --report-api-errors no --error-exitcode 9 python3 tests/sanitize_grid.py --only "$2" > $O/r/san_$1.log 2>&1; echo "rc=$?" >> $O/r/san_$1.log; t "san $1 done") &
}
san bsa_auto "bsa fwd=auto bwd=auto"
san bsa_ws "bsa fwd=auto bwd=sm90ws"
san hstu "hstu bwd=default"
wait; t "all"
for f in t_fuzz t_d256_det t_d256_det_off t_bsa_det; do echo "$f: $(tail -1 $O/r/$f.txt)" >> $O/r/timeline.txt; done
for f in $O/r/san_*.log; do echo "$(basename $f): $(grep -E 'cases ok|ERROR SUMMARY' $f | tr '\n' ' ') $(tail -1 $f)"; done >> $O/r/timeline.txt
cd $O && tar czf r.tgz r && rm -rf r
