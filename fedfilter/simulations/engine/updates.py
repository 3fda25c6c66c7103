"""Client updates before any privacy step: per-example gradients, or local SGD per client.

Both return float32 updates in the model's ``state_dict`` order, as the Flower client computes
them (``fedfilter.client.filter_mod``: ``returned - received``, differenced in float64 and cast back).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
from torch import nn
from torch.func import functional_call, grad, vmap

from fedfilter.simulations.tasks.training import local_update, set_weights


class Layout:
    """Where each ``state_dict`` entry sits in a flat float32 update row."""

    def __init__(self, weights: list[np.ndarray]):
        self.shapes = [tuple(w.shape) for w in weights]
        self.dtypes = [w.dtype for w in weights]
        sizes = [int(w.size) for w in weights]
        self.offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(int)
        self.dim = int(self.offsets[-1])
        problems = [f"state_dict entry {i} has dtype {d}" for i, d in enumerate(self.dtypes) if d != np.float32]
        if problems:
            raise ValueError("the engine handles float32 models only: " + "; ".join(problems) + ".")

    def views(self, row: np.ndarray) -> list[np.ndarray]:
        """The per-array views of one flat row (no copy), shaped like the model's arrays."""
        return [row[a:b].reshape(s) for a, b, s in zip(self.offsets[:-1], self.offsets[1:], self.shapes)]

    def flatten(self, arrays) -> np.ndarray:
        return np.concatenate([np.asarray(a, dtype=np.float32).ravel() for a in arrays])


class PerExampleGradients:
    """``-lr * grad loss(w; x_i, y_i)`` for a chunk of single-example clients, with torch.func.

    Every ``state_dict`` entry must be a trainable parameter (no buffers): a per-example update
    of a buffer has no meaning.
    """

    def __init__(self, model: nn.Module, loss_fn: Callable):
        names = [n for n, _ in model.named_parameters()]
        keys = list(model.state_dict().keys())
        if names != keys:
            raise ValueError(
                f"single-example clients need a model whose state_dict is exactly its parameters. "
                f"Found extra entries {sorted(set(keys) - set(names))}."
            )
        self.model, self.names = model, names

        def loss_one(params, x, y):
            out = functional_call(model, params, (x.unsqueeze(0),))
            return loss_fn(out, y.unsqueeze(0)), out[0].argmax() == y

        self._grads = vmap(grad(loss_one, has_aux=True), in_dims=(None, 0, 0))

    def __call__(self, weights: list[np.ndarray], x: torch.Tensor, y: torch.Tensor, *, lr: float) -> np.ndarray:
        """Flat ``(len(x), dim)`` float32 updates."""
        params = {n: torch.from_numpy(w) for n, w in zip(self.names, weights)}
        grads, _ = self._grads(params, x, y)
        flat = torch.cat([grads[n].reshape(len(x), -1) for n in self.names], dim=1)
        return (flat.mul_(-lr) if lr != 1.0 else flat.neg_()).numpy()  # in place: no second copy

    @torch.no_grad()
    def correct(self, weights: list[np.ndarray], x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        params = {n: torch.from_numpy(w) for n, w in zip(self.names, weights)}
        return functional_call(self.model, params, (x,)).argmax(dim=1) == y


def local_sgd_update(
    model: nn.Module,
    weights: list[np.ndarray],
    x: np.ndarray,
    y: np.ndarray,
    *,
    epochs: int,
    lr: float,
    batch_size: int,
    seed: int,
    loss_fn: Callable,
) -> list[np.ndarray]:
    """One client's update, computed as ``fedfilter.app.client_app.train`` + ``fedfilter.client.filter_mod`` do.

    ``seed`` is the ClientApp's local shuffling seed ``1_000_003 * server_round + partition_id``.
    """
    set_weights(model, weights)
    local_update(model, x, y, epochs=epochs, lr=lr, batch_size=batch_size, seed=seed, loss_fn=loss_fn)
    new = [v.detach().cpu().numpy() for v in model.state_dict().values()]
    return [(n.astype(np.float64) - w.astype(np.float64)).astype(w.dtype) for n, w in zip(new, weights)]


def local_seed(round_id: int, client: int) -> int:
    """The ClientApp's local shuffling seed for ``server-round = round_id`` and ``partition-id = client``."""
    return 1_000_003 * int(round_id) + int(client)
