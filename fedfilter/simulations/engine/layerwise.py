"""Fast mode (``norms="fast"``): each single-example client's certified norm and the clipped sum,
layer by layer, without a per-example gradient of the whole model.

A private step needs only each client's norm and ``sum_i c_i G_i`` (Li, Tramèr, Liang & Hashimoto,
ICLR 2022, ghost clipping; Bu, Wang, Zha & Karypis, ICML 2023, book-keeping). One batched forward
records each layer's input ``a`` and one ``autograd.grad`` of the summed loss gives each layer's
output gradient ``g`` (no weight gradient is formed). Per example ``i`` and layer:

* ``Linear`` on ``(B, in)``: the gradient is the outer product ``g_i a_i^T``, whose norm is exactly
  ``||g_i|| ||a_i||`` (never formed); the clipped sum is one GEMM ``(w g)^T a`` (book-keeping).
* ``Conv2d``: the ``(out, in, kh, kw)`` per-example gradients as one grouped convolution
  backward with the chunk's examples as groups (each group sees only its own example; mkldnn, 1.2
  times faster here than im2col + ``bmm``, Opacus' grad sampler, and far cheaper than ghost norms'
  ``T^2`` Gram matrices for conv1's ``T = 196`` positions); bias: ``g_i`` summed over positions.
  The clipped sum is one GEMV over these rows.
* ``Linear`` on ``(B, ..., in)``: the per-example ``(out, in)`` gradients by one ``bmm`` over the
  positions, the bias as a column of ones.

What client ``i`` adds is ``w32_i G_i`` in exact arithmetic, where ``G_i`` is, per layer, the exact
outer product (Linear on 2-d input) or the float32 array above: a function of its own example and
the public model only (no layer mixes examples: no BatchNorm). Its charge is certified:

* float32 squares summed in float32 blocks of 16 are within ``gamma_16`` of exact (Higham,
  "Accuracy and Stability of Numerical Algorithms", 2nd ed., eq. (3.5), any order, with or
  without FMA; plus ``2**-126`` per operation for underflow), the block sums are added in float64
  (within ``gamma_{d/16}``, eq. (4.4)); every later product, sum and square root adds a few ``u``,
  each covered by ``_up`` (inflate by ``k * 2u``, then one ulp up): ``norm >= lr ||G_i||``, within
  about 2e-6 of it;
* the clip factor is shrunk four float64 ulps below ``allowance / norm`` and the float32
  coefficient ``w32_i`` is rounded toward zero, so ``||w32_i G_i|| <= allowance`` holds exactly,
  and the charge ``min(allowance, up(c_i * norm))`` is an upper bound on it that the filter admits.

The sum over the chunk's clients is formed in float32 (GEMM, GEMV), the chunks' sums in float64:
that rounding is the aggregator's, as in any DP-SGD library and in the other norm modes' float64
sums (a deployment with secure aggregation sums exactly); it is not part of a client's charge.
``tests/simulations/engine/test_engine_fast.py`` checks it against the exact rational sum (within 1e-6 relative).

A gradient with an entry above about 1.8e19 (whose float32 square overflows) counts as
non-finite and is released as a zero update, charged 0, as NaN and inf are.

Models with any other parameterised layer (``Embedding``, ``LSTM``, grouped or dilated
convolutions, a layer applied twice) are not handled: ``supported(model)`` says why, and the
engine falls back to per-example torch.func gradients with ``norms="vectorised"``. A model whose
parameter-free layers mix the examples of a batch is refused at its first chunk (``_audit``). The
loss must accept ``reduction="sum"`` (torch.nn.functional's do).

Threads: everything here is batched torch (GEMM, bmm, convolutions), which uses
``torch.get_num_threads()`` threads; a run is bitwise repeatable for a fixed thread count.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
from torch import nn

_EPS = 2.0**-52  # 2u for float64

# One layer of a chunk (see ``_per_layer``): module, weight and bias squared-norm bounds (bias None
# when it has none or is bounded with the weight), kind ("outer" | "dense" | "bmm"), float32 arrays.
LayerPart = tuple[nn.Module, torch.Tensor, torch.Tensor | None, str, tuple[torch.Tensor, ...]]


def _up(x: torch.Tensor, k: float) -> torch.Tensor:
    """An upper bound on ``x * (1 + k u)`` for a float64 ``x`` holding a value whose exact
    counterpart is at most ``x * (1 + k u)``: inflate by ``k * 2u`` and step one ulp up (the
    rounding of the product itself is at most half an ulp)."""
    up = torch.nextafter(x * (1.0 + k * _EPS), torch.tensor(float("inf"), dtype=x.dtype))
    return torch.where(x > 0, up, x)  # an exact zero stays zero (a zero update costs nothing)


def _sq_rows(x64: torch.Tensor) -> torch.Tensor:
    """Upper bounds on the exact sum of squares of each row of a ``(B, d)`` float64 array holding
    float32 values (each square is exact in float64; the sum of ``d`` terms is within gamma_{d-1},
    Higham eq. (4.4))."""
    return _up(torch.einsum("ij,ij->i", x64, x64), x64.shape[1] + 2)


_BLOCK = 16  # float32 squares are summed in blocks of 16, the block sums in float64
_U32 = 2.0**-24


def _sq_rows32(x: torch.Tensor, squares: torch.Tensor | None = None) -> torch.Tensor:
    """Upper bounds on the exact sum of squares of each row of a float32 ``(B, d)`` array, without
    a float64 copy of it: float32 squares summed in blocks of ``b = 16`` (each block within
    ``gamma_b = b u / (1 - b u)`` of exact, u = 2**-24, in any order and with or without FMA;
    Higham eq. (3.5)), the block sums added in float64. Underflow (or flush-to-zero) can lose at
    most ``2**-126`` per square and per addition: ``d * 2**-125`` in all."""
    B, d = x.shape
    if d % _BLOCK:
        return _sq_rows(x.to(torch.float64))
    sq = x * x if squares is None else squares  # (a caller may hand in x * x, computed into a buffer)
    blocks = sq.reshape(B, d // _BLOCK, _BLOCK).sum(2).to(torch.float64)
    s = _up(blocks.sum(1), d // _BLOCK + 2)  # the float32 block sums, added in float64
    bound = _up(s * (1.0 + 2 * _BLOCK * _U32) + d * 2.0**-125, 4)  # 1 / (1 - gamma_b) <= 1 + 2 b u
    zero = s == 0
    if zero.any():  # a row of exact zeros costs exactly 0 (one that underflowed does not)
        bound[zero] = torch.where((x[zero] == 0).all(1), 0.0, bound[zero])
    return bound


def supported(model: nn.Module) -> str | None:
    """``None`` if the fast mode handles ``model``; else the reason it does not.

    Parameters
    ----------
    model : torch.nn.Module
        The model to check.

    Returns
    -------
    str or None

    Examples
    --------
    >>> import torch
    >>> supported(torch.nn.Sequential(torch.nn.Linear(2, 2))) is None
    True
    >>> supported(torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.BatchNorm1d(2)))
    'its state_dict holds entries that are not parameters (buffers)'
    """
    names = [n for n, _ in model.named_parameters()]
    if names != list(model.state_dict().keys()):
        return "its state_dict holds entries that are not parameters (buffers)"
    owners = {}
    for mname, mod in model.named_modules():
        for pname, _ in mod.named_parameters(recurse=False):
            owners[f"{mname}.{pname}" if mname else pname] = mod
    for pname, mod in owners.items():
        if isinstance(mod, nn.Linear):
            continue
        if (
            isinstance(mod, nn.Conv2d)
            and mod.groups == 1
            and mod.padding_mode == "zeros"
            and not isinstance(mod.padding, str)
            and tuple(mod.dilation) == (1, 1)
        ):
            continue
        return f"parameter {pname} belongs to a {type(mod).__name__}, which the fast mode does not handle"
    return None


def clip_coefficients(norm: torch.Tensor, allowance, lr: float) -> tuple[torch.Tensor, torch.Tensor]:
    """``(w32, charged)`` from certified norms ``norm >= ||-lr G_i||`` (inf: non-finite).

    Client ``i`` adds ``w32_i G_i`` (exactly, in reals), ``charged_i >= ||w32_i G_i||`` and
    ``charged_i <= allowance_i``; NaN marks a non-finite gradient: its client adds nothing and is
    charged 0.

    Parameters
    ----------
    norm : torch.Tensor
        float64 certified norms of ``-lr G_i`` (inf where non-finite).
    allowance : array_like
        Each client's allowance.
    lr : float
        The step.

    Returns
    -------
    tuple of (torch.Tensor, torch.Tensor)
        The float32 coefficients and the float64 charged norms.

    Examples
    --------
    >>> import numpy as np, torch
    >>> norm = torch.tensor([0.5, 2.0, float("inf")], dtype=torch.float64)
    >>> w32, charged = clip_coefficients(norm, np.ones(3), lr=1.0)
    >>> w32.tolist(), charged.tolist()
    ([-1.0, -0.4999999701976776, -0.0], [0.5, 1.0, nan])
    """
    allow = torch.as_tensor(np.asarray(allowance, dtype=np.float64))
    finite = torch.isfinite(norm)
    over = norm > allow
    # (1 - 4u): the quotient, this product and the coefficient -lr * factor below each round by
    # at most u, so ||w G_i|| <= factor (1 + u) norm <= allowance (1 - u) holds exactly.
    factor = torch.where(over, (allow / norm) * (1.0 - 2 * _EPS), torch.ones_like(norm))
    factor = torch.where(finite, factor, torch.zeros_like(norm))  # a non-finite update: zero
    charged = torch.where(over, torch.minimum(allow, _up(factor * norm, 4)), norm)
    charged = torch.where(finite, charged, torch.full_like(norm, float("nan")))
    w = factor * (-float(lr))
    # float32 coefficient rounded toward zero (|w32| <= |w|), so w32 G_i is no larger than charged
    w32 = w.to(torch.float32)
    w32 = torch.where(w32.to(torch.float64).abs() > w.abs(), torch.nextafter(w32, torch.zeros_like(w32)), w32)
    return w32, charged


class LayerwiseClippedSum:
    """Certified per-client norms and the clipped sum for a chunk of single-example clients.

    Large per-chunk arrays (im2col columns, per-example gradients, squares) live in buffers reused
    from chunk to chunk: fresh ones cost page faults that, on this machine, took longer than the
    arithmetic.

    Parameters
    ----------
    model : torch.nn.Module
        A model of Linear and Conv2d layers (``supported``); hooks are registered on its layers.
    loss_fn : callable
        ``loss_fn(output, target)``.

    Raises
    ------
    ValueError
        When ``supported(model)`` gives a reason.

    Examples
    --------
    >>> import numpy as np, torch
    >>> _ = torch.manual_seed(0)
    >>> model = torch.nn.Sequential(torch.nn.Linear(2, 2))
    >>> fast = LayerwiseClippedSum(model, torch.nn.functional.cross_entropy)
    >>> weights = [v.detach().numpy().copy() for v in model.state_dict().values()]
    >>> x, y = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]]), torch.tensor([0, 1, 1])
    >>> total, charged = fast(weights, x, y, lr=0.1, allowance=np.full(3, 1e-3))
    >>> total.shape, charged
    ((6,), array([0.001, 0.001, 0.001]))
    """

    def __init__(self, model: nn.Module, loss_fn: Callable):
        reason = supported(model)
        if reason is not None:
            raise ValueError(f"the fast mode cannot handle this model: {reason}.")
        self.model, self.loss_fn = model, loss_fn
        self.names = [n for n, _ in model.named_parameters()]
        self.layers = [
            m
            for m in model.modules()
            if isinstance(m, (nn.Linear, nn.Conv2d)) and any(True for _ in m.parameters(recurse=False))
        ]
        self._seen: list[tuple[nn.Module, torch.Tensor, torch.Tensor]] = []
        for m in self.layers:
            m.register_forward_hook(self._record)
        self._on = False
        self._buffers: dict = {}
        self._audited = False

    @torch.no_grad()
    def _audit(self, x: torch.Tensor) -> None:
        """Once: changing one example must leave every other example's output as it was. Layers
        without parameters are not checked by ``supported``, and one that mixes a batch (batch
        statistics, say) would make a client's gradient depend on other clients' data."""
        self._audited = True
        if len(x) < 2:
            return
        base = self.model(x[:2])
        other = x[:2].clone()
        other[1] = other[1] * -3.0 + 1.0
        if not torch.allclose(self.model(other)[0], base[0], rtol=1e-5, atol=1e-6):
            raise ValueError(
                "the fast mode needs each example's output to depend on that example alone; "
                "this model mixes the examples of a batch."
            )

    def _buffer(self, key, shape, fill_last: bool = False, zero: bool = False) -> torch.Tensor:
        buf = self._buffers.get(key)
        if buf is None or tuple(buf.shape) != tuple(shape):
            buf = self._buffers[key] = torch.zeros(shape) if zero else torch.empty(shape)
            if fill_last:
                buf[..., -1] = 1.0  # the bias column: G_i's last column is the per-example bias gradient
        return buf

    def _record(self, module, inputs, output):
        if self._on:
            self._seen.append((module, inputs[0].detach(), output))

    def _forward(self, weights, x, y):
        with torch.no_grad():
            for p, w in zip(self.model.parameters(), weights):
                p.copy_(torch.from_numpy(w))
        if not self._audited:
            self._audit(x)
        self._seen, self._on = [], True
        try:
            out = self.model(x)
        finally:
            self._on = False
        if len(self._seen) != len(self.layers) or len({id(m) for m, _, _ in self._seen}) != len(self.layers):
            raise ValueError("the fast mode needs every Linear/Conv2d layer applied exactly once per forward pass.")
        loss = self.loss_fn(out, y, reduction="sum")  # sum of the per-example losses
        grads = torch.autograd.grad(loss, [o for _, _, o in self._seen])
        return [(m, a, g.detach()) for (m, a, _), g in zip(self._seen, grads)]

    def __call__(
        self,
        weights: list[np.ndarray],
        x: torch.Tensor,
        y: torch.Tensor,
        *,
        lr: float,
        allowance: np.ndarray,
        keep: np.ndarray | None = None,
    ) -> tuple[np.ndarray, np.ndarray]:
        """``(sum, charged)``: the flat sum (``state_dict`` order, float64) of every client's
        clipped update ``w_i G_i`` (with ``keep``, of the kept clients' only: devices that sample
        themselves), and each client's charged norm (0 for a non-finite one), whatever ``keep``."""
        parts = self._per_layer(weights, x, y)
        w32, charged = clip_coefficients(self._norms(parts, lr), allowance, lr)
        if keep is not None:
            w32 = w32 * torch.as_tensor(np.asarray(keep, dtype=np.float32))
        return self._sum(parts, w32, charged.isnan()).numpy(), torch.nan_to_num(charged, nan=0.0).numpy()

    def norms(self, weights: list[np.ndarray], x: torch.Tensor, y: torch.Tensor, *, lr: float) -> np.ndarray:
        """Certified upper bounds on ``||-lr G_i||`` (inf for a non-finite gradient).

        Parameters
        ----------
        weights : list of numpy.ndarray
            The model's arrays.
        x, y : torch.Tensor
            One example per client.
        lr : float
            The step.

        Returns
        -------
        numpy.ndarray
            One bound per client.

        Examples
        --------
        >>> import torch
        >>> model = torch.nn.Sequential(torch.nn.Linear(2, 2))
        >>> fast = LayerwiseClippedSum(model, torch.nn.functional.cross_entropy)
        >>> weights = [v.detach().numpy().copy() for v in model.state_dict().values()]
        >>> norms = fast.norms(weights, torch.eye(2), torch.tensor([0, 1]), lr=0.1)
        >>> norms.shape, bool((norms > 0).all())
        ((2,), True)
        """
        return self._norms(self._per_layer(weights, x, y), lr).numpy()

    def terms(self, weights: list[np.ndarray], x: torch.Tensor, y: torch.Tensor) -> list[tuple]:
        """For tests: per parameter (``state_dict`` order), what each example's gradient ``G_i`` is
        made of: ``("outer", g, a)`` (exactly ``g_i a_i^T``) or ``("array", G)`` (its float32 rows).

        Parameters
        ----------
        weights : list of numpy.ndarray
            The model's arrays.
        x, y : torch.Tensor
            One example per client.

        Returns
        -------
        list of tuple

        Examples
        --------
        >>> import torch
        >>> model = torch.nn.Sequential(torch.nn.Linear(2, 2))
        >>> fast = LayerwiseClippedSum(model, torch.nn.functional.cross_entropy)
        >>> weights = [v.detach().numpy().copy() for v in model.state_dict().values()]
        >>> [t[0] for t in fast.terms(weights, torch.eye(2), torch.tensor([0, 1]))]
        ['outer', 'array']
        """
        out: list[tuple] = []
        for m, _, _, kind, data in self._per_layer(weights, x, y):
            if kind == "outer":
                a, g = data
                out.append(("outer", g.numpy().copy(), a.numpy().copy()))
                if m.bias is not None:
                    out.append(("array", g.numpy().copy()))
                continue
            if kind == "dense":
                out += [("array", t.reshape(len(t), -1).numpy().copy()) for t in data]
                continue
            gw = data[0]  # "bmm": (B, out, in [+ 1 bias column])
            d = gw.shape[2] - (m.bias is not None)
            out.append(("array", gw[:, :, :d].reshape(len(gw), -1).numpy().copy()))
            if m.bias is not None:
                out.append(("array", gw[:, :, d].numpy().copy()))
        return out

    def _norms(self, parts, lr: float) -> torch.Tensor:
        # ||G_i||^2 <= sum over pieces of their upper bounds (float64 sum of L terms).
        pieces = [s for _, sw, sb, _, _ in parts for s in (sw, sb) if s is not None]
        total = _up(torch.stack(pieces).sum(0), 4 * len(pieces))
        norm = _up(_up(torch.sqrt(total), 4) * abs(float(lr)), 4)  # ||-lr G_i|| = lr ||G_i||
        return torch.where(torch.isfinite(norm), norm, torch.full_like(norm, float("inf")))

    def _sum(self, parts, w32, bad) -> torch.Tensor:
        """The chunk's sum of the terms ``w32_i G_i``: float32 GEMM/GEMV over the chunk (the
        aggregator's rounding, as in any DP-SGD library), returned in float64."""
        B = len(w32)
        out = {}
        for m, _, _, kind, data in parts:
            if bad.any():  # their rows may hold NaN/inf, and 0 * NaN is NaN: zero them (copies:
                # a first layer's input is a view of the engine's data)
                data = tuple(torch.where(bad.view(-1, *[1] * (t.dim() - 1)), 0.0, t) for t in data)
            if kind == "outer":
                a, g = data
                out[m.weight] = (g * w32[:, None]).T @ a  # book-keeping: no per-example gradient
                if m.bias is not None:
                    out[m.bias] = w32 @ g
            elif kind == "dense":
                out[m.weight] = w32 @ data[0].reshape(B, -1)
                if m.bias is not None:
                    out[m.bias] = w32 @ data[1]
            else:  # "bmm": the bias gradient is the last column
                gw = data[0]
                both = (w32 @ gw.reshape(B, -1)).reshape(gw.shape[1], gw.shape[2])
                d = gw.shape[2] - (m.bias is not None)
                out[m.weight] = both[:, :d]
                if m.bias is not None:
                    out[m.bias] = both[:, d]
        return torch.cat([out[p].reshape(-1) for p in self.model.parameters()]).to(torch.float64)

    def _per_layer(self, weights, x, y) -> list[LayerPart]:
        """Per layer: (module, weight and bias squared-norm bounds, kind, float32 arrays)."""
        parts: list[LayerPart] = []
        for m, a, g in self._forward(weights, x, y):
            B = a.shape[0]
            if isinstance(m, nn.Linear) and a.dim() == 2:
                sg = _sq_rows32(g)
                sw = _up(_sq_rows32(a) * sg, 4)  # ||g a^T||^2 = ||g||^2 ||a||^2 exactly, in reals
                parts.append((m, sw, sg if m.bias is not None else None, "outer", (a, g)))
                continue
            bias = m.bias is not None
            if isinstance(m, nn.Conv2d):
                # Per-example weight gradients as one grouped convolution backward (group i: example
                # i's input and output gradient only): mkldnn, faster here than im2col + bmm.
                C, H, W = a.shape[1:]
                out_c = m.out_channels
                shape = (B * out_c, C, *m.kernel_size)
                gw = torch.ops.aten.convolution_backward(
                    g.reshape(1, B * out_c, *g.shape[2:]),
                    a.reshape(1, B * C, H, W),
                    self._buffer((id(m), "w"), shape, zero=True),
                    None,
                    m.stride,
                    m.padding,
                    m.dilation,
                    False,
                    (0, 0),
                    B,
                    (False, True, False),
                )[1].reshape(B, out_c, -1)
                gb = g.sum((2, 3)) if bias else None
                sq = torch.mul(gw, gw, out=self._buffer((id(m), "sq"), gw.shape))
                parts.append(
                    (
                        m,
                        _sq_rows32(gw.reshape(B, -1), squares=sq.reshape(B, -1)),
                        _sq_rows32(gb) if gb is not None else None,
                        "dense",
                        (gw, gb) if gb is not None else (gw,),
                    )
                )
                continue
            # Linear over extra axes (positions T): per-example (out, in) gradients by one bmm, with a
            # column of ones in the input whose product is the per-example bias gradient.
            src = a.reshape(B, -1, a.shape[-1])  # (B, T, in)
            gg = g.reshape(B, -1, g.shape[-1]).transpose(1, 2)  # (B, out, T)
            T, D = src.shape[1:]
            cols = self._buffer((id(m), "cols"), (B, T, D + bias), fill_last=bias)
            cols[:, :, :D].copy_(src)
            gw = torch.bmm(gg, cols)  # (B, out, in [+ 1])
            parts.append((m, _sq_rows32(gw.reshape(B, -1)), None, "bmm", (gw,)))
        return parts
