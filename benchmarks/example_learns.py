"""How the quickstart example learns at the planner's settings, over seeds.

An offline replica of ``examples/quickstart-pytorch``'s rounds, without Flower: each device trains
the example's CNN on its digits partition (the example's own ``task.py``), clips its update to C,
adds the Gaussian noise of the round rules (``client/round_rules.added_noise_std``), and the server
adds the plain mean. ``--silent`` devices contribute no signal (the example test's small-budget
device, spent in round 1), only noise. Prints the held-out accuracy after each round per seed, and
the planner's noise figure next to the measured norm of the mean's noise.

    python benchmarks/example_learns.py --seeds 6 --rounds 3 --epochs 3 --clip 3 --noise-multiplier 0.0061

It is not the Flower path (tests/test_example_app.py runs that); it shows the spread of
accuracy a test of a few rounds must tolerate.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

from fedfilter.planning.federation import mean_noise_norm
from fedfilter.protocol.rules import added_noise_std

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "quickstart-pytorch"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--devices", type=int, default=3)
    p.add_argument("--silent", type=int, default=1, help="devices that send noise only")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--clip", type=float, default=3.0)
    p.add_argument("--noise-multiplier", type=float, default=0.0061)
    p.add_argument("--seeds", type=int, default=6)
    args = p.parse_args(argv)

    import torch

    sys.path.insert(0, str(EXAMPLE))
    from pytorchexample.task import Net, load_centralized_dataset, load_data, test, train

    torch.set_num_threads(1)
    std = added_noise_std(args.noise_multiplier, args.clip, "local", 1)
    test_loader = load_centralized_dataset()
    finals, noise_norms = [], []
    for seed in range(1, args.seeds + 1):
        torch.manual_seed(seed)
        rng = np.random.default_rng(seed)
        model = Net()
        keys = list(model.state_dict())
        accuracies = []
        for _ in range(args.rounds):
            reports = []
            for pid in range(args.devices):
                local = Net()
                local.load_state_dict(model.state_dict())
                loader, _ = load_data(pid, args.devices, 32)
                train(local, loader, args.epochs, args.lr, "cpu")
                update = [(local.state_dict()[k] - model.state_dict()[k]).numpy().astype(np.float64) for k in keys]
                norm = float(np.sqrt(sum(float((u**2).sum()) for u in update)))
                scale = 0.0 if pid < args.silent else min(1.0, args.clip / norm)
                reports.append([(u * scale, rng.normal(0.0, std, u.shape)) for u in update])
            mean = [sum(r[i][0] + r[i][1] for r in reports) / args.devices for i in range(len(keys))]
            noise = [sum(r[i][1] for r in reports) / args.devices for i in range(len(keys))]
            noise_norms.append(float(np.sqrt(sum(float((x**2).sum()) for x in noise))))
            state = {k: model.state_dict()[k] + torch.from_numpy(m).float() for k, m in zip(keys, mean)}
            model.load_state_dict(state)
            accuracies.append(test(model, test_loader, "cpu")[1])
        finals.append(accuracies[-1])
        print(f"seed {seed}: held-out accuracy per round {[round(a, 3) for a in accuracies]}")
    dim = sum(int(t.numel()) for t in Net().state_dict().values() if t.is_floating_point())
    planned = mean_noise_norm(
        noise_multiplier=args.noise_multiplier,
        clip=args.clip,
        placement="local",
        min_reports=1,
        devices=args.devices,
        dim=dim,
    )
    print(f"final accuracy: min {min(finals):.3f}, median {float(np.median(finals)):.3f}, max {max(finals):.3f}")
    print(f"noise norm of the mean: planned {planned:.4g}, measured mean {np.mean(noise_norms):.4g}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
