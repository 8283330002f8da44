#!/usr/bin/env bash
# Session 36, call E: the HSTU forward with O written by TMA tensor stores where a query tile
# ends inside its sequence (hstu_fwd_ws=tmao, opt-in, built on CPU): (1) in parallel, the
# sm90ws batches under it (canonical jagged batch, sequences ending inside a tile, poisoned
# rows past the last sequence; two shards) and three of eight shards of the default grid
# under it, cut at the time limit; (2) then, alone, the forward of five cases, default
# against tmao, two rounds.
# Usage (device, after `source .devcache/setup.sh`): OUT=$OUT bash scripts/sessions/gpu_s36_e.sh [seconds]
. "$(dirname "$0")/../gpu_lib.sh" e36 "${1:-300}"
T=$((BUDGET - 120))
for i in 0 1; do
  HSTU_TEST_SM90=sm90ws HSTU_TEST_WS=tmao HSTU_TEST_SHARD=$i/2 timeout $T $PYT \
    -k sm90ws_batches tests/test_gpu_hstu.py > $O/t_ws_$i.txt 2>&1 &
done
for i in 0 1 2; do
  HSTU_TEST_WS=tmao HSTU_TEST_SHARD=$i/8 timeout $T $PYT -k "TestHSTUKernelGrid" \
    tests/test_gpu_hstu.py > $O/t_grid_$i.txt 2>&1 &
done
wait
for f in ws_0 ws_1 grid_0 grid_1 grid_2; do t "$f: $(tail -1 $O/t_$f.txt)"; done
grep -h "^FAILED\|^E  " $O/t_*.txt | head -20
for r in 1 2; do
  timeout 60 python3 -m benchmarks.hstu_bench --case 8x4096-causal --case 32x1024-causal \
    --case jagged32-causal --case 64x512-causal --case 8x4096-causal-d64 --no-bwd \
    --tiles "impl=sm90ws;ws=tmao" --out $O/fwd_$r.json > $O/fwd_$r.txt 2>&1
  t "hstu fwd round $r rc=$?"; grep -v "^wrote" $O/fwd_$r.txt | tail -14
done
