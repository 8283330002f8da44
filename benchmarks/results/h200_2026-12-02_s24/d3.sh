#!/usr/bin/env bash
# session 24 call 3: the dq-writer canonical failures (default vs epiregs) and the test groups
# that call 2's time limit cut
set -u
O=${OUT:-./gpu_out}; mkdir -p $O/r
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
start=$SECONDS
t() { echo "[$((SECONDS - start))s] $*" >> $O/r/timeline.txt; }
PYT="python3 -m pytest -m gpu -q -rA -p no:cacheprovider"
T=${T:-470}
r() { local n=$1; shift; (timeout $T "$@" > $O/r/t_$n.txt 2>&1; t "$n: $(tail -1 $O/r/t_$n.txt)") & }
K="test_hstu_bwd_dq_writer and canonical"
r dqw_canon_default $PYT tests/test_gpu_dq_writer.py -k "$K"
r dqw_canon_regs env HSTU_TEST_BWD_WS=epiregs $PYT tests/test_gpu_dq_writer.py -k "$K"
r dqw_rest $PYT tests/test_gpu_dq_writer.py -k "not ($K)"
r det_writer $PYT tests/test_gpu_det_writer.py
r hstu_grid_0 env HSTU_TEST_SHARD=0/3 $PYT -k TestHSTUKernelGrid tests/test_gpu_hstu.py
r bsa_ws $PYT tests/test_gpu_bsa.py -k "sm90ws_backward or bsa_bwd_deterministic"
r bsa_alias $PYT tests/test_gpu_bsa_dqalias.py tests/test_gpu_bsa_dqearly.py
r var_epi $PYT tests/test_gpu_bwd_variants.py -k "epi_from_registers"
r var_claim $PYT tests/test_gpu_bwd_variants.py -k "dqclaim or convert"
wait
grep -h "FAILED\|^E  " $O/r/t_*.txt | head -40 >> $O/r/timeline.txt
cd $O && tar czf r.tgz r && rm -rf r
