"""Engine throughput: client updates per second with 60,000 single-example MNIST clients.

Each repetition times, back to back on the same model and chunks,

* ``plain``: the per-example gradients alone, with plain torch.func
  (``vmap(grad(functional_call ...))``) over the same chunks, nothing else;
* ``engine``: one full ``Engine.step()`` (papers/004 Algorithm 7's step: gradients, certified
  norms, allowance, clip, charge/spend on the (60,000, 1) filter state, aggregate noise, mean,
  server step), for each norm mode asked for;

and reports client updates per second and the ratio engine / plain (the cost of the privacy
bookkeeping). Timings alternate so that load from other processes hits both alike.

    OPENBLAS_NUM_THREADS=1 nice -n 10 python benchmarks/engine_throughput.py --steps 2
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--clients", type=int, default=60000)
    p.add_argument("--steps", type=int, default=2, help="repetitions per mode")
    p.add_argument("--modes", nargs="+", default=["vectorised", "device"], choices=("vectorised", "device"))
    p.add_argument("--chunk-size", type=int, default=512)
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args(argv)

    import torch
    from torch.func import functional_call, grad, vmap

    from simulations.engine import Engine
    from simulations.reproduce.mnist_gd import mnist_task, setting
    from simulations.reproduce.private_gd import engine_config

    torch.set_num_threads(args.threads)
    task = mnist_task(args.clients)
    n = task.num_clients
    s = setting(0.3, "tuned", "paper")  # sigma 170, C 10, zCDP filter, B_norm = 112 C^2
    engines = {m: Engine(engine_config(s, n=n, seed=0, chunk_size=args.chunk_size, norms=m), task=task)
               for m in args.modes}
    first = next(iter(engines.values()))
    model, x, y = first.model, first.x, first.y
    names = [k for k, _ in model.named_parameters()]

    def loss_one(params, xi, yi):
        return task.loss(functional_call(model, params, (xi.unsqueeze(0),)), yi.unsqueeze(0))

    per_example = vmap(grad(loss_one), in_dims=(None, 0, 0))

    def plain_pass(weights):
        params = {k: torch.from_numpy(w) for k, w in zip(names, weights)}
        for a in range(0, n, args.chunk_size):
            per_example(params, x[a:a + args.chunk_size], y[a:a + args.chunk_size])

    times = {"plain": [], **{m: [] for m in engines}}
    for rep in range(args.steps):
        for m, engine in engines.items():
            t = time.perf_counter()
            plain_pass(engine.weights)
            times["plain"].append(time.perf_counter() - t)
            t = time.perf_counter()
            rec = engine.step()
            times[m].append(time.perf_counter() - t)
            print(f"rep {rep} {m}: plain {times['plain'][-1]:.1f} s, engine {times[m][-1]:.1f} s "
                  f"({rec.contributing} contributing)", flush=True)

    print(f"\nmachine: {platform.node()} {platform.machine()}, {os.cpu_count()} CPUs, load average "
          f"{os.getloadavg()[0]:.1f} at the end, torch {torch.__version__} ({args.threads} threads), "
          f"python {platform.python_version()}; {n} clients, chunk {args.chunk_size}, {args.steps} reps")
    plain = statistics.median(times["plain"])
    print(f"| mode | median s / step | client updates / s | ratio to plain torch.func |")
    print(f"|---|---|---|---|")
    print(f"| plain torch.func per-example gradients | {plain:.1f} | {n / plain:,.0f} | 1.00 |")
    for m in engines:
        med = statistics.median(times[m])
        ratios = [e / q for e, q in zip(times[m], times["plain"][list(engines).index(m)::len(engines)])]
        print(f"| engine step, norms={m} | {med:.1f} | {n / med:,.0f} | {statistics.median(ratios):.2f} |")


if __name__ == "__main__":
    main()
