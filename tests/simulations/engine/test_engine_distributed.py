"""The engine's distributed placement: Skellam noise on the SecAgg+ grid, the rdp filter, the release rule."""

from __future__ import annotations

import math

import numpy as np
import pytest

from fedfilter.client.mechanisms.skellam_noise import add_skellam_noise
from fedfilter.privacy.filters import make_filter
from fedfilter.protocol.rules import model_step
from fedfilter.protocol.secagg.grid import grid_step, quantization_range
from fedfilter.simulations.engine import Engine, EngineConfig, run_engine
from fedfilter.simulations.engine.seeds import client_noise_stream
from fedfilter.simulations.engine.skellam_round import SkellamRound, wrap_centred
from fedfilter.simulations.study.config import StudyConfigError, parse_study
from fedfilter.simulations.tasks.registry import load_task

N = 10
# At z = 3 a full-clip round costs rho = 1/18; digits updates are about C (lr 0.5, C = 0.1). 1e-4: spent
# before the first round.
EPS = [0.5, 1.0, 1.5, 2.0, 3.0, 1e-4, 1.0, 1.5, 1e-4, 8.0]


@pytest.fixture(scope="module")
def digits():
    return load_task("digits", num_clients=N)


def config(**kw) -> EngineConfig:
    base = dict(
        task="digits",
        num_clients=N,
        filter_kind="rdp",
        placement="distributed",
        worst_case_epsilon=1000.0,  # does not bind: these tests are about the main account
        min_reports=4,
        noise_multiplier=3.0,
        clip=0.1,
        rounds=4,
        local_epochs=1,
        lr=0.5,
        group_by="none",
        torch_threads=1,
        noise_draw="aggregate",
        eval_every=100,
    )
    return EngineConfig(**{**base, **kw})


@pytest.mark.parametrize("kind", ["gdp", "zcdp"])
def test_distributed_needs_the_rdp_filter(kind):
    with pytest.raises(ValueError, match=f"filter_kind must be 'rdp'. Found '{kind}'"):
        config(filter_kind=kind)


def test_central_placement_needs_one_aggregate_draw():
    with pytest.raises(ValueError, match="noise_draw='aggregate'. Found noise_draw='per-client'"):
        config(placement="central", filter_kind="gdp", noise_draw="per-client")


def test_study_refuses_distributed_runs_under_another_filter():
    text = """
[study]
rounds = 2
filter = "zcdp"
[federation]
min_reports = 2
worst_case_factor = 2.0
[sweep]
budget_level = [1.0]
heterogeneity = ["f"]
noise = ["local", "distributed"]
data = ["d"]
[heterogeneity.f]
distribution = "fixed"
[data.d]
task = "digits"
num_clients = 10
"""
    with pytest.raises(StudyConfigError, match="study.filter must be 'rdp' when sweep.noise includes 'distributed'"):
        parse_study(text)
    parse_study(text.replace('"zcdp"', '"rdp"'))  # the same study under rdp is fine


def test_round_numbers_carry_at_least_the_accounted_noise():
    for z, clip, m in [(1.0, 0.5, 4), (0.7, 3.0, 10), (2.0, 1e-3, 1)]:
        p = SkellamRound.from_request(z, clip, m, 20, make_filter("rdp", 1.0, 1e-5))
        assert p.gamma == grid_step(clip) and p.q == quantization_range(20)
        assert p.mu_total <= (z * clip / p.gamma) ** 2  # rounded down: never more noise than there is
        assert p.mu_total > (z * clip / p.gamma) ** 2 * (1 - 1e-12)
        assert p.mu_share * m >= p.mu_total  # m shares carry at least mu_total


@pytest.mark.parametrize("norms", ["device", "vectorised"])
@pytest.mark.parametrize("draw", ["aggregate", "per-client"])
def test_no_client_spends_beyond_its_budget(digits, norms, draw):
    result = run_engine(config(epsilon=EPS, norms=norms, noise_draw=draw, rounds=5), task=digits)
    for k in range(N):
        filt = make_filter("rdp", EPS[k], 1e-5)
        assert filt.within_budget(result.state[k]) and filt.within_budget(result.run_state[k])
        assert result.spent_epsilon[k] <= EPS[k]
    # Budgets bind: the small ones are used up. (Snapping toward zero shrinks a small clipped update
    # to few or no grid steps, so a nearly spent client keeps a sliver above exhausted_below * C.)
    assert (result.spent_fraction > 0.99).sum() >= 6, result.spent_fraction
    assert result.exhausted_round.tolist().count(1) == 2  # the 1e-4 budgets: spent from round 1
    assert result.state[[5, 8], 0].tolist() == [0.0, 0.0] and (np.delete(result.state[:, 0], [5, 8]) > 0).all()


def test_fast_norms_fall_back_with_a_reason_and_match_vectorised(digits):
    fast = Engine(config(epsilon=EPS, norms="fast"), task=digits)
    assert "distributed placement" in fast.fast_fallback
    vec = Engine(config(epsilon=EPS, norms="vectorised"), task=digits)
    for _ in range(3):
        fast.step(), vec.step()
    assert fast.state.tobytes() == vec.state.tobytes()
    assert all(np.array_equal(a, b) for a, b in zip(fast.weights, vec.weights))


def test_leave_clients_stop_reporting_and_rounds_below_min_reports_are_not_released(digits):
    # Clients 0-4 are spent from round 1 (0-2 leave, 3-4 send noise); 6 of 10 are asked per round.
    eps = [1e-4] * 5 + [4.0] * 5
    after = ["leave"] * 3 + ["noise-only"] * 7
    engine = Engine(config(epsilon=eps, after_exhaustion=after, min_reports=5, rounds=8, fraction=0.6), task=digits)
    released, left = [], 0
    for _ in range(8):
        before = [w.copy() for w in engine.weights]
        state = engine.state.copy()
        r = engine.step()
        assert r.reports_seen == r.contributing + r.noise_only and r.sampled == r.reports_seen + r.left == 6
        assert r.released == (r.reports_seen >= 5)
        unchanged = all(np.array_equal(a, b) for a, b in zip(before, engine.weights))
        assert unchanged == (not r.released)
        assert np.array_equal(engine.state[:5], state[:5])  # spent clients pay nothing
        released.append(r.released)
        left += r.left
    assert (engine.exhausted_round[:5] > 0).all() and (engine.exhausted_round[5:] < 0).all()
    assert True in released and False in released, "the release rule went untested"
    assert left > 0, "no spent leave client was asked"


def test_clients_whose_worst_case_account_binds_leave_with_most_of_their_budget(digits):
    # Worst-case budgets equal to the main ones (m = 4): the share read alone binds first. The digits
    # updates (2410 coordinates) are diffuse: clipped to a few grid steps they snap to zero, so before
    # the one exhaustion rule had its floor (spend.nothing_left) these clients "contributed" nothing
    # for ever, a few steps above the threshold, and never left.
    eps = [0.5, 1.0, 1.5, 2.0, 3.0] * 2
    engine = Engine(config(epsilon=eps, worst_case_epsilon=eps, after_exhaustion="leave", rounds=8), task=digits)
    records = [engine.step() for _ in range(8)]
    result = engine.result()
    assert (result.exhausted_round > 0).all()
    assert (result.spent_fraction < 0.5).all()  # the main accounts are far from spent
    assert records[-1].left == N and records[-1].reports_seen == 0 and not records[-1].released
    # Each client's allowance, now, is below the floor (or the owner's threshold): the device's rule.
    p = engine._distributed
    left_allowance = p.l2_allowance(np.arange(N)) * p.grid.gamma
    floor = p.mechanism.floor
    assert np.all((left_allowance < floor) | (left_allowance <= engine.config.exhausted_below * engine.config.clip))
    assert floor == math.sqrt(engine.layout.dim) * p.grid.gamma


@pytest.mark.parametrize("draw", ["per-client", "aggregate"])
def test_pure_noise_round_has_the_skellam_sum_std(digits, draw):
    # Every client is spent from round 1 (tiny budget) and reports its share alone: the mean is the
    # wrapped sum of N shares Sk(mu_share) times gamma / N, std sqrt(N mu_share) gamma / N.
    z, c, m = 3.0, 0.5, 5
    cfg = config(epsilon=1e-4, noise_multiplier=z, clip=c, min_reports=m, noise_draw=draw, rounds=1)
    engine = Engine(cfg, task=digits)
    weights0 = [w.copy() for w in engine.weights]
    before = np.concatenate([w.ravel() for w in engine.weights]).astype(np.float64)
    record = engine.step()
    assert record.contributing == 0 and record.reports_seen == N and record.released
    after = np.concatenate([w.ravel() for w in engine.weights]).astype(np.float64)
    p = SkellamRound.from_request(z, c, m, N, make_filter("rdp", 1e-4, 1e-5))  # the round's public numbers
    expected = math.sqrt(N * p.mu_share) * p.gamma / N
    assert abs(np.std(after - before) / expected - 1) < 0.06  # ~6,000 coordinates
    if draw == "per-client":
        # The integer sum is the sum of every client's own share, drawn from its device's stream.
        total = np.zeros(engine.layout.dim, dtype=np.int64)
        for k in range(N):
            zeros = [np.zeros(w.shape, dtype=np.int64) for w in weights0]  # a spent device's k
            y = add_skellam_noise(zeros, p.mu_share, client_noise_stream(engine.config.seed, k, "engine", 1))
            total += np.concatenate([a.ravel() for a in y])
        mean = wrap_centred(total, quantization_range(N)).astype(np.float64) * p.gamma / N
        want = model_step(weights0, engine.layout.views(mean), 1.0)
        assert all(np.array_equal(a, b) for a, b in zip(want, engine.weights))


def test_wrap_centred_is_the_sum_mod_q_centred():
    q = 16
    total = np.array([-9, -8, -1, 0, 7, 8, 23, -25], dtype=np.int64)
    assert wrap_centred(total, q).tolist() == [7, -8, -1, 0, 7, -8, 7, 7]


def test_a_round_a_device_would_refuse_is_refused_up_front(digits):
    # The noise of the sum of 10 reports must fit SecAgg+'s range (the device's skellam_grid): z = 2**20
    # gives a share of about 2**66 grid steps squared, beyond the sampler and the range.
    with pytest.raises(ValueError, match="noise_multiplier=1048576.0"):
        Engine(config(noise_multiplier=2.0**20), task=digits)


def test_an_aggregate_draw_beyond_the_samplers_cap_is_split_into_exact_parts(monkeypatch):
    import fedfilter.simulations.engine.skellam_round as sr
    from fedfilter.client.mechanisms import skellam_noise
    from fedfilter.client.mechanisms.gaussian_noise import NoiseStream

    # A sampler capped at 100 (it refuses more) still gives the sum of 7 shares of 30 its variance 210.
    monkeypatch.setattr(skellam_noise, "MAX_MU_SHARE", 100.0)
    monkeypatch.setattr(sr, "MAX_MU_SHARE", 100.0)
    with pytest.raises(ValueError, match="<= 2"):
        skellam_noise.skellam_noise(210.0, 10, NoiseStream.from_seed("t"))
    x = sr.aggregate_skellam(7, 30.0, 20_000, NoiseStream.from_seed("t"))
    assert abs(x.var() / 210.0 - 1) < 0.05 and abs(x.mean()) < 0.5


def test_a_single_report_is_never_released_since_secagg_needs_two(digits):
    # min_reports = 1: Flower's SecAgg+ threshold is still 2 (it reads 1 as "all shares").
    engine = Engine(config(epsilon=[4.0] + [1e-4] * 9, after_exhaustion="leave", min_reports=1, rounds=1), task=digits)
    r = engine.step()
    assert r.reports_seen == 1 and not r.released


def test_study_needs_a_worst_case_factor_for_distributed_runs():
    text = """
[study]
rounds = 2
filter = "rdp"
[federation]
min_reports = 2
[sweep]
budget_level = [1.0]
heterogeneity = ["f"]
noise = ["distributed"]
data = ["d"]
[heterogeneity.f]
distribution = "fixed"
[data.d]
task = "digits"
num_clients = 10
"""
    with pytest.raises(StudyConfigError, match="federation.worst_case_factor must be a number >= 1"):
        parse_study(text)
    with pytest.raises(ValueError, match="needs worst_case_epsilon"):
        config(epsilon=1.0, worst_case_epsilon=None)
    with pytest.raises(ValueError, match="worst_case_epsilon must be at least epsilon"):
        config(epsilon=[1.0] * N, worst_case_epsilon=0.5)
