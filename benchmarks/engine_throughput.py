"""Engine throughput: one private step of single-example MNIST clients against the plain model.

Each repetition times, back to back on the same model (Opacus' MNIST CNN) and the same chunks,

* ``batched``: a plain batched forward and backward (``loss.backward()`` on each chunk's mean
  loss): what training the model without privacy costs, the floor of any private step;
* ``torch.func``: the per-example gradients alone (``vmap(grad(functional_call ...))``);
* ``engine[MODE]``: one full ``Engine.step()`` (Feldman & Zrnic (2021) Algorithm 7's step: gradients,
  certified norms, allowance, clip, charge/spend on the (n, 1) filter state, aggregate noise,
  mean, server step) for each norm mode asked for (``fast``, ``vectorised``, ``device``);

after an untimed warm-up, each between two ``batched`` passes, in an order that rotates every
repetition. It prints seconds per step (and scaled to 60,000 clients) and each one's ratio to the
mean of the two batched passes around it (median over repetitions), so that load from other
processes, which drifts over minutes, hits a measurement and its baseline alike. ``--json`` prints one JSON
object instead:
``seconds_per_step`` (by name, for ``--clients``), ``ratio_to_batched`` (the fastest engine mode
over the batched pass) and the conditions. Reproducibility: a run is bitwise repeatable for a
fixed ``--threads`` (and OpenBLAS thread count); the engine records no timing in any result.

    . simulations/reproduce/run_env.sh
    nice -n 10 python benchmarks/engine_throughput.py --steps 3 --threads 2
    python benchmarks/engine_throughput.py --clients 8192 --modes fast --json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

MODES = ("fast", "vectorised", "device")


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--clients", type=int, default=60000)
    p.add_argument("--steps", type=int, default=2, help="repetitions of every measurement")
    p.add_argument("--warmup", type=int, default=1, help="untimed rounds of every measurement first")
    p.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES)
    p.add_argument("--chunk-size", type=int, default=512, help="clients per chunk of the batched and torch.func passes")
    p.add_argument(
        "--engine-chunk-size",
        type=int,
        default=None,
        help="clients per chunk of the engine steps (default: --chunk-size)",
    )
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--json", action="store_true", help="print one JSON object (progress goes to stderr)")
    args = p.parse_args(argv)

    import torch
    from torch.func import functional_call, grad, vmap

    from fedfilter.simulations.engine import Engine
    from fedfilter.simulations.reproduce.mnist_gd import mnist_task, setting
    from fedfilter.simulations.reproduce.private_gd import engine_config

    torch.set_num_threads(args.threads)
    load_start = os.getloadavg()[0]
    task = mnist_task(args.clients)
    n, chunk = task.num_clients, args.chunk_size
    engine_chunk = args.engine_chunk_size or chunk
    s = setting(0.3, "tuned", "paper")  # sigma 170, C 10, zCDP filter, B_norm = 112 C^2
    engines = {
        m: Engine(engine_config(s, n=n, seed=0, chunk_size=engine_chunk, norms=m), task=task) for m in args.modes
    }
    fallback = {m: e.fast_fallback for m, e in engines.items() if e.fast_fallback}
    first = next(iter(engines.values()))
    model, x, y = task.model_fn(), first.x, first.y

    def loss_one(params, xi, yi):
        return task.loss(functional_call(model, params, (xi.unsqueeze(0),)), yi.unsqueeze(0))

    per_example = vmap(grad(loss_one), in_dims=(None, 0, 0))

    def batched():
        for a in range(0, n, chunk):
            model.zero_grad(set_to_none=True)
            task.loss(model(x[a : a + chunk]), y[a : a + chunk]).backward()

    def func():
        params = {k: v.detach() for k, v in model.named_parameters()}
        for a in range(0, n, chunk):
            per_example(params, x[a : a + chunk], y[a : a + chunk])

    jobs = {"torch.func": func}
    jobs.update({f"engine[{m}]": e.step for m, e in engines.items()})
    out = sys.stderr if args.json else sys.stdout

    def timed(f) -> float:
        t = time.perf_counter()
        f()
        return time.perf_counter() - t

    for _ in range(args.warmup):  # untimed: first calls allocate buffers and build kernels
        batched()
        for f in jobs.values():
            f()
    # Each measurement sits between two batched passes and is compared with their mean, so that
    # load from other processes, which drifts over minutes, hits a measurement and its baseline alike.
    times = {k: [] for k in ["batched", *jobs]}
    ratios_each = {k: [] for k in ["batched", *jobs]}
    for rep in range(args.steps):
        keys = list(jobs)[rep % len(jobs) :] + list(jobs)[: rep % len(jobs)]  # rotate the order
        before = timed(batched)
        times["batched"].append(before)
        for k in keys:
            times[k].append(timed(jobs[k]))
            after = timed(batched)
            times["batched"].append(after)
            ratios_each[k].append(times[k][-1] / ((before + after) / 2))
            before = after
        print(
            f"rep {rep}: "
            + ", ".join(f"{k} {times[k][-1]:.2f} s ({ratios_each[k][-1]:.2f})" for k in keys)
            + f"; batched {statistics.median(times['batched'][-len(keys) - 1 :]):.2f} s",
            file=out,
            flush=True,
        )
    ratios_each["batched"] = [1.0]

    seconds = {k: statistics.median(v) for k, v in times.items()}
    ratios = {k: statistics.median(v) for k, v in ratios_each.items()}
    engine_keys = [f"engine[{m}]" for m in engines]
    fastest = min(engine_keys, key=lambda k: ratios[k])
    conditions = {
        "machine": f"{platform.node()} {platform.machine()}",
        "cpus": os.cpu_count(),
        "load_average_start": round(load_start, 2),
        "load_average_end": round(os.getloadavg()[0], 2),
        "torch": torch.__version__,
        "threads": args.threads,
        "openblas_threads": os.environ.get("OPENBLAS_NUM_THREADS"),
        "python": platform.python_version(),
        "clients": n,
        "chunk_size": chunk,
        "engine_chunk_size": engine_chunk,
        "reps": args.steps,
    }
    if args.json:
        print(
            json.dumps(
                {
                    "seconds_per_step": seconds,
                    "seconds_per_60000": {k: v * 60000 / n for k, v in seconds.items()},
                    "ratios": ratios,
                    "fastest_mode": fastest,
                    "ratio_to_batched": ratios[fastest],
                    "fallback": fallback,
                    **conditions,
                }
            )
        )
        return
    print(
        f"\nmachine: {conditions['machine']}, {os.cpu_count()} CPUs, load average "
        f"{load_start:.1f} at the start and {conditions['load_average_end']:.1f} at the end, "
        f"torch {torch.__version__} ({args.threads} threads), "
        f"python {platform.python_version()}; {n} clients, chunk {chunk}"
        + (f" (engine chunk {engine_chunk})" if engine_chunk != chunk else "")
        + f", {args.steps} reps"
    )
    print("| pass | median s / step | s per 60,000 clients | ratio to the batched passes around it (median) |")
    print("|---|---|---|---|")
    label = {"batched": "plain batched forward + backward", "torch.func": "per-example gradients, torch.func"}
    for k in ["batched", *jobs]:
        name = label.get(k, f"engine step, norms={k[7:-1]}")
        print(f"| {name} | {seconds[k]:.2f} | {seconds[k] * 60000 / n:.2f} | {ratios[k]:.2f} |")
    for m, why in fallback.items():
        print(f"norms={m} fell back to vectorised norms: {why}")
    per_30min = 1800 / (seconds[fastest] * 60000 / n)
    print(
        f"fastest engine mode: {fastest[7:-1]}, {ratios[fastest]:.2f} x batched; "
        f"{per_30min:.0f} steps of 60,000 clients in 30 minutes at this rate"
    )


if __name__ == "__main__":
    main()
