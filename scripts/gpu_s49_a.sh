#!/usr/bin/env bash
# Session 49's device call (about 560 s, any Hopper GPU; ratios within the call): (1) the
# backward rows blk64 12.5 %, blk128 12.5 % and S 32768: the default (wghand at blk 128),
# ldscale (lse log2 e and delta softmax_scale scaled by XLA before the kernel) and nowghand,
# sustained and burst; (2) in parallel: the block-sparse grid on the default switches (three
# shards) with the sm90ws backward cases, the grid with ldscale, the fuzz cases with ldscale,
# then the causal, pack_gqa, fixed-point and wghand / persist / zerolag variant cases.
# Usage (device, after `source .devcache/setup.sh`): OUT=$OUT bash scripts/gpu_s49_a.sh [seconds]
. "$(dirname "$0")/gpu_lib.sh" s49a "${1:-560}"
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv > $O/gpu.txt 2>&1
W=JAX_SPARSE_ATTN_BSA_BWD_WS
timeout 200 python3 -m benchmarks.bsa_bench --table-pass bwd --rows 0,3,4 --timing both \
  --table ";$W=ldscale;$W=nowghand;" --out $O/bwd.json > $O/bwd.txt 2>&1
t "bwd rows rc=$?"; grep -v "^wrote" $O/bwd.txt | tail -10
T=$(( $(left) - 15 ))
bsa_grid_bg $T
BSA_TEST_IMPLS=nodefault,ldscale timeout $T $PYT tests/test_gpu_bsa.py -k TestBSAKernelGrid \
  > $O/t_ldgrid.txt 2>&1 &
( env $W=ldscale timeout $(( T / 2 )) $PYT tests/test_gpu_fuzz.py -k bsa > $O/t_ldfuzz.txt 2>&1
  timeout $(( $(left) - 15 )) $PYT tests/test_gpu_bsa_causal.py tests/test_gpu_bsa_pack_gqa.py \
    tests/test_gpu_bwd_variants.py -k "blk128 and (causal_kernel or (pack_gqa_kernel and not \
    decode and not splits) or wghand)" > $O/t_more.txt 2>&1
  timeout $(( $(left) - 15 )) $PYT tests/test_gpu_dq_fixed.py > $O/t_fixed.txt 2>&1 ) &
wait
for f in $O/t_*.txt; do t "$(basename $f): $(tail -1 $f)"; done
grep -h "^FAILED\|^ERROR\|Timeout\|timed out" $O/t_*.txt | head -20
