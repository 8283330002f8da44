"""bsa_bench table rows timed with short samples (target_s) instead of 0.3 s sustained ones."""
import sys, json
import benchmarks.bsa_bench as bb
target = float(sys.argv[1]); rows = [int(x) for x in sys.argv[2].split(",")]; pas = sys.argv[3]
orig = bb._time
bb._time = lambda fn, sets, target_s=0.3, samples=5: orig(fn, sets, target_s=target, samples=samples)
print(f"target_s={target}")
bb.table([""], rows_sel=rows, pass_=pas)
