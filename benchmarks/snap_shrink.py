"""How much snapping toward zero onto SecAgg+'s grid shrinks real clipped updates.

    python benchmarks/snap_shrink.py                      # FEMNIST writers, the DP-SGD CNN, clip 0.5

A device in distributed placement clips its update to C and snaps every coordinate toward zero onto the
grid of step ``grid_step(C)`` (2^-12 C to 2^-13 C; ``client.mechanisms.skellam``), so the released
update is a little shorter than the clipped one. This trains every 7th writer's first-round update
(``femnist-long``'s local training: 5 epochs of batches of 32 at lr 0.2, from the seed-0 model) and
prints the snapped update's norm over the clipped one's, and its projection on the clipped direction
(what the mean keeps of the signal).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout
sys.path.insert(0, str(Path(__file__).resolve().parent))  # the presets beside it


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--clip", type=float, default=0.5)
    ap.add_argument("--every", type=int, default=7, help="every N-th writer")
    args = ap.parse_args(argv)

    import torch
    from fl_vs_flower_dp_presets import PRESETS

    from fedfilter.client.mechanisms.gaussian import clip_to_norm, snap_toward_zero
    from fedfilter.protocol.secagg.grid import grid_step
    from fedfilter.simulations.engine.updates import local_sgd_update
    from fedfilter.simulations.tasks.models import MnistCNN
    from fedfilter.simulations.tasks.registry import load_task

    preset = PRESETS["femnist-long"]
    task = load_task("femnist", num_clients=int(preset["num_clients"]))
    torch.manual_seed(0)
    model = MnistCNN(num_classes=task.num_classes)
    weights = [p.detach().numpy().copy() for p in model.state_dict().values()]
    step = grid_step(args.clip)
    ratios, projections = [], []
    for c in range(0, task.num_clients, args.every):
        x, y = task.train_data[c]
        update = local_sgd_update(
            model,
            weights,
            x,
            y,
            epochs=int(preset["local_epochs"]),
            lr=float(preset["lr"]),
            batch_size=int(preset["batch_size"]),
            seed=c,
            loss_fn=task.loss,
        )
        clipped, _ = clip_to_norm([np.asarray(u, dtype=np.float32) for u in update], args.clip)
        snapped = snap_toward_zero(clipped, step)
        a = np.concatenate([np.ravel(v).astype(np.float64) for v in clipped])
        b = np.concatenate([np.ravel(k) for k in snapped]).astype(np.float64) * step
        ratios.append(np.linalg.norm(b) / np.linalg.norm(a))
        projections.append(float(a @ b) / float(a @ a))
    print(
        f"{len(ratios)} writers, {a.size:,} coordinates, clip {args.clip:g}, grid step {step:g}: snapped norm / "
        f"clipped norm {np.mean(ratios):.4f} (min {np.min(ratios):.4f}); projection on the clipped update "
        f"{np.mean(projections):.4f}"
    )


if __name__ == "__main__":
    main()
