"""FEMNIST eps 8 seed 0: (f) at (b)'s variance (z 4.04) with each clipped update snapped toward zero onto
SecAgg+'s grid (step 2**-13) before the sum, as (b) does: is the snap what costs (b) under noise?"""
import importlib.util
import sys
from pathlib import Path
import numpy as np
ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "benchmarks"))
spec = importlib.util.spec_from_file_location("bench", ROOT / "benchmarks" / "fl_vs_flower_dp.py")
bench = importlib.util.module_from_spec(spec); spec.loader.exec_module(bench)
import fedfilter.simulations.engine.core as core
from tqdm import tqdm
G = 2.0 ** -13
orig = core.Engine._clip_rows
def clip_rows(self, updates, allowance):
    out = orig(self, updates, allowance)
    updates[:] = np.trunc(updates / G) * G
    return out
if sys.argv[1] == "snap":
    core.Engine._clip_rows = clip_rows
args = bench.parse_args(["--task", "femnist", "--num-clients", "105", "--clients-per-round", "105", "--rounds", "20",
    "--epsilon", "8", "--model", "dp-cnn", "--local-epochs", "5", "--lr", "0.1", "--clip", "0.5", "--eval-every", "2",
    "--seed", "0", "--no-progress"])
task = bench.load(args)
eps = np.full(105, 1e4)
for run_id in sys.argv[2].split(","):
    r = bench.engine_arm(task, args, arm="f", z=4.040, eps=eps, bar=tqdm(disable=True), run_id=run_id)
    print(sys.argv[1], run_id, round(r["accuracy"], 4), round([x for x in r["loss_per_round"] if x is not None][-1], 4), flush=True)
