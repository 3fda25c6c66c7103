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
    """Copy the model's state dict values, in order, as numpy arrays."""
    return [v.detach().cpu().numpy().copy() for v in model.state_dict().values()]


def set_weights(model: nn.Module, arrays) -> None:
    """Load arrays (in state dict order, as from :func:`get_weights`) into ``model``."""
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

    Returns
    -------
    list of float32 arrays: new weights minus old, in state dict order.
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
    """Return (mean loss, accuracy) of ``model`` on ``x``, ``y``."""
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
