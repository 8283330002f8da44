#!/usr/bin/env bash
# Session 38, call G: the K->Q lists of the block-sparse backward built from the bitmap packed
# into 32-bit words (metadata._kq_csr_packed_rows: popcounts give the row lengths and each
# listed slot's place; no running count over the whole bitmap). (1) the sm90ws backward's
# GPU cases with it (the lists feed every CTA); (2) alone: scripts/kq_csr_ab.py, packed
# against the running-count construction ("rows"), two interleaved rounds of per-kernel
# traces (blk64, blk128) and the sustained backward rows blk64 12.5 %, 25 %, blk128.
# Usage (device, after `source .devcache/setup.sh`): OUT=$OUT bash scripts/sessions/gpu_s38_g.sh [seconds]
. "$(dirname "$0")/../gpu_lib.sh" g38 "${1:-540}"
timeout 150 $PYT tests/test_gpu_bsa.py -k "sm90ws_backward" > $O/t_bwd.txt 2>&1
t "sm90ws backward cases: $(tail -1 $O/t_bwd.txt)"
grep -h "^FAILED\|^E  " $O/t_bwd.txt | head -10
timeout $(( $(left) - 10 )) python3 scripts/kq_csr_ab.py --out $O/kq_ab.json --variants packed,rows \
  > $O/kq_ab.txt 2>&1
t "kq_csr_ab rc=$?"; grep -v "^wrote" $O/kq_ab.txt | grep -v "^\s*[0-9.]* us  x1   kernel_cutlass" | tail -60
