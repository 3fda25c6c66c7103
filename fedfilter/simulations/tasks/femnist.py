"""LEAF FEMNIST: handwritten characters, naturally federated by writer."""

from __future__ import annotations

import gzip
import json
import os
from functools import lru_cache
from pathlib import Path

import numpy as np

from .paths import dataset_dir

NUM_CLASSES = 62  # digits, upper- and lower-case letters

ClientData = dict[str, tuple[np.ndarray, np.ndarray]]


def _read_shards(folder: Path) -> ClientData:
    paths = sorted(folder.glob("*.json.gz")) + sorted(folder.glob("*.json"))
    if not paths:
        raise FileNotFoundError(f"no LEAF .json(.gz) shards in {str(folder)!r}")
    clients: ClientData = {}
    for path in paths:
        opener = gzip.open if path.suffix == ".gz" else open
        with opener(path, "rt", encoding="utf-8") as f:
            shard = json.load(f)
        for user in shard["users"]:
            if user in clients:
                raise ValueError(f"{path}: writer {user!r} appears in two shards")
            data = shard["user_data"][user]
            x = np.asarray(data["x"], dtype=np.float32).reshape(-1, 1, 28, 28)
            y = np.asarray(data["y"], dtype=np.int64)
            if len(x) != len(y) or (len(y) and not 0 <= y.min() <= y.max() < NUM_CLASSES):
                raise ValueError(f"{path}: bad samples for writer {user!r}")
            x.flags.writeable = False
            y.flags.writeable = False
            clients[user] = (x, y)
    return dict(sorted(clients.items()))


@lru_cache(maxsize=2)
def _load(folder: str) -> tuple[ClientData, ClientData]:
    train = _read_shards(Path(folder, "train"))
    test = _read_shards(Path(folder, "test"))
    extra = sorted(set(test) - set(train))
    if extra:
        raise ValueError(f"{folder}: test writers missing from train: {extra[:5]}")
    return train, test


def load_femnist(
    data_dir: str | os.PathLike | None = None,
    max_clients: int | None = None,
) -> tuple[ClientData, ClientData]:
    """Load the LEAF FEMNIST shards, one entry per writer.

    Parameters
    ----------
    data_dir : str or PathLike, optional
        Root of the offline data (holding ``femnist_leaf_partial/`` with ``train/`` and ``test/``
        LEAF ``.json(.gz)`` shards).
    max_clients : int, optional
        Keep only the first ``max_clients`` writers (sorted by writer id).

    Returns
    -------
    train, test : dict of str to (numpy.ndarray, numpy.ndarray)
        Dicts ``writer id -> (x, y)`` sorted by writer id; ``x`` float32
        (n, 1, 28, 28) with values in [0, 1] as LEAF stores them (background
        is 1.0), ``y`` int64 in 0..61. ``test`` holds the same writers'
        held-out samples (LEAF's per-writer split). Read-only arrays.

    Examples
    --------
    A root holding one LEAF shard per split, of two writers:

    >>> import tempfile
    >>> users = {"w1": {"x": [[1.0] * 784], "y": [0]}, "w2": {"x": [[1.0] * 784], "y": [1]}}
    >>> shard = {"users": list(users), "user_data": users}
    >>> with tempfile.TemporaryDirectory() as d:
    ...     for split in ("train", "test"):
    ...         Path(d, "femnist_leaf_partial", split).mkdir(parents=True)
    ...         _ = Path(d, "femnist_leaf_partial", split, "shard.json").write_text(json.dumps(shard))
    ...     train, test = load_femnist(d, max_clients=1)
    >>> list(train), train["w1"][0].shape
    (['w1'], (1, 1, 28, 28))
    """
    if max_clients is not None and max_clients < 1:
        raise ValueError(f"max_clients must be >= 1, got {max_clients}")
    train, test = _load(str(dataset_dir(data_dir, "femnist_leaf_partial")))
    writers = list(train)[:max_clients]
    return {w: train[w] for w in writers}, {w: test[w] for w in writers if w in test}
