#!/usr/bin/env bash
# Session 45's device call (prepared without a device): the L2 eviction policies of the TMA
# copies, `l2hint` (forward: Q loads and O stores evict_first, K / V loads evict_last;
# backward: K / V evict_first, Q / dO loads and the dQ bulk reduce-adds evict_last) and
# `l2normal` (evict_normal everywhere; the default passes the DSL's constant 0 as the copies'
# policy operand). (1) In parallel: the BSA grid with l2hint (three shards) and with
# l2normal (one shard of three), four deterministic cases with l2hint; (2) cuDNN's dense
# attention timed both ways (how the timing method moves the comparisons' anchors); (3) if
# the tests passed: the forward rows (blk64 12.5 / 5 %, blk128 12.5 %) and the backward
# rows (blk64 12.5 %, blk128 12.5 %), default / l2hint / l2normal / default, sustained and
# burst (about 12 and 19 s per row and variant); (4) with the time left, Nsight Compute's memory sections of one blk64 12.5 % forward launch, default and
# l2hint (L2 hit rate, L2 and DRAM throughput: where the policies act).
# Usage (device, after `source .devcache/setup.sh`): OUT=$OUT bash scripts/gpu_s45_a.sh [seconds]
. "$(dirname "$0")/gpu_lib.sh" s45a "${1:-580}"
T=${TT:-200}
export JAX_SPARSE_ATTN_GPU_TEST_TIMEOUT=120
for i in 0 1 2; do
  BSA_TEST_IMPLS=nodefault,l2hint BSA_TEST_SHARD=$i/3 timeout $T $PYT tests/test_gpu_bsa.py \
    -k TestBSAKernelGrid > $O/t_hint$i.txt 2>&1 &
done
BSA_TEST_IMPLS=nodefault,l2normal BSA_TEST_SHARD=0/3 timeout $T $PYT tests/test_gpu_bsa.py \
  -k TestBSAKernelGrid > $O/t_normal.txt 2>&1 &
# the deterministic cases (dQ writer warp in order; five runs bitwise) with l2hint
JAX_SPARSE_ATTN_BSA_BWD_WS=l2hint timeout $T $PYT tests/test_gpu_bsa.py -k "bwd_deterministic \
  and (det-all-blk64-d128] or det-all-blk128-d128-mha or slots2 or gqa-detzero)" \
  > $O/t_det.txt 2>&1 &
wait
for f in hint0 hint1 hint2 normal det; do t "$f: $(tail -1 $O/t_$f.txt)"; done
grep -h "^FAILED\|^ERROR\|Timeout\|timed out" $O/t_*.txt | head -20
ok() { grep -q "passed" $O/t_$1.txt && ! grep -qi "failed\|error\|timeout\|timed out" $O/t_$1.txt; }
# is cuDNN's frontend (its block-sparse attention) importable here? (for a later call)
python3 -c "import cudnn; print('cudnn frontend', cudnn.__version__, cudnn.backend_version())" \
  > $O/cudnn_fe.txt 2>&1; t "cudnn frontend: $(tail -1 $O/cudnn_fe.txt | cut -c1-120)"
# the anchors' timing: cuDNN dense attention (the kernel notes' B8 L4096 H4 causal: fwd 535 /
# bwd 454 TFLOP/s, method not recorded) sustained and in bursts, as our rows are timed
timeout 80 python3 -m benchmarks.bsa_bench --dense --timing both --out $O/dense.json \
  > $O/dense.txt 2>&1
t "dense rc=$?"; grep -v "^wrote" $O/dense.txt | tail -8
F=JAX_SPARSE_ATTN_BSA_WS B=JAX_SPARSE_ATTN_BSA_BWD_WS
VF=";" VB=";"
if ok hint0 && ok hint1 && ok hint2; then VF="$VF$F=l2hint;"; VB="$VB$B=l2hint;"; fi
if ok normal; then VF="$VF$F=l2normal;"; VB="$VB$B=l2normal;"; fi
t "variants: fwd '$VF' bwd '$VB'"
if [ "$VF" != ";" ]; then
  timeout $(( $(left) / 2 )) python3 -m benchmarks.bsa_bench --table-pass fwd --rows 0,1,3 \
    --timing both --table "$VF" --out $O/fwd.json > $O/fwd.txt 2>&1
  t "fwd rows rc=$?"; grep -v "^wrote" $O/fwd.txt | tail -24
  timeout $(( $(left) - 10 )) python3 -m benchmarks.bsa_bench --table-pass bwd --rows 0,3 \
    --timing both --table "$VB" --out $O/bwd.json > $O/bwd.txt 2>&1
  t "bwd rows rc=$?"; grep -v "^wrote" $O/bwd.txt | tail -16
fi
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
if [ -n "$NCU" ] && [ "$VF" != ";" ]; then
  for v in default l2hint; do
    [ "$(left)" -gt 70 ] || break
    # the table's variant sets the switch (bsa_bench builds each variant's switches from it)
    V="$F="; [ $v = l2hint ] && V="$F=l2hint"
    timeout -k 5 60 "$NCU" --section SpeedOfLight --section MemoryWorkloadAnalysis \
      --clock-control none --kernel-name "regex:BsaFwdSm90Ws" --launch-skip 2 --launch-count 1 \
      -f -o "$O/ncu_fwd64_$v" python3 -m benchmarks.bsa_bench --table "$V" --rows 0 \
      --out "$O/ncu_run_$v.json" > "$O/ncu_run_$v.log" 2>&1
    t "ncu $v rc=$?"
    "$NCU" --import "$O/ncu_fwd64_$v.ncu-rep" --page details > "$O/ncu_fwd64_$v.txt" 2>&1
    grep -E "Duration|L2 Cache Throughput|L2 Hit Rate|DRAM Throughput|Memory Throughput|SM Frequency" \
      "$O/ncu_fwd64_$v.txt" | head -8
  done
fi
