#!/usr/bin/env bash
# Prepared in session 41 (no device that session; not run yet): the four opt-in changes of
# the block-sparse backward's work outside its kernel, bsa_kq_impl=kernel (the K->Q lists in
# one launch, kernels/bsa_kq_lists.py), bsa_bwd_ws=zerolag (the dQ workspace zeroed by the
# backward's writer warps two (batch, KV head) pairs ahead instead of by the preprocessing
# launch) and bsa_bwd_ws=tailconv (the dq reordering on the SMs of the backward's last
# wave, each pair's tiles once the pair's CTAs have completed), bsa_pre_impl=kernel4 (four
# rows' loads per preprocessing thread at once).
# (1) in parallel: the list kernel against metadata.build_kq_csr (tests/test_gpu_kq_lists.py),
# the D 64 / 128 cases of the block-sparse grid with its lists (BSA_TEST_IMPLS kqkernel), and
# the zerolag and tailconv backward cases (NaN left in reused buffers by an all-NaN run);
# (2) per-kernel traces of the backward alone at blk64 25 % and blk128: default, each
# change alone and all of them (each only where its tests passed);
# (3) the backward rows 0, 2, 3, 4 of the table (sustained): default / the last variant
# traced (all of them where every test passed) / default.
# Usage (device, after `source .devcache/setup.sh`): OUT=$OUT bash scripts/sessions/gpu_s41_bwd.sh [seconds]
. "$(dirname "$0")/../gpu_lib.sh" bwd41 "${1:-560}"
export JAX_SPARSE_ATTN_GPU_TEST_TIMEOUT=120
T=200
timeout $T $PYT tests/test_gpu_kq_lists.py > $O/t_kq.txt 2>&1 &
ids=$(BSA_TEST_IMPLS=nodefault,kqkernel python3 -m pytest -m gpu --collect-only -q \
  tests/test_gpu_bsa.py -k TestBSAKernelGrid 2>/dev/null | grep -v 'd32\|d256' | grep '::')
BSA_TEST_IMPLS=nodefault,kqkernel timeout $T $PYT $ids > $O/t_kq_grid.txt 2>&1 &
timeout $T $PYT tests/test_gpu_bwd_variants.py -k "zerolag and not tailconv" > $O/t_zl.txt 2>&1 &
timeout $T $PYT tests/test_gpu_bwd_variants.py -k "tailconv and (9pairs or 16pairs or gqa8)" \
  > $O/t_tc.txt 2>&1 &
timeout $T $PYT tests/test_gpu_bsa.py -k preprocess > $O/t_pre.txt 2>&1 &
wait
for f in kq kq_grid zl tc pre; do t "$f: $(tail -1 $O/t_$f.txt)"; done
grep -h "^FAILED\|^E  \|Timeout\|timed out" $O/t_*.txt | head -20
ok() { grep -q " passed" $O/t_$1.txt && ! grep -qi "failed\|error\|timeout" $O/t_$1.txt; }
KQ="JAX_SPARSE_ATTN_BSA_KQ_IMPL=kernel"; WS="JAX_SPARSE_ATTN_BSA_BWD_WS"
V=(""); N=(default)
if ok kq && ok kq_grid; then V+=("$KQ"); N+=(kq); fi
if ok zl; then V+=("$WS=zerolag"); N+=(zl); fi
if ok tc; then V+=("$WS=tailconv"); N+=(tc); fi
if ok pre; then V+=("JAX_SPARSE_ATTN_BSA_PRE_IMPL=kernel4"); N+=(pre4); fi
# all of them (the two flags joined with '+', which bsa_bench and gpu_trace take as ',')
if ok kq && ok kq_grid && ok zl && ok tc && ok pre; then
  V+=("$KQ,$WS=zerolag+tailconv,JAX_SPARSE_ATTN_BSA_PRE_IMPL=kernel4"); N+=(all); fi
for i in "${!V[@]}"; do
  env $(echo "${V[$i]}" | tr ',' ' ' | tr '+' ',') timeout 50 python3 scripts/gpu_trace.py \
    --iters 10 --case bsa_bwd_blk64_25 --case bsa_bwd_blk128 --out $O/trace_${N[$i]}.json \
    > $O/trace_${N[$i]}.txt 2>&1
  t "trace ${N[$i]} rc=$?"; grep "^==\|us  x1" $O/trace_${N[$i]}.txt | head -24
done
# the table rows: default / the last variant (all of them, or the last that passed) / default
TAB=";${V[${#V[@]}-1]};"
timeout $(( $(left) - 10 )) python3 -m benchmarks.bsa_bench --table-pass bwd --rows 0,2,3,4 \
  --table "$TAB" --out $O/bwd.json > $O/bwd.txt 2>&1
t "bwd rows rc=$?"; grep -v "^wrote" $O/bwd.txt | tail -24
