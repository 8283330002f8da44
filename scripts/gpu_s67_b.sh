#!/usr/bin/env bash
# oinq the forward's default at D 128: the forward rows against nooinq (the previous default),
# interleaved, then D 64 with oinq forced; then the block-sparse forward GPU tests on the new
# default (sm90ws forward and public-API cases, causal, fuzz, options, transforms, split-KV),
# six processes at once; then the large-tensor forward / backward cases alone.
# Usage (device, after `source .devcache/setup.sh`): OUT=$OUT bash scripts/gpu_s67_b.sh [seconds]
. "$(dirname "$0")/gpu_lib.sh" s67_b "${1:-560}"
gpu_info
bench fwd 150 fwd 0,1,2,3,4,5 ";JAX_SPARSE_ATTN_BSA_WS=nooinq;;JAX_SPARSE_ATTN_BSA_WS=nooinq"
bench fwd64 40 fwd 6 ";JAX_SPARSE_ATTN_BSA_WS=oinq"
T=$(( $(left) - 130 ))
bg_test ws tests/test_gpu_bsa.py "sm90ws_forward and not oinq and not pairwg and not streamk and not ctas3k1 and not selfload or grad_through or fresh_inputs or block_causal_equals"
bg_test causal tests/test_gpu_bsa_causal.py ""
bg_test fuzz tests/test_gpu_fuzz.py "bsa"
bg_test opts tests/test_gpu_bsa_options_extra.py ""
bg_test trans tests/test_gpu_transforms.py ""
bg_test splits tests/test_gpu_bsa_splits.py ""
wait; t "tests"
T=$(( $(left) - 5 ))
bg_test large tests/test_gpu_large_tensors.py "large_bsa_fwd_bwd or large_bsa_gqa"
wait; t "large"
report_tests
t done
