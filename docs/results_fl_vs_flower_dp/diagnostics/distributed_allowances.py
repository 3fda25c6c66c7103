import importlib.util
import sys
from pathlib import Path
import numpy as np
ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "benchmarks"))
spec = importlib.util.spec_from_file_location("bench", ROOT / "benchmarks" / "fl_vs_flower_dp.py")
bench = importlib.util.module_from_spec(spec); spec.loader.exec_module(bench)
import fedfilter.simulations.engine.distributed_round as dr
from tqdm import tqdm
seed = int(sys.argv[1]); eps_v = float(sys.argv[2]); extra = sys.argv[3:]
norms, allow = [], []
orig = dr.spend
def spend(account, mechanism, update, **kw):
    out = orig(account, mechanism, update, **kw)
    norms.append(np.sqrt(sum(float(np.sum(np.square(x, dtype=np.float64))) for x in out[1].k)) * mechanism.grid.gamma)
    allow.append(mechanism.l2_allow * mechanism.grid.gamma)
    return out
dr.spend = spend
args = bench.parse_args(["--task", "mnist-dirichlet", "--num-clients", "1000", "--clients-per-round", "200", "--rounds", "20",
    "--epsilon", str(eps_v), "--max-test", "2000", "--lr", "0.1", "--clip", "0.5", "--eval-every", "5", "--fedfilter-z", "plan",
    "--seed", str(seed), "--no-progress", *extra])
task = bench.load(args)
eps = bench.budgets(1000, eps_v, "equal", seed)
z = bench.fedfilter_noise_multipliers(task, args, eps_v, 1.0)["b"]
r = bench.engine_arm(task, args, arm="b", z=z, eps=eps, bar=tqdm(disable=True))
print("z", z, "acc", [round(a, 3) for a in r["accuracy_per_round"] if a is not None])
n = np.array(norms).reshape(20, -1); al = np.array(allow).reshape(20, -1)
print("mean released L2 per round", np.round(n.mean(1), 3).tolist())
print("share with allowance < 0.99 C", np.round((al < 0.99 * 0.5).mean(1), 3).tolist())
print("mean allowance", np.round(al.mean(1), 3).tolist())
