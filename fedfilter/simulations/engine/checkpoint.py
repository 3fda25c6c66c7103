"""Engine checkpoints on disk: a long run (an MNIST cell is hours here) survives being stopped.

One ``.npz`` file (no pickle): the snapshot's arrays, and everything else as one JSON string.
Written to a temporary file, fsync'd and renamed over the old one, so a kill at any moment leaves
either the previous checkpoint or the new one, never a torn file.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

_ARRAYS = ("state", "run_state", "exhausted_round", "graph_rounds")
_OPTIONAL_ARRAYS = ("worst_state",)  # None where the engine keeps none (local placement)


def save_checkpoint(path: str | Path, snapshot: dict, meta: dict) -> None:
    """Write ``Engine.snapshot()`` and the caller's JSON-ready ``meta`` to ``path`` atomically."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    rest = {k: v for k, v in snapshot.items() if k not in (*_ARRAYS, *_OPTIONAL_ARRAYS) and k != "weights"}
    arrays = {k: snapshot[k] for k in _ARRAYS if k in snapshot}
    arrays.update({k: snapshot[k] for k in _OPTIONAL_ARRAYS if snapshot.get(k) is not None})
    arrays.update({f"weights_{i}": w for i, w in enumerate(snapshot["weights"])})
    text = json.dumps({"meta": meta, "snapshot": rest, "weights": len(snapshot["weights"])})
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        np.savez(f, json=np.array(text), **arrays)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def load_checkpoint(path: str | Path) -> tuple[dict, dict]:
    """``(snapshot, meta)`` as saved by ``save_checkpoint``."""
    with np.load(Path(path), allow_pickle=False) as z:
        doc = json.loads(str(z["json"]))
        snapshot = dict(doc["snapshot"])
        for k in _ARRAYS:
            if k in z.files:  # graph_rounds: absent from checkpoints older than the SecAgg+ graph
                snapshot[k] = z[k].copy()
        for k in _OPTIONAL_ARRAYS:
            snapshot[k] = z[k].copy() if k in z.files else None
        snapshot["weights"] = [z[f"weights_{i}"].copy() for i in range(doc["weights"])]
    return snapshot, doc["meta"]


def checkpoint_round(path: str | Path) -> int:
    """The last finished round stored in a checkpoint, reading only its JSON member (progress
    reports over many large checkpoints stay cheap)."""
    with np.load(Path(path), allow_pickle=False) as z:
        return int(json.loads(str(z["json"]))["snapshot"]["round_id"])
