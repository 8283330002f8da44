#!/usr/bin/env bash
# Session 35, call D: the K->Q lists of the block-sparse backward built from a bitmap in the
# CSR rows' order (metadata._kq_csr_dense_rows, no transposes): the sm90ws backward's GPU
# cases (NaN in unlisted keys, GQA 8:1, every block listed, empty rows), then the A/B of the
# two constructions (scripts/kq_csr_ab.py: per-kernel traces and sustained backward rows, two
# interleaved rounds).
# Usage (device, after `source .devcache/setup.sh`): OUT=$OUT bash scripts/sessions/gpu_s35_d.sh [seconds]
. "$(dirname "$0")/../gpu_lib.sh" d35 "${1:-420}"
timeout 200 $PYT tests/test_gpu_bsa.py -k "test_bsa_sm90ws_backward" > $O/t_bwd.txt 2>&1
t "sm90ws backward tests rc=$?: $(tail -1 $O/t_bwd.txt)"
grep -h "^FAILED\|^E  " $O/t_bwd.txt | head -20
timeout $(($(left) - 10)) python3 scripts/kq_csr_ab.py --out $O/kq_ab.json > $O/kq_ab.txt 2>&1
t "kq ab rc=$?"
grep -E "^##|^==|input_|loop_|wrapped|bwd " $O/kq_ab.txt | head -80
