"""LEAF Shakespeare (TFF HDF5): next-character prediction, one client per role.

Preprocessing follows LEAF (``txt_to_data``): a client's snippets are joined,
newlines become spaces, runs of spaces collapse to one, and every window of
``SEQ_LEN`` = 80 characters is an input whose label is the next character.
"""

from __future__ import annotations

import os
import re
from functools import lru_cache

import numpy as np

from .paths import dataset_dir

# LEAF's fixed 80-character vocabulary (models/utils/language_utils.py),
# spelled out so the ids never depend on the data. Any other character
# (e.g. '$', '@', non-ASCII) maps to OOV_ID.
CHARACTERS = "\n !\"&'(),-.0123456789:;>?ABCDEFGHIJKLMNOPQRSTUVWXYZ[]abcdefghijklmnopqrstuvwxyz}"
OOV_ID = len(CHARACTERS)  # 80
VOCAB_SIZE = OOV_ID + 1  # 81 logits: the 80 characters plus OOV
SEQ_LEN = 80

FILES = {"train": "shakespeare_train.h5", "test": "shakespeare_test.h5"}

ClientData = dict[str, tuple[np.ndarray, np.ndarray]]

_LOOKUP = np.full(128, OOV_ID, dtype=np.int64)
_LOOKUP[[ord(c) for c in CHARACTERS]] = np.arange(len(CHARACTERS))
assert len(set(CHARACTERS)) == len(CHARACTERS) == 80


def encode(text: str) -> np.ndarray:
    """Map each character to its id in :data:`CHARACTERS` (else OOV_ID).

    Parameters
    ----------
    text : str
        Any text.

    Returns
    -------
    numpy.ndarray
        int64 ids, one per character.

    Examples
    --------
    >>> encode("Ab$").tolist()  # '$' is not in LEAF's vocabulary
    [25, 54, 80]
    """
    codes = np.frombuffer(text.encode("utf-32-le"), dtype="<u4").astype(np.int64)
    ids = np.full(len(codes), OOV_ID, dtype=np.int64)
    ascii_ = codes < 128
    ids[ascii_] = _LOOKUP[codes[ascii_]]
    return ids


def decode(ids) -> str:
    """Inverse of :func:`encode`; OOV ids become U+FFFD.

    Parameters
    ----------
    ids : array_like of int
        Character ids.

    Returns
    -------
    str
        The text.

    Examples
    --------
    >>> decode(encode("To be"))
    'To be'
    """
    return "".join(CHARACTERS[i] if i < OOV_ID else "\ufffd" for i in np.asarray(ids))


def windows(text: str) -> tuple[np.ndarray, np.ndarray]:
    """Cut a client's text into LEAF examples.

    Parameters
    ----------
    text : str
        The client's cleaned text (``clean``).

    Returns
    -------
    x, y : numpy.ndarray
        ``x`` int64 (n, 80), a read-only sliding-window VIEW over one id array
        (so 2.3M training windows cost 18 MB, not 1.5 GB: index batches out of
        it, do not copy it whole); ``y`` int64 (n,) the next character ids.
        ``n = max(len(text) - 80, 0)``.

    Examples
    --------
    >>> x, y = windows("a" * 80 + "bc")
    >>> x.shape, decode(y)
    ((2, 80), 'bc')
    """
    ids = encode(text)
    if len(ids) <= SEQ_LEN:
        return np.zeros((0, SEQ_LEN), dtype=np.int64), np.zeros(0, dtype=np.int64)
    ids.flags.writeable = False
    x = np.lib.stride_tricks.sliding_window_view(ids[:-1], SEQ_LEN)
    return x, ids[SEQ_LEN:]


def clean(snippets: list[str]) -> str:
    r"""Join a client's snippets the way LEAF does (newlines -> spaces, runs of spaces -> one).

    Parameters
    ----------
    snippets : list of str
        The client's snippets.

    Returns
    -------
    str
        The joined text.

    Examples
    --------
    >>> clean(["To be,\nor not", "  to be"])
    'To be, or not to be'
    """
    text = " ".join(snippets).replace("\n", " ")
    return re.sub(" {2,}", " ", text)


@lru_cache(maxsize=4)
def _read(path: str) -> dict[str, tuple[str, ...]]:
    import h5py  # imported here: only this task needs it

    with h5py.File(path, "r") as f:
        examples = f["examples"]
        return {
            client: tuple(s.decode("utf-8") for s in examples[client]["snippets"][()]) for client in sorted(examples)
        }


def read_snippets(
    split: str,
    data_dir: str | os.PathLike | None = None,
    max_clients: int | None = None,
    max_snippets_per_client: int | None = None,
) -> dict[str, list[str]]:
    """Read the raw snippets of ``split`` ("train" or "test"), per client.

    Clients are sorted by id; ``max_clients`` keeps the first ones and
    ``max_snippets_per_client`` the first snippets of each.

    Parameters
    ----------
    split : str
        ``train`` or ``test``.
    data_dir : str or PathLike, optional
        Root of the offline data (holding ``shakespeare_tff/``).
    max_clients, max_snippets_per_client : int, optional
        Caps (>= 1).

    Returns
    -------
    dict of str to list of str
        Client id -> its snippets.

    Examples
    --------
    A root holding TFF's HDF5 layout (``examples/<client>/snippets``) with two roles:

    >>> import tempfile, h5py
    >>> from pathlib import Path
    >>> with tempfile.TemporaryDirectory() as d:
    ...     Path(d, "shakespeare_tff").mkdir()
    ...     with h5py.File(Path(d, "shakespeare_tff", FILES["train"]), "w") as f:
    ...         _ = f.create_dataset("examples/HAMLET/snippets", data=[b"To be,", b"or not"])
    ...         _ = f.create_dataset("examples/OPHELIA/snippets", data=[b"My lord"])
    ...     read_snippets("train", d, max_clients=1)
    {'HAMLET': ['To be,', 'or not']}
    """
    if split not in FILES:
        raise ValueError(f"split must be one of {sorted(FILES)}, got {split!r}")
    for name, value in (
        ("max_clients", max_clients),
        ("max_snippets_per_client", max_snippets_per_client),
    ):
        if value is not None and value < 1:
            raise ValueError(f"{name} must be >= 1, got {value}")
    path = dataset_dir(data_dir, "shakespeare_tff") / FILES[split]
    if not path.is_file():
        raise FileNotFoundError(f"missing Shakespeare file {str(path)!r}")
    clients = list(_read(str(path)).items())[:max_clients]
    return {c: list(s[:max_snippets_per_client]) for c, s in clients}


def load_shakespeare(
    split: str,
    data_dir: str | os.PathLike | None = None,
    max_clients: int | None = None,
    max_snippets_per_client: int | None = None,
) -> ClientData:
    """Load ``split`` as ``client id -> (x, y)`` next-character examples.

    ``x`` is int64 (n, 80) character ids (a read-only view, see
    :func:`windows`), ``y`` int64 (n,). Clients whose text is 80 characters
    or shorter get n = 0 (72 of 715 in train, 253 in test).

    Parameters
    ----------
    split : str
        ``train`` or ``test``.
    data_dir : str or PathLike, optional
        Root of the offline data (holding ``shakespeare_tff/``).
    max_clients, max_snippets_per_client : int, optional
        Caps (>= 1), as in :func:`read_snippets`.

    Returns
    -------
    dict of str to (numpy.ndarray, numpy.ndarray)
        Client id -> ``(x, y)``.

    Examples
    --------
    >>> import tempfile, h5py
    >>> from pathlib import Path
    >>> with tempfile.TemporaryDirectory() as d:
    ...     Path(d, "shakespeare_tff").mkdir()
    ...     with h5py.File(Path(d, "shakespeare_tff", FILES["test"]), "w") as f:
    ...         _ = f.create_dataset("examples/HAMLET/snippets", data=[b"x" * 85])
    ...     data = load_shakespeare("test", d)
    >>> data["HAMLET"][0].shape
    (5, 80)
    """
    snippets = read_snippets(split, data_dir, max_clients, max_snippets_per_client)
    return {c: windows(clean(s)) for c, s in snippets.items()}
