#!/usr/bin/env bash
# Where the blk 64 forward's cycles go without its softmax: Nsight Compute (full set, clocks
# left as they are, one launch each) of the block-sparse sm90ws forward at blk 64 12.5 % on the
# default and with bsa_fwd_ws=nosm, and at blk 128 12.5 % with nosm (reports' details and
# the SASS source pages with their stall samples, for scripts/ncu_stalls.py), then the forward
# floor rows on the defaults.
# Usage (device, after `source .devcache/setup.sh`): OUT=$OUT bash scripts/gpu_s70_b.sh [seconds]
. "$(dirname "$0")/gpu_lib.sh" s70_b "${1:-400}"
gpu_info
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
prof() {  # name row table-variant
  timeout -k 5 100 "$NCU" --set full --clock-control none --kernel-name "regex:BsaFwdSm90Ws" \
    --launch-skip 2 --launch-count 1 -f -o "/tmp/$1" \
    python3 -m benchmarks.bsa_bench --table "$3" --rows "$2" --out "/tmp/ncu_$1.json" \
    > "$O/$1.run.log" 2>&1
  t "prof $1 rc=$?"
  "$NCU" --import "/tmp/$1.ncu-rep" --page details > "$O/$1.details.txt" 2>&1
  "$NCU" --import "/tmp/$1.ncu-rep" --page source --csv --print-source sass 2>/dev/null \
    | gzip > "$O/$1.csv.gz"
  grep -E "Duration|SM Frequency|Elapsed Cycles|Compute \(SM\) Throughput|L2 Cache Throughput|Issue Slots Busy|No Eligible|Warp Cycles Per Issued|Executed Instructions  " \
    "$O/$1.details.txt" | head -12
}
if [ -n "$NCU" ]; then
  prof def64 0 ";"
  prof nosm64 0 "JAX_SPARSE_ATTN_BSA_WS=nosm"
  prof nosm128 3 "JAX_SPARSE_ATTN_BSA_WS=nosm"
else
  t "ncu not found"
fi
bench fwd 100 fwd 0,1,2,3,4,5,6 ";"
t done
pack_out s70_b
