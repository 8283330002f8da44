#!/usr/bin/env bash
# Session 36, call A: (1) the block-sparse forward with O written by TMA tensor stores
# (bsa_fwd_ws=tmao, built on CPU): its GPU cases (the sm90ws forward's cases through the
# shared checker: partial query blocks at B 2, bhsd / bshd, empty rows, poisoned outputs) and
# the BSA grid under it; (2) the forward table, default against tmao, three rounds
# (sustained); (3) the K->Q offsets' two-level running sum (kq_csr_ab.py rows-offsets2);
# (4) with the time left, the HSTU grid (four shards) and rab (three).
# Usage (device, after `source .devcache/setup.sh`): OUT=$OUT bash scripts/gpu_s36_a.sh [seconds]
. "$(dirname "$0")/gpu_lib.sh" a36 "${1:-560}"
BSA_TEST_IMPLS=tmao,nodefault timeout 220 $PYT tests/test_gpu_bsa.py \
  -k "tma_o or TestBSAKernelGrid" > $O/t_tmao.txt 2>&1
rc=$?
t "tmao tests rc=$rc: $(tail -1 $O/t_tmao.txt)"
grep -h "^FAILED\|^E  \|Error" $O/t_tmao.txt | head -20
if [ $rc -eq 0 ]; then
  for r in 1 2 3; do
    timeout 100 python3 -m benchmarks.bsa_bench --table ";JAX_SPARSE_ATTN_BSA_WS=tmao" \
      --table-pass fwd --out $O/fwd_$r.json > $O/fwd_$r.txt 2>&1
    t "fwd table round $r rc=$?"; grep -v "^wrote" $O/fwd_$r.txt | tail -18
  done
fi
timeout 150 python3 scripts/kq_csr_ab.py --variants rows,rows-offsets2 --out $O/kq_ab.json \
  > $O/kq_ab.txt 2>&1
t "kq ab rc=$?"
grep -E "^##|^== |reduce_window|bwd " $O/kq_ab.txt | head -40
if [ $(left) -gt 120 ]; then
  export LOGS=$O/logs
  PARTS="hstu rab" HSTU_SHARDS=4 RAB_SHARDS=3 T=$(($(left) - 30)) OUT=$O/grids \
    bash tests/gpu_grids.sh > /dev/null 2>&1
  t "grids done"; cat $O/grids/summary.txt
fi
