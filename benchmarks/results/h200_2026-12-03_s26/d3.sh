#!/usr/bin/env bash
# s26 call 2: dqalt hang: debug variants (JSA_DQALT_DEBUG, uncommitted patch), synccheck of
# dqalt alone (ldwait: the producer's cp.async mbarrier arrivals, which synccheck reports as
# overflow, are not used)
set -u
O=${OUT:-./gpu_out}; mkdir -p $O/r
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
start=$SECONDS
t() { echo "[$((SECONDS - start))s] $*" >> $O/r/timeline.txt; }
for v in syncall nodq; do
  timeout 40 env SKIP_DEFAULT=1 JSA_DQALT_DEBUG=$v python3 .s26/small.py 128 1 dqalt 30 > $O/r/v_$v.txt 2>&1; t "$v rc=$? $(grep -c done $O/r/v_$v.txt)"
done
timeout 100 env SKIP_DEFAULT=1 compute-sanitizer --tool synccheck --print-limit 30 python3 .s26/small.py 128 1 dqalt,ldwait 90 > $O/r/sync_alt.txt 2>&1; t "synccheck rc=$?"
