# Shared preamble of the device scripts (source it: `. "$(dirname "$0")/gpu_lib.sh" NAME SECONDS`).
# Sets O=$OUT/NAME (created), the GPU test environment (no preallocation, per-test time
# limit and hang log), BUDGET (seconds, default 540) and start; defines t (a timestamped
# line, also appended to $O/timeline.txt), left (seconds of the budget left) and PYT (the
# GPU pytest command).
set -u
O=${OUT:-./gpu_out}/$1; mkdir -p "$O"
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
export JAX_SPARSE_ATTN_GPU_TEST_TIMEOUT=${JAX_SPARSE_ATTN_GPU_TEST_TIMEOUT:-150}
export JAX_SPARSE_ATTN_GPU_HANG_LOG=$O/hang.log
BUDGET=${2:-540}
start=$SECONDS
t() { echo "[$((SECONDS - start))s] $*" | tee -a "$O/timeline.txt"; }
left() { echo $((BUDGET - (SECONDS - start))); }
PYT="python3 -m pytest -m gpu -q -rA -p no:cacheprovider"
