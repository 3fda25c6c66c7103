"""Checkpoints inside one arm of ``benchmarks/fl_vs_flower_dp.py``: a multi-hour arm survives being killed.

``results.json`` is written after every finished arm; inside an arm, every ``--checkpoint-every`` rounds
the arm's state goes to ``DIR/checkpoints/eps<epsilon>-<arm>.npz`` (``e.npz`` for no privacy, the same
run at every epsilon). Rerun with the same command, an arm starts from its checkpoint and ends where the
uninterrupted run would have: the engine's arms restore ``Engine.snapshot()`` (its noise and sampling are
derived from the seed, the run id and the round), Flower's arms their model, generators and accountant
(``harness.flower_central_dp``). The file is the engine's format (``fedfilter.simulations.engine.checkpoint``:
one ``.npz``, no pickle, replaced atomically) and is removed once the arm is in ``results.json``.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any


def arm_checkpoint(args: argparse.Namespace, epsilon: float, arm: str) -> Path | None:
    """Where ``arm`` at ``epsilon`` keeps its checkpoint (None without ``--out``)."""
    if not args.out:
        return None
    name = "e.npz" if arm == "e" else f"eps{epsilon:g}-{arm}.npz"
    return Path(args.out) / "checkpoints" / name


def run_engine_rounds(engine, rounds: int, path: Path | None, meta: dict[str, Any], every: int, bar) -> None:
    """Step ``engine`` to ``rounds``: from ``path``'s snapshot when it holds one of this arm (``meta``
    equal), saving a snapshot every ``every`` rounds and after the last."""
    from fedfilter.simulations.engine.checkpoint import load_checkpoint, save_checkpoint

    if path is not None and path.exists():
        snapshot, saved = load_checkpoint(path)
        if saved != meta:
            raise SystemExit(f"checkpoint {path} is of another run: {saved}, not {meta}; move it away.")
        engine.restore(snapshot)
        bar.update(engine.round_id)
    while engine.round_id < rounds:
        engine.step()
        bar.update(1)
        if path is not None and (engine.round_id % every == 0 or engine.round_id == rounds):
            save_checkpoint(path, engine.snapshot(), meta)


def discard(path: Path | None) -> None:
    """Remove an arm's checkpoint once its result is in ``results.json``."""
    if path is not None:
        path.unlink(missing_ok=True)


def checkpointed_round(path: Path | None) -> int:
    """The last round an arm's checkpoint holds (0 when there is none): a resumed arm's ``seconds``
    count from there."""
    from fedfilter.simulations.engine.checkpoint import checkpoint_round

    return checkpoint_round(path) if path is not None and path.exists() else 0
