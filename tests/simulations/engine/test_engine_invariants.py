"""Invariants of the vectorised engine on tiny federations (digits, 10 clients, a few rounds)."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest

from fedfilter.client.mechanisms.gaussian import certified_norm
from fedfilter.privacy.filters import make_filter
from fedfilter.simulations.engine import Engine, EngineConfig, run_engine
from fedfilter.simulations.engine.norms import certified_row_norms, clip_rows
from fedfilter.simulations.tasks.registry import load_task

N = 10


@pytest.fixture(scope="module")
def digits():
    return load_task("digits", num_clients=N)


def config(**kw) -> EngineConfig:
    base = dict(
        task="digits",
        num_clients=N,
        noise_multiplier=2.0,
        clip=0.5,
        rounds=4,
        local_epochs=1,
        lr=0.1,
        group_by="none",
        torch_threads=1,
        noise_draw="aggregate",
        eval_every=100,
    )
    return EngineConfig(**{**base, **kw})


@pytest.mark.parametrize("norms", ["device", "vectorised"])
@pytest.mark.parametrize("kind", ["gdp", "zcdp", "rdp"])
def test_no_client_spends_beyond_its_budget(digits, norms, kind):
    eps = [0.3, 0.5, 0.8, 1.0, 2.0, 0.3, 0.5, 0.8, 1.0, 4.0]
    result = run_engine(config(epsilon=eps, filter_kind=kind, norms=norms), task=digits)
    for k in range(N):
        filt = make_filter(kind, eps[k], 1e-5)
        assert filt.within_budget(result.state[k])
        assert result.spent_epsilon[k] <= eps[k]
        assert 0 <= result.spent_fraction[k] <= 1
    assert (result.exhausted_round > 0).sum() >= 4  # most small budgets ran out


def test_noise_only_clients_are_reports_and_leave_clients_are_not(digits):
    after = ["noise-only"] * 5 + ["leave"] * 5
    result = run_engine(config(epsilon=[0.3] * N, after_exhaustion=after), task=digits)
    last = result.rounds[-1]
    assert (result.exhausted_round > 0).all()  # every client ran out
    assert last.contributing == 0 and last.noise_only == 5 and last.left == 5
    assert last.reports_seen == 5  # the coordinator counts the noise-only reports, not the markers
    for r in result.rounds:
        assert r.reports_seen == r.contributing + r.noise_only
        assert r.sampled == r.reports_seen + r.left


@pytest.mark.parametrize("draw", ["per-client", "aggregate"])
def test_aggregate_noise_std(digits, draw):
    # A budget so small that every client is exhausted from round 1: the round's mean is pure
    # noise, sum of N reports each N(0, s^2) with s = zC, so the mean has std s / sqrt(N).
    # (Distributed placement: tests/simulations/engine/test_engine_distributed.py.)
    z, c, m = 3.0, 0.5, 1
    engine = Engine(config(epsilon=1e-4, noise_multiplier=z, clip=c, noise_draw=draw, rounds=1), task=digits)
    before = np.concatenate([w.ravel() for w in engine.weights]).astype(np.float64)
    record = engine.step()
    assert record.contributing == 0 and record.reports_seen == N and record.released
    after = np.concatenate([w.ravel() for w in engine.weights]).astype(np.float64)
    expected = z * c / math.sqrt(m) / math.sqrt(N)
    measured = np.std(after - before)
    # ~2,400 coordinates: the sample std is within 4% with probability > 0.999.
    assert abs(measured / expected - 1) < 0.06


def test_distributed_round_below_min_reports_is_dropped(digits):
    engine = Engine(
        config(
            epsilon=1e-4,
            worst_case_epsilon=1e-3,
            placement="distributed",
            filter_kind="rdp",
            min_reports=N,
            after_exhaustion="leave",
            rounds=1,
        ),
        task=digits,
    )
    before = [w.copy() for w in engine.weights]
    record = engine.step()
    assert record.reports_seen == 0 and record.left == N and not record.released
    assert all(np.array_equal(a, b) for a, b in zip(before, engine.weights))


def test_vectorised_norms_are_certified_and_clip_within_allowance():
    rng = np.random.default_rng(1)
    u = (rng.standard_normal((40, 3000)) * rng.uniform(0, 20, (40, 1))).astype(np.float32)
    u[0] = 0.0
    norms = certified_row_norms(u)
    for row, got in zip(u[:8], norms[:8]):  # exact reference: rational arithmetic
        exact2 = sum(Fraction(float(x)) ** 2 for x in row)
        assert Fraction(got) ** 2 >= exact2
    assert norms[0] == 0.0
    device = np.array([certified_norm([row]) for row in u])
    np.testing.assert_allclose(norms, device, rtol=1e-12)
    allowance = rng.uniform(0, 30, 40)
    clipped = u.copy()
    released = clip_rows(clipped, allowance)
    assert np.all(released <= allowance)
    assert np.all(certified_row_norms(clipped) <= allowance)
    kept = released < allowance * (1 - 1e-6)  # rows under their allowance are left as they were
    assert np.array_equal(clipped[kept & (norms <= allowance)], u[kept & (norms <= allowance)])


@pytest.mark.parametrize("norms", ["device", "vectorised"])
def test_non_finite_update_is_released_as_zero(digits, norms):
    # client.flower_mod: an update holding NaN or inf becomes a zero update (pure noise, no cost).
    engine = Engine(config(norms=norms, epsilon=1e6), task=digits)
    engine.weights[0][...] = np.nan  # every client's update is NaN
    record = engine.step()
    assert record.contributing == N  # each client still answers, with a zero update...
    assert not engine.state.any() and not engine.run_state.any()  # ...which costs nothing
    fine = Engine(config(norms=norms, epsilon=1e6), task=digits)
    fine.step()
    assert fine.state.all()  # (a finite update is charged)
