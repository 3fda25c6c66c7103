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
_OPTIONAL_ARRAYS = (
    "worst_state",
    "asks_in_run",
)  # worst_state: None in local placement; asks_in_run: older checkpoints lack it


def save_checkpoint(path: str | Path, snapshot: dict, meta: dict) -> None:
    """Write ``Engine.snapshot()`` and the caller's JSON-ready ``meta`` to ``path`` atomically.

    Parameters
    ----------
    path : str or pathlib.Path
        The ``.npz`` file to write (its folder is created).
    snapshot : dict
        What ``Engine.snapshot()`` returns.
    meta : dict
        The caller's JSON-ready data, returned as is by ``load_checkpoint``.

    Examples
    --------
    >>> import tempfile, numpy as np
    >>> snap = {"round_id": 3, "state": np.zeros(2), "weights": [np.ones(2, np.float32)]}
    >>> with tempfile.TemporaryDirectory() as d:
    ...     save_checkpoint(f"{d}/c.npz", snap, {"cell": "a"})
    ...     checkpoint_round(f"{d}/c.npz")
    3
    """
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
    """``(snapshot, meta)`` as saved by ``save_checkpoint``.

    Parameters
    ----------
    path : str or pathlib.Path
        A checkpoint written by ``save_checkpoint``.

    Returns
    -------
    tuple of (dict, dict)
        The snapshot (arrays restored, ``worst_state`` None where absent) and the meta.

    Examples
    --------
    >>> import tempfile, numpy as np
    >>> snap = {"round_id": 3, "state": np.zeros(2), "weights": [np.ones(2, np.float32)]}
    >>> with tempfile.TemporaryDirectory() as d:
    ...     save_checkpoint(f"{d}/c.npz", snap, {"cell": "a"})
    ...     back, meta = load_checkpoint(f"{d}/c.npz")
    >>> back["round_id"], back["weights"][0].tolist(), back["worst_state"], meta
    (3, [1.0, 1.0], None, {'cell': 'a'})
    """
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
    reports over many large checkpoints stay cheap).

    Parameters
    ----------
    path : str or pathlib.Path
        A checkpoint written by ``save_checkpoint``.

    Returns
    -------
    int
        The snapshot's ``round_id``.

    Examples
    --------
    >>> import tempfile, numpy as np
    >>> with tempfile.TemporaryDirectory() as d:
    ...     save_checkpoint(f"{d}/c.npz", {"round_id": 7, "weights": []}, {})
    ...     checkpoint_round(f"{d}/c.npz")
    7
    """
    with np.load(Path(path), allow_pickle=False) as z:
        return int(json.loads(str(z["json"]))["snapshot"]["round_id"])
