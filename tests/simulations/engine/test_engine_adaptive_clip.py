"""Adaptive clipping in the engine (Andrew et al., NeurIPS 2021), against independent references.

The clients' updates are replaced by rows of prescribed norms and the Gaussian draws by zeros where
a test needs it, so the clip trajectory and the charges can be computed by hand: Algorithm 1's
geometric step from the fraction of norms at most the clip, and the Gaussian-DP charge of the
augmented vector, ``mu^2 = ||clipped update||^2 / (z C)^2 + 1 / (2 sigma_b)^2`` with the update's
``z = (z_eff^-2 - (2 sigma_b)^-2)^(-1/2)`` (Section 3.1), both written out here, not read from the
engine's helpers.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
from scipy.stats import norm as normal

from fedfilter.protocol.adaptive_clip import AdaptiveClipping
from fedfilter.simulations.engine import Engine, EngineConfig, distributed_round, gaussian_round, run_engine
from fedfilter.simulations.engine.checkpoint import load_checkpoint, save_checkpoint
from fedfilter.simulations.tasks.registry import load_task

N = 10


@pytest.fixture(scope="module")
def digits():
    return load_task("digits", num_clients=N)


class _Zeros:
    def normal(self, loc, scale, size):
        return np.zeros(size)


@pytest.fixture
def noise_free(monkeypatch):
    """The engine's one aggregate Gaussian draw per round replaced by zeros (this test only)."""
    monkeypatch.setattr(gaussian_round, "aggregate_noise_rng", lambda *key: _Zeros())


def config(**kw) -> EngineConfig:
    base = dict(
        task="digits",
        num_clients=N,
        epsilon=1e4,
        noise_multiplier=1.0,
        clip=1.0,
        rounds=6,
        local_epochs=1,
        group_by="none",
        torch_threads=1,
        noise_draw="aggregate",
        eval_every=1000,
        adaptive_clipping=AdaptiveClipping(target_clipped_quantile=0.5, clip_norm_lr=0.2, clipped_count_stddev=2.0),
    )
    return EngineConfig(**{**base, **kw})


def with_norms(engine: Engine, norms: np.ndarray, seed: int = 0) -> None:
    """Client k's update in round t (1-based) becomes a fixed random direction of norm ``norms[t - 1, k]``."""
    rng = np.random.default_rng(seed)
    direction = rng.normal(size=(engine.n, engine.layout.dim))
    direction /= np.linalg.norm(direction, axis=1, keepdims=True)

    def updates(clients):
        return (direction[clients] * norms[engine.round_id - 1][clients][:, None]).astype(np.float32)

    engine._updates = updates


def andrew_trajectory(norms: np.ndarray, clip0: float, gamma: float, eta: float) -> list[float]:
    """Algorithm 1 without noise: ``C <- C exp(-eta (mean(||Delta_i|| <= C) - gamma))``."""
    clips = [clip0]
    for row in norms:
        b = float(np.mean(row <= clips[-1]))
        clips.append(clips[-1] * math.exp(-eta * (b - gamma)))
    return clips


@pytest.mark.parametrize("norms_mode", ["device", "vectorised"])
def test_noise_free_clip_trajectory_is_algorithm_1(digits, noise_free, norms_mode):
    rounds = 12
    norms = np.random.default_rng(1).uniform(0.0, 3.0, size=(rounds, N))
    engine = Engine(config(rounds=rounds, norms=norms_mode), task=digits)
    with_norms(engine, norms)
    records = [engine.step() for _ in range(rounds)]
    expected = andrew_trajectory(norms, 1.0, 0.5, 0.2)
    assert [r.clip for r in records] == pytest.approx(expected[:rounds], rel=1e-6)
    assert engine.adaptive is not None and engine.adaptive.clip == pytest.approx(expected[rounds], rel=1e-6)
    fractions = [float(np.mean(row <= c)) for row, c in zip(norms, expected)]
    assert [r.unclipped_fraction for r in records] == pytest.approx(fractions, abs=1e-6)
    assert len(set(np.round(expected, 6))) > rounds // 2  # the clip really moved


def test_clip_converges_to_the_target_quantile(digits, noise_free):
    """Norms uniform on [0, 10], gamma = 0.5: the clip settles near the median, 5."""
    n, rounds = 200, 120
    task = load_task("digits", num_clients=n)
    norms = np.random.default_rng(2).uniform(0.0, 10.0, size=(rounds, n))
    engine = Engine(config(num_clients=n, rounds=rounds, norms="vectorised"), task=task)
    with_norms(engine, norms)
    clips = [engine.step().clip for _ in range(rounds)]
    assert clips[0] == 1.0
    assert 4.5 < float(np.mean(clips[-30:])) < 5.5
    assert abs(clips[-1] - 5.0) < 0.75


def gdp_mu2(clipped_norm: float, z_eff: float, clip: float, sigma_b: float) -> float:
    """Andrew et al., Section 3.1: the update's z from z_eff, and the augmented vector's mu^2."""
    z = (z_eff**-2 - (2.0 * sigma_b) ** -2) ** -0.5
    return clipped_norm**2 / (z * clip) ** 2 + 1.0 / (2.0 * sigma_b) ** 2


def gdp_delta(eps: float, mu: float) -> float:
    """Dong, Roth & Su (2022), Corollary 2.13: the delta of mu-GDP at eps."""
    return normal.cdf(-eps / mu + mu / 2) - math.exp(eps) * normal.cdf(-eps / mu - mu / 2)


@pytest.mark.parametrize("norms_mode", ["device", "vectorised"])
def test_each_charge_is_the_augmented_vectors_and_composes(digits, norms_mode):
    rounds, sigma_b, z_eff = 3, 2.0, 1.5
    norms = np.random.default_rng(3).uniform(0.2, 2.5, size=(rounds, N))
    eps = 40.0
    cfg = config(rounds=rounds, epsilon=eps, filter_kind="gdp", noise_multiplier=z_eff, norms=norms_mode)
    engine = Engine(cfg, task=digits)
    with_norms(engine, norms)
    states = [engine.state[:, 0].copy()]
    clips = []
    for _ in range(rounds):
        clips.append(engine.step().clip)
        states.append(engine.state[:, 0].copy())
    for t in range(rounds):
        expected = np.array([gdp_mu2(min(r, clips[t]), z_eff, clips[t], sigma_b) for r in norms[t]])
        charged, under = states[t + 1] - states[t], norms[t] <= clips[t]
        assert 0 < under.sum() < N
        assert charged[under] == pytest.approx(expected[under], rel=1e-6)  # full allowance: one round each
        # clipped rows: the device's clip lands a hair below C, and the charge is at the actual norm
        assert np.all(charged[~under] <= expected[~under] * (1 + 1e-9))
        assert np.all(charged[~under] >= expected[~under] * (1 - 1e-5))
    mu = np.sqrt(states[-1])
    spent = engine.result().spent_epsilon
    for k in range(N):  # the filter's epsilon is the one of mu-GDP with the composed mu (rounded up)
        assert gdp_delta(spent[k], mu[k]) <= 1e-5 * (1 + 1e-9)
        assert gdp_delta(spent[k] * (1 - 1e-4), mu[k]) > 1e-5


def test_a_spent_client_sends_a_zero_row_its_bit_one_half_charged_nothing(digits, noise_free):
    eps = [1e-3, 1e-3, 1e-3] + [1e4] * (N - 3)  # the first three have nothing to give from round 1
    norms = np.full((2, N), 0.5)  # every update under the clip: bit 1 for those who contribute
    engine = Engine(config(rounds=2, epsilon=eps, filter_kind="gdp"), task=digits)
    with_norms(engine, norms)
    record = engine.step()
    assert record.contributing == N - 3 and record.noise_only == 3
    assert np.all(engine.state[:3] == 0.0)  # charged nothing
    # (N - 3) bits of 1, three zero rows read as 1/2 each
    assert record.unclipped_fraction == pytest.approx((N - 3 + 1.5) / N, abs=1e-6)


def test_central_bit_count_gets_flowers_noise(digits, monkeypatch):
    """Central placement: the one draw's bit coordinate is, in bits, ``N(0, sigma_b^2)`` on the count of
    unclipped updates, as in Flower's ``DifferentialPrivacyServerSideAdaptiveClipping._noisy_fraction``
    (``np.random.normal(count, clipped_count_stddev) / total``)."""
    draws = []

    class OneStdOnTheBit:
        def normal(self, loc, scale, size):
            draws.append((scale, size))
            out = np.zeros(size)
            out[-1] = scale  # one standard deviation on the bit's coordinate, none elsewhere
            return out

    monkeypatch.setattr(gaussian_round, "aggregate_noise_rng", lambda *key: OneStdOnTheBit())
    z_eff, sigma_b = 1.5, 2.0
    norms = np.random.default_rng(6).uniform(0.2, 2.0, size=(1, N))
    engine = Engine(config(placement="central", rounds=1, noise_multiplier=z_eff), task=digits)
    with_norms(engine, norms)
    record = engine.step()
    count = int((norms[0] <= 1.0).sum())
    assert 0 < count < N
    assert record.unclipped_fraction == pytest.approx((count + sigma_b) / N, rel=1e-6)  # Flower's, one std up
    z = (z_eff**-2 - (2.0 * sigma_b) ** -2) ** -0.5
    assert draws == [(pytest.approx(z * 1.0, rel=1e-12), engine.layout.dim + 1)]  # the update's noise z C


def test_local_placement_reports_carry_the_bit_and_the_noise(digits):
    """Per-client draws (each report as its device sends it): the bit's sum carries sigma_b sqrt(n)."""
    cfg = config(rounds=3, noise_draw="per-client")
    result = run_engine(cfg, task=digits)
    clips = [r.clip for r in result.rounds]
    fractions = [r.unclipped_fraction for r in result.rounds]
    assert all(f is not None for f in fractions)
    for t in range(2):  # each clip is Algorithm 1's step from the released fraction
        assert clips[t + 1] == pytest.approx(clips[t] * math.exp(-0.2 * (fractions[t] - 0.5)), rel=1e-12)


def test_distributed_placement_adapts_the_clip(digits):
    cfg = config(
        rounds=3,
        placement="distributed",
        filter_kind="rdp",
        min_reports=2,
        epsilon=50.0,
        worst_case_epsilon=100.0,
        noise_draw="per-client",
    )
    engine = Engine(cfg, task=digits)
    records = [engine.step() for _ in range(3)]
    assert all(r.released and r.contributing == N for r in records)
    for a, b in zip(records, records[1:]):
        assert b.clip == pytest.approx(a.clip * math.exp(-0.2 * (a.unclipped_fraction - 0.5)), rel=1e-12)
    # the last round's Skellam release was the augmented vector's: C_aug = C sqrt(1 + (z / (2 sigma_b))^2)
    z = (1.0 - (2.0 * 2.0) ** -2) ** -0.5
    mechanism = engine._distributed.mechanism if engine._distributed is not None else None
    assert mechanism is not None and mechanism.dim == engine.layout.dim + 1
    assert mechanism.clip == pytest.approx(records[-1].clip * math.sqrt(1 + (z / 4.0) ** 2), rel=1e-12)
    assert mechanism.sigma == pytest.approx(z * records[-1].clip, rel=1e-12)  # the update's noise z C


def test_worst_case_accounting_charges_the_augmented_full_round(digits, noise_free):
    """Every contribution charged a full round of the augmented vector: mu^2 = (C_aug / (z_eff C_aug))^2."""
    rounds, z_eff, sigma_b = 3, 1.5, 2.0
    norms = np.random.default_rng(4).uniform(0.2, 2.5, size=(rounds, N))
    engine = Engine(config(rounds=rounds, accounting="worst-case", noise_multiplier=z_eff, epsilon=40.0), task=digits)
    with_norms(engine, norms)
    clips = [engine.step().clip for _ in range(rounds)]
    assert len(set(clips)) == rounds  # the clip moved every round
    assert engine.state[:, 0] == pytest.approx(np.full(N, rounds / z_eff**2), rel=1e-9)
    z = (z_eff**-2 - (2.0 * sigma_b) ** -2) ** -0.5
    assert engine.adaptive is not None and engine.full_allowance is not None
    c_aug = engine.adaptive.clip * math.sqrt(1 + (z / (2.0 * sigma_b)) ** 2)
    assert engine.full_allowance == pytest.approx(np.full(N, c_aug), rel=1e-12)


def test_checkpoint_restores_the_clip(digits, tmp_path):
    cfg = config(rounds=4, noise_draw="per-client")
    straight = run_engine(cfg, task=digits)
    first = Engine(cfg, task=digits)
    first.step(), first.step()
    save_checkpoint(tmp_path / "c.npz", first.snapshot(), {})
    second = Engine(cfg, task=digits)
    second.restore(load_checkpoint(tmp_path / "c.npz")[0])
    second.step(), second.step()
    assert [r.clip for r in second.result().rounds] == [r.clip for r in straight.rounds]
    assert np.array_equal(second.state, straight.state)


def test_fixed_clip_records_the_configs_clip(digits):
    result = run_engine(config(adaptive_clipping=None, rounds=2, clip=0.7), task=digits)
    assert [r.clip for r in result.rounds] == [0.7, 0.7]
    assert [r.unclipped_fraction for r in result.rounds] == [None, None]


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        (dict(noise_multiplier=4.0), "noise_multiplier must be below 2 \\* clipped_count_stddev"),
        (dict(adaptive_clipping=AdaptiveClipping(clip_norm_lr=-1.0)), "adaptive_clipping.clip_norm_lr"),
        (dict(adaptive_clipping=0.5), "adaptive_clipping must be an AdaptiveClipping"),
    ],
)
def test_bad_adaptive_settings_are_refused(kw, message):
    with pytest.raises(ValueError, match=message):
        config(**kw)


def test_default_clipped_count_stddev_is_asked_over_20():
    """sigma_b = 10 asked / 20 = 0.5: z_eff = 1 would need the bit alone to cost a whole round."""
    with pytest.raises(ValueError, match="clipped_count_stddev=0.5"):
        config(adaptive_clipping=AdaptiveClipping(), noise_multiplier=1.0)
    engine = Engine(config(adaptive_clipping=AdaptiveClipping(), noise_multiplier=0.5, num_clients=40, fraction=0.5))
    assert engine.adaptive is not None and engine.adaptive.clipped_count_stddev == 1.0


def test_fast_norms_fall_back_with_adaptive_clipping(digits):
    engine = Engine(config(norms="fast"), task=digits)
    assert engine.fast_fallback is not None and "adaptive clipping" in engine.fast_fallback


def akl_rdp(l1: int, l2sq: int, mu: Fraction, order: int) -> Fraction:
    """Agarwal, Kairouz & Liu 2021 (arXiv 2110.04995) Corollary 3.6 at an integer order, exactly."""
    a = Fraction(order)
    discrete = min(((2 * a - 1) * l2sq + 6 * l1) / (4 * mu * mu), Fraction(3 * l1) / (2 * mu))
    return a * l2sq / (2 * mu) + discrete if l2sq else Fraction(0)


def akl_rdp_at(l1: int, l2sq: int, mu: Fraction, alpha: float) -> Fraction:
    """At a real order, from the integer orders around it ((a - 1) D_a is convex in a; van Erven and
    Harremoes 2014); below 2, D_2 (monotone in the order)."""
    a = Fraction(alpha)
    n = math.floor(a)
    if n < 2:
        return akl_rdp(l1, l2sq, mu, 2)
    t = a - n
    return ((1 - t) * (n - 1) * akl_rdp(l1, l2sq, mu, n) + t * n * akl_rdp(l1, l2sq, mu, n + 1)) / (a - 1)


def test_distributed_release_is_the_augmented_integer_vector(digits, monkeypatch):
    """Each Skellam release is the update clipped to C on the grid plus its bit, +-c/2 snapped toward
    zero, and is charged the Skellam RDP of that whole integer vector (computed here exactly)."""
    from fedfilter.privacy.filters import rdp_order

    rounds, z_eff, sigma_b = 3, 1.5, 2.0
    norms = np.random.default_rng(5).uniform(0.2, 2.5, size=(rounds, N))
    cfg = config(
        rounds=rounds,
        placement="distributed",
        filter_kind="rdp",
        min_reports=4,
        epsilon=20.0,  # alpha* = 2.4: the interpolation between integer orders
        worst_case_epsilon=2000.0,
        noise_multiplier=z_eff,
    )
    engine = Engine(cfg, task=digits)
    with_norms(engine, norms)
    seen: list[tuple] = []
    real = distributed_round.spend

    def recording(account, mechanism, arrays, **kwargs):
        (c,) = account.rows
        before = float(engine.state[c, 0])
        record, payload = real(account, mechanism, arrays, **kwargs)
        ints = [int(v) for a in payload.k for v in np.asarray(a).ravel()]
        seen.append((engine.round_id, int(c), ints, mechanism.grid, before, float(engine.state[c, 0])))
        return record, payload

    monkeypatch.setattr(distributed_round, "spend", recording)
    clips = [engine.step().clip for _ in range(rounds)]
    assert len(seen) == rounds * N
    z = (z_eff**-2 - (2.0 * sigma_b) ** -2) ** -0.5
    alpha = rdp_order(engine.filters[0])
    for round_id, c, ints, grid, before, after in seen:
        clip = clips[round_id - 1]
        half_c = z * clip / sigma_b / 2.0  # the bit's size, c / 2
        bit, model = ints[-1] * grid.gamma, ints[:-1]
        sign = 1.0 if norms[round_id - 1, c] <= clip else -1.0
        assert sign * bit <= half_c and sign * bit > half_c - 2 * grid.gamma  # snapped toward zero
        assert math.sqrt(sum(v * v for v in model)) * grid.gamma <= clip * (1 + 1e-9)
        l1, l2sq = sum(abs(v) for v in ints), sum(v * v for v in ints)
        cost = akl_rdp_at(l1, l2sq, Fraction(grid.mu_total), alpha) / Fraction(alpha)
        assert Fraction(after) - Fraction(before) >= cost
        assert Fraction(after) - Fraction(before) <= cost * (1 + Fraction(1, 10**9))
