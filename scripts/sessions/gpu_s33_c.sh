#!/usr/bin/env bash
# Session 33, call C: bsa_fwd_ws=qahead (the producer issues the next work item's Q during the
# current item): smoke test, the list-length sweep default vs qahead, an Nsight Compute
# profile (warp-stall sampling by SASS instruction) of the default blk64 top-4 forward (where
# the per-item cost is most of the time), then the BSA grid with qahead.
# Usage (device, after `source .devcache/setup.sh`): OUT=$OUT bash scripts/sessions/gpu_s33_c.sh [seconds]
. "$(dirname "$0")/../gpu_lib.sh" c "${1:-480}"
BSA_TEST_IMPLS=qahead,nodefault timeout 120 $PYT \
  tests/test_gpu_bsa.py -k "TestBSAKernelGrid and (bf16-bhsd-64-mha-fixed or fp16-bshd-128-gqa-var-r3)" > $O/t_smoke.txt 2>&1
rc=$?
t "qahead smoke rc=$rc: $(tail -1 $O/t_smoke.txt)"
if [ $rc -eq 0 ]; then
  timeout 150 python3 -m benchmarks.bsa_bench --table ";JAX_SPARSE_ATTN_BSA_WS=qahead" --sweep-k \
    --table-pass fwd --out $O/sweep.json > $O/sweep.txt 2>&1
  t "sweep rc=$?"; grep -v "^wrote" $O/sweep.txt | tail -32
fi
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
timeout 120 $NCU --set full --import-source yes --clock-control none \
  --kernel-name regex:BsaFwdSm90Ws --launch-skip 2 --launch-count 1 -f -o /tmp/ncu_f64 \
  python3 -m benchmarks.bsa_bench --table "JAX_SPARSE_ATTN_PDL=1" --sweep-k --rows 2 --out /tmp/b.json > /tmp/ncu.log 2>&1
t "ncu rc=$?"; tail -2 /tmp/ncu.log
$NCU --import /tmp/ncu_f64.ncu-rep --page details > $O/ncu_f64_details.txt 2>&1
$NCU --import /tmp/ncu_f64.ncu-rep --page source --csv --print-source sass > /tmp/src.csv 2>&1
python3 scripts/ncu_stalls.py /tmp/src.csv 90 > $O/ncu_f64_stalls.txt 2>&1
gzip -c /tmp/src.csv > $O/ncu_f64_src.csv.gz
t "ncu summary done"; head -3 $O/ncu_f64_stalls.txt
grep -E "Duration|SM Frequency|L2 Cache Throughput|Issue Slots Busy|No Eligible" $O/ncu_f64_details.txt | head -8
L=$(left)
if [ $rc -eq 0 ] && [ $L -gt 40 ]; then
  BSA_TEST_IMPLS=qahead,nodefault timeout $((L - 10)) $PYT \
    tests/test_gpu_bsa.py -k TestBSAKernelGrid > $O/t_grid.txt 2>&1
  t "qahead grid rc=$?: $(tail -1 $O/t_grid.txt)"
fi
grep -h "FAILED\|^E  \|passed\|failed" $O/t_*.txt 2>/dev/null | head -40 | tee -a $O/timeline.txt
