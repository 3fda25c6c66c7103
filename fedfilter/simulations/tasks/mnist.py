"""MNIST from the four original IDX ``.gz`` files (gzip + numpy only)."""

from __future__ import annotations

import gzip
import os
from functools import lru_cache
from pathlib import Path

import numpy as np

from .paths import dataset_dir

# The usual published statistics of the MNIST training pixels (scaled to
# [0, 1]), as used by torchvision and Opacus' MNIST example.
MNIST_MEAN = 0.1307
MNIST_STD = 0.3081

IMAGES_MAGIC = 0x803  # unsigned byte, 3 dimensions
LABELS_MAGIC = 0x801  # unsigned byte, 1 dimension

FILES = {
    "train": ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz"),
    "test": ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"),
}


def _read_idx(path: Path, magic: int, ndim: int) -> np.ndarray:
    with gzip.open(path, "rb") as f:
        raw = f.read()
    found = int.from_bytes(raw[:4], "big")
    if found != magic:
        raise ValueError(f"{path}: magic number is {found:#x}, expected {magic:#x}")
    if len(raw) < 4 * (1 + ndim):
        raise ValueError(f"{path}: {len(raw)} bytes, too short for an IDX header")
    shape = tuple(int(d) for d in np.frombuffer(raw, dtype=">u4", count=ndim, offset=4))
    data = np.frombuffer(raw, dtype=np.uint8, offset=4 * (1 + ndim))
    if data.size != int(np.prod(shape)):
        raise ValueError(f"{path}: header announces shape {shape} but holds {data.size} bytes")
    return data.reshape(shape)


def read_idx_images(path: str | os.PathLike) -> np.ndarray:
    """Read an IDX image file (magic 0x803) as uint8 of shape (N, rows, cols).

    Parameters
    ----------
    path : str or PathLike
        A gzipped IDX image file.

    Returns
    -------
    numpy.ndarray
        uint8 images (read-only).

    Raises
    ------
    ValueError
        A wrong magic number, or a header that does not match the data.

    Examples
    --------
    >>> import tempfile
    >>> header = (0x803).to_bytes(4, "big") + b"".join(n.to_bytes(4, "big") for n in (2, 3, 3))
    >>> with tempfile.TemporaryDirectory() as d:
    ...     path = Path(d, "images.gz")
    ...     _ = path.write_bytes(gzip.compress(header + bytes(range(18))))
    ...     read_idx_images(path).shape
    (2, 3, 3)
    """
    return _read_idx(Path(path), IMAGES_MAGIC, 3)


def read_idx_labels(path: str | os.PathLike) -> np.ndarray:
    """Read an IDX label file (magic 0x801) as uint8 of shape (N,).

    Parameters
    ----------
    path : str or PathLike
        A gzipped IDX label file.

    Returns
    -------
    numpy.ndarray
        uint8 labels (read-only).

    Raises
    ------
    ValueError
        A wrong magic number, or a header that does not match the data.

    Examples
    --------
    >>> import tempfile
    >>> with tempfile.TemporaryDirectory() as d:
    ...     path = Path(d, "labels.gz")
    ...     _ = path.write_bytes(gzip.compress((0x801).to_bytes(4, "big") + (3).to_bytes(4, "big") + bytes([7, 1, 0])))
    ...     read_idx_labels(path).tolist()
    [7, 1, 0]
    """
    return _read_idx(Path(path), LABELS_MAGIC, 1)


def load_mnist(
    data_dir: str | os.PathLike | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Load MNIST (60,000 train, 10,000 test) from its four IDX files.

    Parameters
    ----------
    data_dir : str or PathLike, optional
        Root of the offline data (holding ``mnist/``); default
        :func:`fedfilter.simulations.tasks.paths.data_dir`.

    Returns
    -------
    x_train, y_train, x_test, y_test : numpy.ndarray
        Images float32 of shape (N, 1, 28, 28), scaled to [0, 1] then
        normalised with mean 0.1307 and std 0.3081; labels int64. Read-only
        (cached and shared).

    Examples
    --------
    A root holding a two-image ``mnist/`` folder in the original format:

    >>> import tempfile
    >>> def idx(magic, *dims):
    ...     return b"".join(n.to_bytes(4, "big") for n in (magic, *dims))
    >>> with tempfile.TemporaryDirectory() as d:
    ...     (Path(d) / "mnist").mkdir()
    ...     for images, labels in FILES.values():
    ...         _ = Path(d, "mnist", images).write_bytes(gzip.compress(idx(0x803, 2, 28, 28) + bytes(2 * 784)))
    ...         _ = Path(d, "mnist", labels).write_bytes(gzip.compress(idx(0x801, 2) + bytes([3, 5])))
    ...     x_train, y_train, x_test, y_test = load_mnist(d)
    >>> x_train.shape, y_test.tolist()
    ((2, 1, 28, 28), [3, 5])
    """
    return _load(str(dataset_dir(data_dir, "mnist")))


@lru_cache(maxsize=2)
def _load(folder: str) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    out: list[np.ndarray] = []
    for split in ("train", "test"):
        images_name, labels_name = FILES[split]
        images = read_idx_images(Path(folder, images_name))
        labels = read_idx_labels(Path(folder, labels_name))
        if len(images) != len(labels):
            raise ValueError(f"{folder}: {len(images)} {split} images but {len(labels)} labels")
        x = images.astype(np.float32)[:, None, :, :]
        x *= 1.0 / 255.0
        x -= MNIST_MEAN
        x /= MNIST_STD
        y = labels.astype(np.int64)
        x.flags.writeable = False
        y.flags.writeable = False
        out += [x, y]
    x_train, y_train, x_test, y_test = out
    return x_train, y_train, x_test, y_test
