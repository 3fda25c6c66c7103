"""FEMNIST eps 8 seed 0: (b) with its Skellam sum replaced by a rounded Gaussian of the same variance, or
(f) with its Gaussian replaced by a Skellam of the same variance (grid step 2**-13), over several draws."""
import importlib.util
import math
import sys
from pathlib import Path
import numpy as np
ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "benchmarks"))
spec = importlib.util.spec_from_file_location("bench", ROOT / "benchmarks" / "fl_vs_flower_dp.py")
bench = importlib.util.module_from_spec(spec); spec.loader.exec_module(bench)
import fedfilter.simulations.engine.distributed_round as dr
import fedfilter.simulations.engine.core as core
from fedfilter.client.mechanisms.skellam_noise import skellam_noise
from fedfilter.simulations.engine.seeds import aggregate_noise_stream
from tqdm import tqdm
mode = sys.argv[1]; draws = [int(d) for d in sys.argv[2].split(",")]
args = bench.parse_args(["--task", "femnist", "--num-clients", "105", "--clients-per-round", "105", "--rounds", "20",
    "--epsilon", "8", "--model", "dp-cnn", "--local-epochs", "5", "--lr", "0.1", "--clip", "0.5", "--eval-every", "2",
    "--fedfilter-z", "plan", "--seed", "0", "--no-progress"])
task = bench.load(args)
eps = bench.budgets(105, 8.0, "equal", 0)
G = 2.0 ** -13
for d in draws:
    rng = np.random.default_rng(1000 + d)
    if mode == "b-gauss":
        dr.aggregate_skellam = lambda n, mu, dim, stream: np.rint(rng.normal(0, math.sqrt(n * mu), dim)).astype(np.int64)
        arm, z = "b", 2.87
    else:
        class Sk:
            def __init__(self, *key): self.key = key
            def normal(self, loc, scale, size):
                s = aggregate_noise_stream(self.key[0] + 7919 * d, "swap", self.key[2])
                return skellam_noise((scale / G) ** 2, int(size), s).astype(np.float64) * G
        core.aggregate_noise_rng = lambda *key: Sk(*key)
        arm, z = "f", 2.851806640625
    r = bench.engine_arm(task, args, arm=arm, z=z, eps=eps, bar=tqdm(disable=True))
    print(mode, d, round(r["accuracy"], 4), round([x for x in r["loss_per_round"] if x is not None][-1], 4), flush=True)
