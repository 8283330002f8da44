#!/usr/bin/env bash
# session 24 call 2: dK / dV through shared memory as the default (HSTU and BSA sm90ws
# backward): BSA bitwise check against epiregs, GPU tests, then timing
set -u
O=${OUT:-./gpu_out}; mkdir -p $O/r
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
start=$SECONDS
t() { echo "[$((SECONDS - start))s] $*" >> $O/r/timeline.txt; }
PYT="python3 -m pytest -m gpu -q -rA -p no:cacheprovider"
T=290
r() { local n=$1; shift; (timeout $T "$@" > $O/r/t_$n.txt 2>&1; t "$n: $(tail -1 $O/r/t_$n.txt)") & }
r bsa_check python3 benchmarks/results/h200_2026-12-02_s24/bsa_epi_check.py
for i in 0 1 2; do r hstu_grid_$i env HSTU_TEST_SHARD=$i/3 $PYT -k TestHSTUKernelGrid tests/test_gpu_hstu.py; done
for i in 0 1 2; do r bsa_grid_$i env BSA_TEST_SHARD=$i/3 $PYT tests/test_gpu_bsa.py -k "not sm90ws"; done
r bsa_ws $PYT tests/test_gpu_bsa.py -k "sm90ws_backward or bsa_bwd_deterministic"
r writers $PYT tests/test_gpu_dq_writer.py tests/test_gpu_det_writer.py
r bsa_alias $PYT tests/test_gpu_bsa_dqalias.py tests/test_gpu_bsa_dqearly.py
r var_epi $PYT tests/test_gpu_bwd_variants.py -k "epi_from_registers"
r var_claim $PYT tests/test_gpu_bwd_variants.py -k "dqclaim or convert"
wait
grep -h "FAILED\|^E  " $O/r/t_*.txt | head -30 >> $O/r/timeline.txt
W=JAX_SPARSE_ATTN_HSTU_BWD_WS
timeout 100 python3 benchmarks/hstu_bench.py --case 32x1024-causal --case jagged32-causal --case 8x4096-causal --case 8x4096-causal-d64 --bwd-only --variant "" --variant "$W=epiregs" --variant "" --iters 20 --out $O/r/hstu_epi.json > $O/r/hstu_epi.txt 2>&1; t "hstu bench rc=$?"
timeout 120 python3 -m benchmarks.bsa_bench --table ";JAX_SPARSE_ATTN_BSA_BWD_WS=epiregs;" --table-pass bwd --rows 0,2,3,4,6,7 --out $O/r/bsa_epi.json > $O/r/bsa_epi.txt 2>&1; t "bsa bench rc=$?"
cd $O && tar czf r.tgz r && rm -rf r
