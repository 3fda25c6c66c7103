"""The engine's fast mode (``norms="fast"``, ``fedfilter.simulations.engine.layerwise``) against independent
references: exact rational arithmetic, the device's ``certified_norm``, per-example torch.func
gradients, and the other norm modes of the engine."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest
import torch
from torch import nn
from torch.nn import functional as F

from fedfilter.client.mechanisms.gaussian import certified_norm
from fedfilter.simulations.engine import Engine, EngineConfig, run_engine
from fedfilter.simulations.engine.layerwise import LayerwiseClippedSum, _sq_rows32, clip_coefficients, supported
from fedfilter.simulations.engine.norms import certified_row_norms, clip_rows
from fedfilter.simulations.engine.updates import PerExampleGradients
from fedfilter.simulations.tasks.models import CharLSTM, MnistCNN
from fedfilter.simulations.tasks.registry import load_task
from fedfilter.simulations.tasks.training import get_weights


def tiny_model() -> nn.Module:
    """Every layer kind the fast mode handles: padded strided conv, conv without bias, a Linear over
    an extra axis, and a plain Linear."""

    class Tiny(nn.Module):
        def __init__(self):
            super().__init__()
            self.c1 = nn.Conv2d(1, 3, 3, stride=2, padding=1)
            self.c2 = nn.Conv2d(3, 2, 2, bias=False)
            self.seq = nn.Linear(2, 4)
            self.out = nn.Linear(8, 3)

        def forward(self, x):
            h = torch.tanh(self.c2(torch.relu(self.c1(x))))  # (B, 2, 2, 2)
            h = torch.tanh(self.seq(h.flatten(2).transpose(1, 2)))  # Linear over positions: (B, 4, 4)
            return self.out(h[:, :2].flatten(1))

    torch.manual_seed(3)
    return Tiny()


def exact_terms(terms, i: int) -> list[list[Fraction]]:
    """Client i's gradient pieces as exact rationals (outer products multiplied out exactly)."""
    out = []
    for t in terms:
        if t[0] == "outer":
            g, a = t[1][i], t[2][i]
            out.append([Fraction(float(gj)) * Fraction(float(ak)) for gj in g for ak in a])
        else:
            out.append([Fraction(float(v)) for v in np.ravel(t[1][i])])
    return out


def test_fast_norms_and_sum_against_exact_rational_arithmetic():
    model = tiny_model()
    weights = get_weights(model)
    rng = np.random.default_rng(0)
    x = torch.from_numpy(rng.standard_normal((6, 1, 6, 6)).astype(np.float32))
    y = torch.from_numpy(rng.integers(0, 3, 6))
    x[5] = 0.0  # an example whose conv layers see zeros (still a non-zero gradient through biases)
    fast = LayerwiseClippedSum(model, F.cross_entropy)
    lr = 0.3
    terms = fast.terms(weights, x, y)
    norms = fast.norms(weights, x, y, lr=lr)
    exact_sq = []
    for i in range(6):
        sq = sum(v * v for piece in exact_terms(terms, i) for v in piece) * Fraction(lr) ** 2
        exact_sq.append(sq)
        assert Fraction(norms[i]) ** 2 >= sq  # certified: never below the exact norm
        assert float(Fraction(norms[i]) ** 2 / sq) - 1 < 1e-5  # and tight (float32 blocks: ~2e-6)

    # Half the clients clipped: each client's term w32_i G_i is within its charge, exactly.
    allowance = np.sqrt(np.array([float(s) for s in exact_sq])) * np.array([2, 0.5, 1, 0.25, 3, 0.9])
    w32, charged = clip_coefficients(torch.from_numpy(norms), allowance, lr)
    total, charged_engine = fast(weights, x, y, lr=lr, allowance=allowance)
    assert np.array_equal(charged.numpy(), charged_engine)
    assert np.all(charged_engine <= allowance)
    exact_sum = None
    for i in range(6):
        pieces = exact_terms(terms, i)
        scaled = [Fraction(float(w32[i])) * v for piece in pieces for v in piece]
        assert sum(v * v for v in scaled) <= Fraction(float(charged_engine[i])) ** 2
        exact_sum = scaled if exact_sum is None else [s + v for s, v in zip(exact_sum, scaled)]
    # The released sum is the exact sum of the terms up to the aggregator's float rounding. The
    # order of the flat vector is the state_dict's: re-assemble the exact sum in that order.
    flat_exact, k = [], 0
    for t in terms:
        size = (t[1].shape[1] * t[2].shape[1]) if t[0] == "outer" else int(np.prod(t[1].shape[1:]))
        flat_exact.append(exact_sum[k : k + size])
        k += size
    # outer terms are (out, in) = g a^T: the same row-major order as the weight.
    ref = np.array([float(v) for piece in flat_exact for v in piece])
    scale = np.abs(ref).max()
    assert np.max(np.abs(total - ref)) <= 1e-6 * scale


def test_float32_block_squares_are_certified_on_rows_that_round_down():
    """Rows built so that every float32 square rounds down (x = 1 + k 2**-23, k < 2048, drops
    k^2 2**-46), that underflow entirely, or are exactly zero: the bound covers the exact sum."""
    k = np.arange(1, 2049, dtype=np.float64)
    rows = np.stack([1 + k * 2.0**-23, (1 + k * 2.0**-23) * 2.0**-70, np.full(2048, 1e-30), np.zeros(2048)]).astype(
        np.float32
    )
    bound = _sq_rows32(torch.from_numpy(rows)).numpy()
    for row, b in zip(rows, bound):
        exact = sum(Fraction(float(v)) ** 2 for v in row)
        assert Fraction(float(b)) >= exact
        if exact > 0:
            assert (
                float(Fraction(float(b)) / exact) - 1 < 2e-6 or exact < Fraction(2) ** -100
            )  # underflow: absolute bound
    assert bound[3] == 0.0 and bound[2] > 0.0


def test_fast_sum_of_the_kept_clients_charges_every_client_alike():
    """Devices that sample themselves: the sum holds only the kept clients' clipped updates (as if the
    dropped ones had no allowance), the charged norms are every client's whatever its coin."""
    model = tiny_model()
    weights = get_weights(model)
    x = torch.from_numpy(np.random.default_rng(2).standard_normal((6, 1, 6, 6)).astype(np.float32))
    y = torch.arange(6) % 3
    fast = LayerwiseClippedSum(model, F.cross_entropy)
    allowance, keep = np.full(6, 0.05), np.array([1, 0, 1, 1, 0, 0], dtype=bool)
    total, charged = fast(weights, x, y, lr=1.0, allowance=allowance, keep=keep)
    all_total, all_charged = fast(weights, x, y, lr=1.0, allowance=allowance)
    kept_total, _ = fast(weights, x, y, lr=1.0, allowance=np.where(keep, allowance, 0.0))
    assert np.array_equal(charged, all_charged) and np.all(charged > 0)
    np.testing.assert_allclose(total, kept_total, rtol=1e-6, atol=1e-9)
    assert not np.allclose(total, all_total)


def test_fast_norms_against_the_devices_certified_norm():
    """On the very arrays the fast mode defines as each client's gradient, both are upper bounds on
    the same exact norm; they agree within the fast mode's float32-block slack (about 1e-6)."""
    model = tiny_model()
    weights = get_weights(model)
    x = torch.from_numpy(np.random.default_rng(1).standard_normal((8, 1, 6, 6)).astype(np.float32))
    y = torch.arange(8) % 3
    fast = LayerwiseClippedSum(model, F.cross_entropy)
    terms = fast.terms(weights, x, y)
    norms = fast.norms(weights, x, y, lr=1.0)
    for i in range(8):
        arrays = [
            np.outer(t[1][i].astype(np.float64), t[2][i]) if t[0] == "outer" else np.asarray(t[1][i]) for t in terms
        ]
        device = certified_norm(arrays)  # float64 outer products: exact up to one rounding each
        assert abs(norms[i] / device - 1) < 4e-6


def test_fast_mode_matches_per_example_torch_func_on_mnist(mnist_small):
    x, y = mnist_small
    torch.manual_seed(0)
    model = MnistCNN("relu")
    weights = get_weights(model)
    u = PerExampleGradients(MnistCNN("relu"), F.cross_entropy)(weights, x, y, lr=1.0)
    fast = LayerwiseClippedSum(model, F.cross_entropy)
    reference = certified_row_norms(u)
    norms = fast.norms(weights, x, y, lr=1.0)
    np.testing.assert_allclose(norms, reference, rtol=2e-5)  # two float32 computations of G_i
    allowance = np.median(reference) * np.ones(len(y))  # about half clipped
    total, charged = fast(weights, x, y, lr=1.0, allowance=allowance)
    assert np.all(charged <= allowance) and (charged == allowance).sum() >= len(y) // 3
    clipped = u.copy()
    clip_rows(clipped, allowance)
    ref = clipped.sum(axis=0, dtype=np.float64)
    assert np.abs(total - ref).max() <= 2e-5 * np.abs(ref).max()


@pytest.fixture(scope="module")
def mnist_small():
    from fedfilter.simulations.tasks.mnist import load_mnist

    x, y, _, _ = load_mnist()
    return torch.from_numpy(np.array(x[:96])), torch.from_numpy(y[:96].astype(np.int64))


def test_a_non_finite_gradient_is_released_as_zero_and_costs_nothing():
    model = tiny_model()
    weights = get_weights(model)
    x = torch.from_numpy(np.random.default_rng(2).standard_normal((4, 1, 6, 6)).astype(np.float32))
    y = torch.tensor([0, 1, 2, 0])
    fast = LayerwiseClippedSum(model, F.cross_entropy)
    base, base_charged = fast(weights, x[:3], y[:3], lr=1.0, allowance=np.full(3, 1e9))
    x[3, 0, 2, 2] = float("nan")
    total, charged = fast(weights, x, y, lr=1.0, allowance=np.full(4, 1e9))
    assert charged[3] == 0.0 and np.array_equal(charged[:3], base_charged)
    assert np.all(np.isfinite(total))
    np.testing.assert_allclose(total, base, rtol=1e-6, atol=1e-7)


def test_unsupported_layers_are_named_and_the_engine_falls_back():
    assert "Embedding" in supported(CharLSTM()) or "LSTM" in supported(CharLSTM())
    assert supported(MnistCNN("relu")) is None
    # multi-example clients: local SGD updates are materialised; fast falls back to vectorised norms
    digits = load_task("digits", num_clients=6)
    base = dict(
        task="digits",
        num_clients=6,
        noise_multiplier=2.0,
        clip=0.5,
        rounds=2,
        local_epochs=1,
        group_by="none",
        torch_threads=1,
        noise_draw="aggregate",
        epsilon=0.5,
    )
    fast = run_engine(EngineConfig(**base, norms="fast"), task=digits)
    vect = run_engine(EngineConfig(**base, norms="vectorised"), task=digits)
    assert fast.state.tobytes() == vect.state.tobytes()
    assert Engine(EngineConfig(**base, norms="fast"), task=digits).fast_fallback


def test_a_model_that_mixes_the_batch_is_refused():
    class Centred(nn.Module):  # no parameter of its own: supported() cannot see it
        def forward(self, x):
            return x - x.mean(0, keepdim=True)

    model = nn.Sequential(nn.Flatten(), Centred(), nn.Linear(36, 3))
    assert supported(model) is None
    fast = LayerwiseClippedSum(model, F.cross_entropy)
    x = torch.randn(4, 1, 6, 6)
    with pytest.raises(ValueError, match="mixes the examples"):
        fast(get_weights(model), x, torch.tensor([0, 1, 2, 0]), lr=1.0, allowance=np.ones(4))


def test_fast_mode_needs_the_aggregate_noise_draw():
    with pytest.raises(ValueError, match="noise_draw='aggregate'"):
        EngineConfig(norms="fast", noise_draw="per-client")


def test_a_fast_run_is_bitwise_repeatable_with_two_threads():
    """Reproducibility: the same config (seed, thread count) gives bitwise the same run."""
    from dataclasses import replace

    from fedfilter.simulations.reproduce.mnist_gd import mnist_task, setting
    from fedfilter.simulations.reproduce.private_gd import engine_config

    task = mnist_task(300)
    cfg = replace(
        engine_config(setting(0.3, "tuned", "paper"), n=300, seed=1, chunk_size=128, norms="fast"), torch_threads=2
    )
    before = torch.get_num_threads()
    try:
        runs = []
        for _ in range(2):
            engine = Engine(cfg, task=task)
            for _ in range(2):
                engine.step()
            runs.append((np.concatenate([w.ravel() for w in engine.weights]), engine.state.copy()))
    finally:
        torch.set_num_threads(before)
    assert runs[0][0].tobytes() == runs[1][0].tobytes() and runs[0][1].tobytes() == runs[1][1].tobytes()
