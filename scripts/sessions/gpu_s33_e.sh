#!/usr/bin/env bash
# Session 33, call E: the forward with epivec as the default on the paths the BSA grid does not
# cover: the sm90ws forward's own cases (poisoned outputs, NaN in unlisted blocks and past
# block_sizes, every block listed), packed GQA (its own epilogue) and causal.
# Usage (device, after `source .devcache/setup.sh`): OUT=$OUT bash scripts/sessions/gpu_s33_e.sh [seconds]
. "$(dirname "$0")/../gpu_lib.sh" e "${1:-100}"
timeout $((BUDGET - 5)) $PYT tests/test_gpu_bsa.py tests/test_gpu_bsa_pack_gqa.py tests/test_gpu_bsa_causal.py \
  -k "sm90ws_forward or (kernel_vs_reference and (r2-blk64-d128-bf16-bhsd or r4-blk64-d64-fp16-bshd-sizes3 or r8-blk128-d128-bf16-bshd-sizes3 or pack2-bf16-blk64-d128-sq-gt-skv-empty-sizes or bf16-blk128-d128-square))" \
  > $O/t_epivec_paths.txt 2>&1
t "epivec default paths rc=$?: $(tail -1 $O/t_epivec_paths.txt)"
grep -h "PASSED\|FAILED\|^E  \|passed\|failed" $O/t_*.txt 2>/dev/null | head -40 | tee -a $O/timeline.txt
