#!/usr/bin/env bash
# session 25 call 3: sustained vs short-burst timing (is the gap between bsa_bench and the
# per-kernel trace the clock under sustained load?), with nvidia-smi sampling
set -u
O=${OUT:-./gpu_out}; mkdir -p $O/r
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
start=$SECONDS
t() { echo "[$((SECONDS - start))s] $*" >> $O/r/timeline.txt; }
python3 -c "import cudnn; print(cudnn.__version__)" > $O/r/cudnn.txt 2>&1
nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,clocks_event_reasons.active --format=csv -lms 100 > $O/r/smi.csv 2>&1 &
SMI=$!
for tg in 0.3 0.01 0.3 0.01; do
  t "bwd target $tg start"; timeout 100 python3 .s25/burst.py $tg 3 bwd >> $O/r/burst.txt 2>&1; t "bwd target $tg end"
done
for tg in 0.3 0.01; do
  t "fwd target $tg start"; timeout 100 python3 .s25/burst.py $tg 3 fwd >> $O/r/burst.txt 2>&1; t "fwd target $tg end"
done
t "hstu 20 start"; timeout 100 python3 benchmarks/hstu_bench.py --case 8x4096-causal --bwd-only --iters 20 --out /tmp/h1.json >> $O/r/hstu.txt 2>&1; t "hstu 20 end"
t "hstu 400 start"; timeout 150 python3 benchmarks/hstu_bench.py --case 8x4096-causal --bwd-only --iters 400 --out /tmp/h2.json >> $O/r/hstu.txt 2>&1; t "hstu 400 end"
kill $SMI
cd $O && tar czf r.tgz r && rm -rf r
