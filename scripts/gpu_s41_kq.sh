#!/usr/bin/env bash
# Prepared in session 41 (no device that session; not run yet): the one-launch K->Q list
# kernel of the block-sparse backward (bsa_kq_impl=kernel, kernels/bsa_kq_lists.py).
# (1) in parallel: its comparison with metadata.build_kq_csr (tests/test_gpu_kq_lists.py)
# and the D 64 / 128 cases of the block-sparse grid with its lists (BSA_TEST_IMPLS kqkernel);
# (2) only if (1) passed: per-kernel traces of the backward alone at blk64 12.5 % / 25 % and
# blk128, XLA lists then the kernel's; the list construction alone both ways (bsa_bench csr);
# the backward rows 0, 2, 3, 4 of the table, default / kernel / default / kernel (sustained).
# Usage (device, after `source .devcache/setup.sh`): OUT=$OUT bash scripts/gpu_s41_kq.sh [seconds]
. "$(dirname "$0")/gpu_lib.sh" kq41 "${1:-560}"
export JAX_SPARSE_ATTN_GPU_TEST_TIMEOUT=120
T=200
timeout $T $PYT tests/test_gpu_kq_lists.py > $O/t_kq.txt 2>&1 &
ids=$(BSA_TEST_IMPLS=nodefault,kqkernel python3 -m pytest -m gpu --collect-only -q \
  tests/test_gpu_bsa.py -k TestBSAKernelGrid 2>/dev/null | grep -v 'd32\|d256' | grep '::')
BSA_TEST_IMPLS=nodefault,kqkernel timeout $T $PYT $ids > $O/t_kq_grid.txt 2>&1 &
wait
for f in kq kq_grid; do t "$f: $(tail -1 $O/t_$f.txt)"; done
grep -h "^FAILED\|^E  \|Timeout\|timed out" $O/t_*.txt | head -20
if grep -q " passed" $O/t_kq.txt && ! grep -qi "failed\|error\|timeout" $O/t_kq.txt; then
  for kq in xla kernel; do
    JAX_SPARSE_ATTN_BSA_KQ_IMPL=$kq timeout 90 python3 scripts/gpu_trace.py --iters 20 \
      --case bsa_bwd_blk64 --case bsa_bwd_blk64_25 --case bsa_bwd_blk128 \
      --out $O/trace_$kq.json > $O/trace_$kq.txt 2>&1
    t "trace $kq rc=$?"; grep "^==\|us  x1" $O/trace_$kq.txt | head -40
  done
  timeout 90 python3 -m benchmarks.bsa_bench \
    --variants ":csr,blk128csr;JAX_SPARSE_ATTN_BSA_KQ_IMPL=kernel:csr,blk128csr" \
    --out $O/csr.json > $O/csr.txt 2>&1
  t "csr rc=$?"; grep -v "^wrote" $O/csr.txt | tail -6
  timeout $(( $(left) - 10 )) python3 -m benchmarks.bsa_bench --table-pass bwd --rows 0,2,3,4 \
    --table ";JAX_SPARSE_ATTN_BSA_KQ_IMPL=kernel;;JAX_SPARSE_ATTN_BSA_KQ_IMPL=kernel" \
    --out $O/bwd.json > $O/bwd.txt 2>&1
  t "bwd rows rc=$?"; grep -v "^wrote" $O/bwd.txt | tail -20
else
  t "the kernel's lists did not match: no timing"
fi
