#!/usr/bin/env bash
# device call 3 (next session): silu16 with the SiLU's last step after the PV wait (no ptxas
# C7513 serialization any more) — the default HSTU grid + sm90ws batches with HSTU_TEST_WS=silu16
# (4 shards), then the forward benchmark default vs silu16 (same call, after the tests)
set -u
O=${OUT:-./gpu_out}; mkdir -p $O
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
start=$SECONDS
t() { echo "[$((SECONDS - start))s] $*" >> $O/timeline.txt; }
for i in 0 1 2 3; do
  HSTU_TEST_WS=silu16 HSTU_TEST_SM90=sm90ws HSTU_TEST_SHARD=$i/4 timeout 330 python3 -m pytest -m gpu -q tests/test_gpu_hstu.py -k "TestHSTUKernelGrid and test_hstu_grid or sm90ws_batches" > $O/silu16_s$i.txt 2>&1 &
done
wait; t "silu16 tests"; for i in 0 1 2 3; do echo "s$i: $(tail -1 $O/silu16_s$i.txt)" >> $O/timeline.txt; done
timeout 200 python3 benchmarks/hstu_bench.py --case 8x4096-causal-d64 --case 8x4096-causal --case 32x1024-causal --case jagged32-causal --case 8x4096-causal-d256 --no-bwd --variant "" --variant "JAX_SPARSE_ATTN_HSTU_WS=silu16" --iters 20 --out $O/silu16_bench.json > $O/silu16_bench.txt 2>&1; t "bench rc=$?"
