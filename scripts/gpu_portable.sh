#!/usr/bin/env bash
# The portable (mma.sync, "sm80") kernel family on an H100/H200: GPU grids and benchmarks.
# From the repo root after `source .devcache/setup.sh`:
#   OUT=$OUT PHASE=grid  bash scripts/gpu_portable.sh   # grids (T seconds per process)
#   OUT=$OUT PHASE=bench bash scripts/gpu_portable.sh   # benchmark rows (TB seconds)
# grid: the HSTU and BSA kernel grids (tests/attention_base.py via tests/test_gpu_hstu.py,
#   tests/test_gpu_bsa.py) with JAX_SPARSE_ATTN_KERNEL_FAMILY=portable (the H200's own
#   tiles, 227 KiB) and with portable_sm8x + JAX_SPARSE_ATTN_SMEM_LIMIT_KB=99 (the tiles and
#   scalar fp32 reductions of compute capability 8.6/8.9; configurations that do not fit
#   99 KiB skip), shards in parallel (HSTU_PORT, HSTU_SM8X, BSA_PORT, BSA_SM8X: lists of
#   i/n shards; the defaults cover half of the portable HSTU grid, a quarter of the portable
#   BSA grid and all of both sm_8x grids in about 100 s); per-test lines in the logs (-v),
#   logs.tgz + summary.txt. The whole portable grids: HSTU_PORT="0/6 ... 5/6", BSA_PORT=
#   "0/4 ... 3/4" (T=300).
# bench: HSTU B=8 L=4096 D=128 causal and BSA blk64 12.5 % fwd/bwd with the default (Hopper)
#   kernels, the portable family and the sm_8x configuration, and the pure-JAX reference.
set -u
out=${OUT:-./gpu_out}
LOGS=${LOGS:-/tmp/gp_logs}
mkdir -p "$out" "$LOGS"
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
PYT="python3 -m pytest -m gpu -v -rA -p no:cacheprovider"
start=$SECONDS
if [ "${PHASE:-grid}" = grid ]; then
  T=${T:-105}
  PORT="JAX_SPARSE_ATTN_KERNEL_FAMILY=portable"
  SM8X="JAX_SPARSE_ATTN_KERNEL_FAMILY=portable_sm8x JAX_SPARSE_ATTN_SMEM_LIMIT_KB=99"
  run() { local name=$1; shift; timeout -k 5 "$T" env "$@" > "$LOGS/$name.log" 2>&1; echo "rc=$?" >> "$LOGS/$name.log"; }
  # shard lists (i/n each; one process per shard): which parts of each grid run
  for sh in ${HSTU_PORT:-0/6 1/6 2/6}; do
    run hstu_port_${sh/\//of} $PORT HSTU_TEST_SHARD=$sh $PYT -k TestHSTUKernelGrid tests/test_gpu_hstu.py &
  done
  for sh in ${HSTU_SM8X:-0/4 1/4 2/4 3/4}; do
    run hstu_sm8x_${sh/\//of} $SM8X HSTU_TEST_SHARD=$sh $PYT -k TestHSTUKernelGrid tests/test_gpu_hstu.py &
  done
  for sh in ${BSA_PORT:-0/4}; do
    run bsa_port_${sh/\//of} $PORT BSA_TEST_SHARD=$sh $PYT -k TestBSAKernelGrid tests/test_gpu_bsa.py &
  done
  for sh in ${BSA_SM8X:-0/2 1/2}; do
    run bsa_sm8x_${sh/\//of} $SM8X BSA_TEST_SHARD=$sh $PYT -k TestBSAKernelGrid tests/test_gpu_bsa.py &
  done
  wait
  {
    echo "portable grids: wall $((SECONDS - start)) s"
    for f in "$LOGS"/*.log; do
      echo "$(basename "$f"): PASSED $(grep -c ' PASSED' "$f") FAILED $(grep -c ' FAILED' "$f") SKIPPED $(grep -c ' SKIPPED' "$f") | $(grep -E '(passed|failed).* in ' "$f" | tail -n 1) $(grep '^rc=' "$f" | tail -n 1)"
    done
    grep -h "^FAILED\|^ERROR\|Error:" "$LOGS"/*.log | sort | uniq | head -40
  } > "$out/summary.txt" 2>&1
else
  TB=${TB:-70}
  timeout -k 5 "$TB" python3 benchmarks/hstu_bench.py --case 8x4096-causal --iters ${ITERS:-10} \
    --variant '' --variant JAX_SPARSE_ATTN_KERNEL_FAMILY=portable \
    --variant JAX_SPARSE_ATTN_KERNEL_FAMILY=portable_sm8x,JAX_SPARSE_ATTN_SMEM_LIMIT_KB=99 \
    --reference --out "$out/hstu_portable.json" > "$LOGS/hstu_bench.log" 2>&1
  echo "rc=$? at $((SECONDS - start)) s" >> "$LOGS/hstu_bench.log"
  timeout -k 5 $((TB - (SECONDS - start))) python3 -m benchmarks.bsa_bench \
    --variants ":blk64fwd,blk64bwd;JAX_SPARSE_ATTN_KERNEL_FAMILY=portable:blk64fwd,blk64bwd;JAX_SPARSE_ATTN_KERNEL_FAMILY=portable_sm8x,JAX_SPARSE_ATTN_SMEM_LIMIT_KB=99:blk64fwd" \
    --reference --out "$out/bsa_portable.json" > "$LOGS/bsa_bench.log" 2>&1
  echo "rc=$? at $((SECONDS - start)) s" >> "$LOGS/bsa_bench.log"
  grep -v "Warning\|warn" "$LOGS"/hstu_bench.log "$LOGS"/bsa_bench.log > "$out/summary.txt"
fi
tar czf "$out/logs.tgz" -C "$LOGS" . 2>/dev/null
cat "$out/summary.txt"
