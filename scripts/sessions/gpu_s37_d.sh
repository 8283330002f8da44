#!/usr/bin/env bash
# Session 37, call D: a regression sweep of the current defaults (TMA-store epilogues of the
# HSTU forward and of packed GQA rows new this session) on cases not run before, then the
# block-sparse tables. (1) in parallel: fresh fuzz cases of both ops (seed 3737, 24 each),
# the BSA GPU grid in three shards, the JAX transformations file (vmap / remat / new lengths
# / export / disk cache); (2) alone: the forward table and the backward table, each row twice (two default variants, interleaved; sustained).
# Usage (device, after `source .devcache/setup.sh`): OUT=$OUT bash scripts/sessions/gpu_s37_d.sh [seconds]
. "$(dirname "$0")/../gpu_lib.sh" d37 "${1:-560}"
T=$((BUDGET - 245))
JSA_FUZZ_SEED=3737 timeout $T $PYT tests/test_gpu_fuzz.py -k hstu > $O/t_fuzz_hstu.txt 2>&1 &
JSA_FUZZ_SEED=3737 timeout $T $PYT tests/test_gpu_fuzz.py -k bsa > $O/t_fuzz_bsa.txt 2>&1 &
for i in 0 1 2; do
  BSA_TEST_SHARD=$i/3 timeout $T $PYT tests/test_gpu_bsa.py > $O/t_bsa_$i.txt 2>&1 &
done
timeout $T $PYT tests/test_gpu_transforms.py > $O/t_transforms.txt 2>&1 &
wait
for f in fuzz_hstu fuzz_bsa bsa_0 bsa_1 bsa_2 transforms; do t "$f: $(tail -1 $O/t_$f.txt)"; done
grep -h "^FAILED\|^E  " $O/t_*.txt | head -20
timeout 75 python3 -m benchmarks.bsa_bench --table ";" --table-pass fwd --out $O/fwd.json \
  > $O/fwd.txt 2>&1
t "fwd table rc=$?"; grep -v "^wrote" $O/fwd.txt | tail -18
timeout 155 python3 -m benchmarks.bsa_bench --table ";" --table-pass bwd --out $O/bwd.json \
  > $O/bwd.txt 2>&1
t "bwd table rc=$?"; grep -v "^wrote" $O/bwd.txt | tail -18
