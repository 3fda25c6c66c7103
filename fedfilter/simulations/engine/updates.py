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
    """Where each ``state_dict`` entry sits in a flat float32 update row.

    Parameters
    ----------
    weights : list of numpy.ndarray
        The model's arrays, ``state_dict`` order; float32 only.

    Raises
    ------
    ValueError
        When an array is not float32.

    Examples
    --------
    >>> import numpy as np
    >>> layout = Layout([np.zeros((2, 3), np.float32), np.zeros(2, np.float32)])
    >>> layout.dim, layout.shapes
    (8, [(2, 3), (2,)])
    """

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
        """The per-array views of one flat row (no copy), shaped like the model's arrays.

        Parameters
        ----------
        row : numpy.ndarray
            A flat row of length ``dim``.

        Returns
        -------
        list of numpy.ndarray

        Examples
        --------
        >>> import numpy as np
        >>> layout = Layout([np.zeros((2, 3), np.float32), np.zeros(2, np.float32)])
        >>> [v.shape for v in layout.views(np.arange(8, dtype=np.float32))]
        [(2, 3), (2,)]
        """
        return [row[a:b].reshape(s) for a, b, s in zip(self.offsets[:-1], self.offsets[1:], self.shapes)]

    def flatten(self, arrays) -> np.ndarray:
        """One flat float32 row from the model-shaped ``arrays`` (the inverse of ``views``).

        Parameters
        ----------
        arrays : sequence of array_like
            Arrays shaped like the model's.

        Returns
        -------
        numpy.ndarray

        Examples
        --------
        >>> import numpy as np
        >>> layout = Layout([np.zeros((2, 3), np.float32), np.zeros(2, np.float32)])
        >>> layout.flatten(layout.views(np.arange(8, dtype=np.float32)))
        array([0., 1., 2., 3., 4., 5., 6., 7.], dtype=float32)
        """
        return np.concatenate([np.asarray(a, dtype=np.float32).ravel() for a in arrays])


class PerExampleGradients:
    """``-lr * grad loss(w; x_i, y_i)`` for a chunk of single-example clients, with torch.func.

    Every ``state_dict`` entry must be a trainable parameter (no buffers): a per-example update
    of a buffer has no meaning.

    Parameters
    ----------
    model : torch.nn.Module
        The model; its ``state_dict`` must be exactly its parameters.
    loss_fn : callable
        ``loss_fn(output, target)``.

    Raises
    ------
    ValueError
        When the model has buffers.

    Examples
    --------
    >>> import torch
    >>> model = torch.nn.Linear(2, 2)
    >>> grads = PerExampleGradients(model, torch.nn.functional.cross_entropy)
    >>> weights = [v.detach().numpy().copy() for v in model.state_dict().values()]
    >>> x, y = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]]), torch.tensor([0, 1, 1])
    >>> grads(weights, x, y, lr=0.1).shape
    (3, 6)
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
        """Whether the model with ``weights`` predicts each example's label.

        Parameters
        ----------
        weights : list of numpy.ndarray
            The model's arrays.
        x, y : torch.Tensor
            Examples and labels.

        Returns
        -------
        torch.Tensor
            Booleans, one per example.

        Examples
        --------
        >>> import torch
        >>> model = torch.nn.Linear(2, 2)
        >>> grads = PerExampleGradients(model, torch.nn.functional.cross_entropy)
        >>> weights = [v.detach().numpy().copy() for v in model.state_dict().values()]
        >>> grads.correct(weights, torch.eye(2), torch.tensor([0, 1])).shape
        torch.Size([2])
        """
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

    Parameters
    ----------
    model : torch.nn.Module
        The model (its weights are overwritten).
    weights : list of numpy.ndarray
        The global model the client received.
    x, y : numpy.ndarray
        The client's data.
    epochs, lr, batch_size : int, float, int
        Local SGD settings.
    seed : int
        The shuffling seed (``local_seed``).
    loss_fn : callable
        ``loss_fn(output, target)``.

    Returns
    -------
    list of numpy.ndarray
        ``returned - received``, differenced in float64, in the weights' dtypes.

    Examples
    --------
    >>> import numpy as np, torch
    >>> model = torch.nn.Linear(2, 2)
    >>> weights = [v.detach().numpy().copy() for v in model.state_dict().values()]
    >>> x, y = np.eye(2, dtype=np.float32), np.array([0, 1])
    >>> update = local_sgd_update(model, weights, x, y, epochs=1, lr=0.1, batch_size=2,
    ...                           seed=local_seed(1, 0), loss_fn=torch.nn.functional.cross_entropy)
    >>> [u.shape for u in update]
    [(2, 2), (2,)]
    """
    set_weights(model, weights)
    local_update(model, x, y, epochs=epochs, lr=lr, batch_size=batch_size, seed=seed, loss_fn=loss_fn)
    new = [v.detach().cpu().numpy() for v in model.state_dict().values()]
    return [(n.astype(np.float64) - w.astype(np.float64)).astype(w.dtype) for n, w in zip(new, weights)]


def local_seed(round_id: int, client: int) -> int:
    """The ClientApp's local shuffling seed for ``server-round = round_id`` and ``partition-id = client``.

    Parameters
    ----------
    round_id : int
        The server round.
    client : int
        The partition id.

    Returns
    -------
    int

    Examples
    --------
    >>> local_seed(2, 5)
    2000011
    """
    return 1_000_003 * int(round_id) + int(client)
