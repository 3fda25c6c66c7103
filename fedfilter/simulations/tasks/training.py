"""Local training and evaluation with plain torch (no Flower, no data loaders).

Imported by the Flower ClientApp in fresh processes, so it depends only on
numpy and torch.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def get_weights(model: nn.Module) -> list[np.ndarray]:
    """Copy the model's state dict values, in order, as numpy arrays.

    Parameters
    ----------
    model : torch.nn.Module
        The model.

    Returns
    -------
    list of numpy.ndarray
        One copy per state-dict entry.

    Examples
    --------
    >>> [w.shape for w in get_weights(nn.Linear(3, 2))]
    [(2, 3), (2,)]
    """
    return [v.detach().cpu().numpy().copy() for v in model.state_dict().values()]


def set_weights(model: nn.Module, arrays) -> None:
    """Load arrays (in state dict order, as from :func:`get_weights`) into ``model``.

    Parameters
    ----------
    model : torch.nn.Module
        The model, changed in place.
    arrays : iterable of array_like
        One array per state-dict entry, of its shape (copied: the caller keeps its arrays).

    Raises
    ------
    ValueError
        A wrong number of arrays or a wrong shape.

    Examples
    --------
    >>> model = nn.Linear(3, 2)
    >>> set_weights(model, [np.zeros((2, 3)), np.ones(2)])
    >>> model.bias.tolist()
    [1.0, 1.0]
    """
    state = model.state_dict()
    arrays = list(arrays)
    if len(arrays) != len(state):
        raise ValueError(f"got {len(arrays)} arrays for {len(state)} state entries")
    new = {}
    for (name, old), a in zip(state.items(), arrays):
        a = np.asarray(a)
        if tuple(a.shape) != tuple(old.shape):
            raise ValueError(f"{name}: array shape {tuple(a.shape)} != parameter shape {tuple(old.shape)}")
        new[name] = torch.tensor(a, dtype=old.dtype)  # copies: caller keeps its arrays
    model.load_state_dict(new, strict=True)


def _batch(x: np.ndarray, idx: np.ndarray) -> torch.Tensor:
    # Fancy indexing copies only the batch (x may be a big read-only view).
    return torch.from_numpy(np.ascontiguousarray(x[idx]))


def local_update(
    model: nn.Module,
    x: np.ndarray,
    y: np.ndarray,
    *,
    epochs: int,
    lr: float,
    batch_size: int,
    seed: int,
    loss_fn: LossFn | None = None,
) -> list[np.ndarray]:
    """Train ``model`` in place with plain SGD and return the weight change.

    Each epoch visits every sample once in an order drawn from a
    ``torch.Generator`` seeded with ``seed`` (the last batch may be smaller).

    Parameters
    ----------
    model : torch.nn.Module
        The model, trained in place.
    x, y : numpy.ndarray
        The samples and their int labels (equal, non-zero numbers).
    epochs : int
        Passes over the data (>= 1).
    lr : float
        The learning rate (> 0).
    batch_size : int
        Samples per step (>= 1).
    seed : int
        Seed of the sample order.
    loss_fn : callable, optional
        ``loss(logits, labels)``; default cross-entropy.

    Returns
    -------
    list of numpy.ndarray
        float32 arrays: new weights minus old, in state dict order.

    Examples
    --------
    >>> torch.manual_seed(0)  # doctest: +ELLIPSIS
    <torch._C.Generator object at ...>
    >>> model = nn.Linear(2, 2)
    >>> x, y = np.array([[1.0, 0.0], [0.0, 1.0]], dtype=np.float32), np.array([0, 1])
    >>> delta = local_update(model, x, y, epochs=5, lr=0.5, batch_size=2, seed=0)
    >>> [d.dtype.name for d in delta], evaluate(model, x, y)[1]
    (['float32', 'float32'], 1.0)
    """
    if len(x) != len(y) or len(x) == 0:
        raise ValueError(f"need equal, non-zero numbers of samples, got {len(x)} and {len(y)}")
    if epochs < 1:
        raise ValueError(f"epochs must be >= 1, got {epochs}")
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    if not lr > 0:
        raise ValueError(f"lr must be > 0, got {lr}")
    loss_fn = loss_fn or F.cross_entropy
    y = np.asarray(y, dtype=np.int64)
    before = get_weights(model)
    generator = torch.Generator().manual_seed(int(seed))
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    model.train()
    for _ in range(epochs):
        order = torch.randperm(len(x), generator=generator).numpy()
        for start in range(0, len(order), batch_size):
            idx = order[start : start + batch_size]
            optimizer.zero_grad(set_to_none=True)
            loss_fn(model(_batch(x, idx)), _batch(y, idx)).backward()
            optimizer.step()
    after = get_weights(model)
    return [(a.astype(np.float32) - b.astype(np.float32)) for a, b in zip(after, before)]


@torch.no_grad()
def evaluate(
    model: nn.Module,
    x: np.ndarray,
    y: np.ndarray,
    *,
    batch_size: int = 1024,
    loss_fn: LossFn | None = None,
) -> tuple[float, float]:
    """Return (mean loss, accuracy) of ``model`` on ``x``, ``y``.

    Parameters
    ----------
    model : torch.nn.Module
        The model (put in eval mode).
    x, y : numpy.ndarray
        The samples and their int labels (equal, non-zero numbers).
    batch_size : int, optional
        Samples per forward pass.
    loss_fn : callable, optional
        ``loss(logits, labels)`` (a batch mean); default cross-entropy.

    Returns
    -------
    tuple of float
        ``(mean loss, accuracy)``.

    Examples
    --------
    >>> model = nn.Linear(2, 2)
    >>> set_weights(model, [np.eye(2), np.zeros(2)])
    >>> loss, accuracy = evaluate(model, np.eye(2, dtype=np.float32), np.array([0, 1]))
    >>> round(loss, 4), accuracy
    (0.3133, 1.0)
    """
    if len(x) != len(y) or len(x) == 0:
        raise ValueError(f"need equal, non-zero numbers of samples, got {len(x)} and {len(y)}")
    loss_fn = loss_fn or F.cross_entropy
    y = np.asarray(y, dtype=np.int64)
    model.eval()
    total_loss, correct = 0.0, 0
    for start in range(0, len(x), batch_size):
        idx = np.arange(start, min(start + batch_size, len(x)))
        logits = model(_batch(x, idx))
        target = _batch(y, idx)
        total_loss += float(loss_fn(logits, target)) * len(idx)  # loss is a batch mean
        correct += int((logits.argmax(dim=1) == target).sum())
    return total_loss / len(x), correct / len(x)
