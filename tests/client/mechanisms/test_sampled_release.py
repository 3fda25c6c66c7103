"""The device's own coin (``client/mechanisms/sampled.py``): what it charges, that the charge and the reply
do not depend on the coin, that a device asked as planned spends its budget and never more, and both
placements through the paths a device runs."""

from __future__ import annotations

import dataclasses
import time

import numpy as np
import pytest
from helpers.mods import Handler, context, records, spec, train_message

from fedfilter.client.filter_mod import individual_filter_mod
from fedfilter.client.ledger.budget import BudgetLedger
from fedfilter.client.mechanisms.gaussian import GaussianMechanism
from fedfilter.client.mechanisms.gaussian_noise import NoiseStream, round_noise_stream
from fedfilter.client.mechanisms.sampled import SampledMechanism, coin, self_sampling
from fedfilter.client.mechanisms.skellam import SkellamMechanism, skellam_grid
from fedfilter.client.release import FilteredClient, release
from fedfilter.client.settings.policy import ClientPolicy
from fedfilter.planning.sampled_rounds import rate_for_budget
from fedfilter.privacy.skellam import skellam_charge
from fedfilter.privacy.subsampled import sampled_gaussian_charge, sampled_skellam_charge, sampling_order
from fedfilter.protocol.request import RoundSpec, request_problems
from fedfilter.protocol.secagg.grid import secaggplus_settings
from fedfilter.protocol.wire import ARRAYS_RECORD, STATUS_RECORD, request_record, round_spec_from_record

RUN = "run-s"


def enrol(tmp_path, name="dev", *, epsilon=1.0, order=10.6, kind="rdp", worst=None) -> BudgetLedger:
    return BudgetLedger.enrol(
        tmp_path / name,
        client_id=name,
        epsilon=epsilon,
        delta=1e-5,
        filter_kind=kind,
        orders=[order] if kind == "rdp" else None,
        worst_case_epsilon=worst,
        state_dir=tmp_path / f"{name}-owner",
    )


def seeds_with_coins(rate: float, run_id: str, round_id: int) -> tuple[int, int]:
    """A noise seed whose coin keeps the update and one whose coin drops it, at ``rate``."""
    kept = dropped = None
    for seed in range(1000):
        c = coin(round_noise_stream(seed, run_id, round_id), rate)
        kept = seed if c and kept is None else kept
        dropped = seed if not c and dropped is None else dropped
        if kept is not None and dropped is not None:
            return kept, dropped
    raise AssertionError("no seeds with both coins")


def gaussian_release(ledger, request, update, *, policy=None, stream=None):
    """A local round behind the device's coin, as the mod makes it: ``(release, mechanism)``."""
    policy = policy or ClientPolicy()
    m = self_sampling(request, policy, lambda arrays: GaussianMechanism.for_request(request))(None)
    rel = release(
        ledger,
        m,
        update,
        run_id=request.run_id,
        round_id=request.round_id,
        exhausted_below=policy.exhausted_below,
        after_exhaustion=policy.after_exhaustion,
        stream=stream or NoiseStream(),
    )
    return rel, m


# --- the charge ----------------------------------------------------------------------------------
def test_the_charge_is_the_sampled_gaussian_at_the_filter_order_whatever_the_coin(tmp_path):
    asks, z = 141, 1.1
    request = RoundSpec(RUN, 0, z, 1.0, planned_asks=asks)
    first = FilteredClient(enrol(tmp_path, "a"), noise_seed=0)
    second = FilteredClient(enrol(tmp_path, "b"), noise_seed=1)
    update = [np.full(50, 1.0)]  # norm 7.1: clipped to C = 1
    mechanisms = []
    for client in (first, second):
        m = self_sampling(request, client.policy, lambda arrays: GaussianMechanism.for_request(request))(update)
        mechanisms.append(m)
    kept, dropped = seeds_with_coins(0.01, RUN, 0)
    rels = []
    for client, m, seed in zip((first, second), mechanisms, (kept, dropped)):
        rels.append(
            release(
                client.ledger,
                m,
                update,
                run_id=RUN,
                round_id=0,
                exhausted_below=1e-3,
                after_exhaustion="noise-only",
                stream=round_noise_stream(seed, RUN, 0),
            )
        )
    a, b = rels
    # The same charge, state and status whichever way the coin fell.
    assert np.array_equal(a.charge, b.charge) and np.array_equal(a.state_after, b.state_after)
    assert a.status == b.status == "contributed" and a.sensitivity == b.sensitivity == pytest.approx(1.0)
    # The rate is the planner's for a fresh device (an independent path: rate_for_budget counts asks
    # with the filter's own rounding), and the charge is the exact sampled Gaussian at it.
    rate = mechanisms[0].rate
    assert rate == pytest.approx(rate_for_budget(epsilon=1.0, delta=1e-5, noise_multiplier=z, asks=asks), rel=1e-4)
    filt = first.ledger.filter
    assert np.array_equal(a.charge, sampled_gaussian_charge(filt, rate=rate, sensitivity=a.sensitivity, noise_std=z))
    assert asks * a.charge[0] <= filt.budget[0]
    assert a.charge[0] < filt.charge(sensitivity=1.0, noise_std=z)[0] / 50  # amplification
    # The replies: same form; one carries the update, the other the noise alone.
    assert [(x.dtype, x.shape) for x in a.arrays] == [(y.dtype, y.shape) for y in b.arrays]
    for client in (first, second):
        client.ledger.close()


def test_the_report_is_the_update_plus_noise_when_kept_and_the_noise_alone_when_dropped():
    request = RoundSpec(RUN, 0, 1.0, 2.0)
    inner = GaussianMechanism.for_request(request)
    payload, _ = inner.clip_and_snap([np.array([3.0, 4.0, 0.0])], 2.0)
    zeros = [np.zeros_like(k) for k in payload[:1]]
    for rate, expected in ((1.0, payload), (0.0, zeros)):
        m = SampledMechanism(inner, 5, 1.0, 1e-3, 0.5, rate=rate)
        after = NoiseStream.from_seed("x")
        after.uint64(1)  # the coin's word
        want = inner.noise(expected, after)
        got = m.noise(payload, NoiseStream.from_seed("x"))
        assert np.array_equal(got[0], want[0])


def test_the_coin_keeps_the_update_at_the_rate():
    draws = np.array([coin(NoiseStream.from_seed("c", i), 0.3) for i in range(20000)])
    assert abs(draws.mean() - 0.3) < 4 * np.sqrt(0.3 * 0.7 / draws.size)
    assert coin(NoiseStream.from_seed(0), 0.0) == 0 and coin(NoiseStream.from_seed(0), 1.0) == 1


# --- a life -----------------------------------------------------------------------------------------
def test_a_device_asked_as_planned_spends_its_budget_and_asked_more_never_overspends(tmp_path):
    asks, z = 20, 1.0
    ledger = enrol(tmp_path, epsilon=2.0, order=6.0)
    client = FilteredClient(ledger, noise_seed=3)
    rng = np.random.default_rng(0)
    rates, budget = [], ledger.filter.budget[0]
    for r in range(asks + 10):
        request = RoundSpec(RUN, r, z, 1.0, planned_asks=asks)
        update = [rng.normal(size=30) * 3]
        _, mechanism = gaussian_release(
            ledger, request, update, policy=client.policy, stream=round_noise_stream(3, RUN, r)
        )
        rates.append(mechanism.rate)
        assert ledger.state()[0] <= budget  # never over, at any step
        if r == asks - 1:
            spent_as_planned = ledger.state()[0] / budget
    assert spent_as_planned >= 0.9  # asked as planned, it ends near its budget
    assert 0 < min(rates[:asks]) and max(rates[: asks - 1]) < 1  # the plan's rates: spread, not all at once
    statuses = [rec.status for rec in ledger.records()]
    assert statuses[-1] == "noise-only"  # asked past its plan, it runs out and stops contributing
    assert np.array_equal(ledger.recomputed_state(), ledger.state())
    ledger.close()


def test_a_larger_budget_contributes_more_often(tmp_path):
    rates = []
    for eps in (2.0, 6.0):
        ledger = enrol(tmp_path, f"e{eps}", epsilon=eps, order=6.0)
        request = RoundSpec(RUN, 0, 1.0, 1.0, planned_asks=30)
        _, m = gaussian_release(ledger, request, [np.ones(4)])
        rates.append(m.rate)
        ledger.close()
    assert rates[0] < rates[1]


def test_the_owner_caps_the_rate(tmp_path):
    ledger = enrol(tmp_path, epsilon=50.0, order=6.0)
    request = RoundSpec(RUN, 0, 1.0, 1.0, planned_asks=2)
    policy = ClientPolicy(max_sampling_rate=0.25)
    _, m = gaussian_release(ledger, request, [np.ones(4)], policy=policy)
    assert m.rate == 0.25
    ledger.close()


def test_a_filter_that_cannot_account_it_does_not_sample_and_is_charged_as_before(tmp_path):
    request = RoundSpec(RUN, 0, 1.0, 1.0, planned_asks=10)
    ledger = enrol(tmp_path, kind="gdp", epsilon=4.0)
    rel, m = gaussian_release(ledger, request, [np.ones(4)])
    assert m.rate == 1.0
    assert np.array_equal(rel.charge, ledger.filter.charge(sensitivity=rel.sensitivity, noise_std=1.0))
    ledger.close()


# --- distributed placement -------------------------------------------------------------------------
def test_a_skellam_release_is_charged_the_subsampled_bound_and_the_worst_case_its_own_whatever_the_coin(tmp_path):
    n = 10
    request = RoundSpec(RUN, 0, 1.0, 1.0, placement="distributed", min_reports=5, planned_asks=40)
    grid = skellam_grid(request, target_range=secaggplus_settings(n)["quantization_range"], sample_num=n)
    policy = ClientPolicy(allow_distributed=True)
    update = [np.full(20, 0.5, np.float32)]
    out = []
    for name, seed in zip("ab", seeds_with_coins(0.05, RUN, 0)):
        ledger = enrol(tmp_path, name, epsilon=4.0, order=6.0, worst=1000.0)  # the main account binds
        m = self_sampling(request, policy, lambda arrays: SkellamMechanism.for_update(request, grid, arrays))(update)
        rel = release(
            ledger,
            m,
            update,
            run_id=RUN,
            round_id=0,
            exhausted_below=1e-3,
            after_exhaustion="noise-only",
            stream=round_noise_stream(seed, RUN, 0),
        )
        worst = ledger.records()[0].worst_charge
        payload, _ = m.inner.clip_and_snap(m.inner.check(update, ledger.filter), 1.0)
        want_main = sampled_skellam_charge(
            ledger.filter, rate=m.rate, l1=payload.l1, l2=payload.l2, mu_total=grid.mu_total
        )
        worst_filter = ledger.worst_filter
        # The worst-case account keeps its own best order (worst_case_filter): below 2 for a budget of
        # 1000, where it is charged the unsampled release, an upper bound.
        assert sampling_order(worst_filter) is None
        want_worst = skellam_charge(worst_filter, payload.l1, payload.l2, grid.mu_share)
        assert np.array_equal(rel.charge, want_main) and np.array_equal(worst, want_worst)
        assert 0 < m.rate < 1
        out.append((rel, worst, [(a.dtype, a.shape) for a in rel.arrays]))
        ledger.close()
    (a, wa, fa), (b, wb, fb) = out
    assert np.array_equal(a.charge, b.charge) and np.array_equal(wa, wb) and fa == fb


# --- the request ---------------------------------------------------------------------------------------
def test_planned_asks_travel_in_the_request_and_bad_values_are_named():
    request = RoundSpec(RUN, 3, 1.0, 0.5, planned_asks=12)
    assert round_spec_from_record(request_record(request)) == request
    assert "planned-asks" not in request_record(RoundSpec(RUN, 3, 1.0, 0.5)).keys()  # old requests unchanged
    for bad in (-1, 1.5, True, 10**7):
        problems = request_problems(dataclasses.replace(request, planned_asks=bad))
        assert len(problems) == 1 and "planned_asks" in problems[0] and repr(bad) in problems[0]
    both = request_problems(dataclasses.replace(request, clipped_count_stddev=2.0))
    assert len(both) == 1 and "adaptive clipping" in both[0]


@pytest.mark.parametrize("bad", [0.0, 1.5, float("nan"), -0.1])
def test_a_bad_rate_cap_is_refused_naming_it(bad):
    with pytest.raises(ValueError, match="max_sampling_rate"):
        ClientPolicy(max_sampling_rate=bad)


# --- what the coordinator sees ------------------------------------------------------------------------
def test_the_coin_leaves_no_trace_in_the_reply_its_bytes_or_its_time(tmp_path):
    """Two devices alike but for their coin (one keeps its update, one drops it): their replies have the
    same records, keys, dtypes, shapes and byte lengths, the same metadata but for the ids, and leave at
    the same whole multiple of the hold."""
    hold = 0.4
    request = dataclasses.replace(spec(1, run_id=RUN), planned_asks=4)
    settings = {
        "filter": "rdp",
        "rdp-order": 8.0,
        "budget-epsilon": 8.0,
        "max-sampling-rate": 0.5,
        "reply-hold-s": hold,
    }
    replies, elapsed = [], []
    for name, seed in zip(("kept", "dropped"), seeds_with_coins(0.5, RUN, 1)):
        ctx = context(tmp_path / name, **settings, **{"noise-seed": seed})
        started = time.monotonic()
        replies.append(individual_filter_mod(train_message(request), ctx, Handler(step=1.0)))
        elapsed.append(time.monotonic() - started)
        assert [r.status for r in records(tmp_path / name)[0]] == ["contributed"]
    kept, dropped = replies
    for reply in replies:
        assert not reply.has_error() and dict(reply.content[STATUS_RECORD]) == {"status": "report"}
    assert list(kept.content.keys()) == list(dropped.content.keys())
    a, b = kept.content[ARRAYS_RECORD], dropped.content[ARRAYS_RECORD]
    assert list(a.keys()) == list(b.keys())
    assert [(x.dtype, x.shape, len(x.data)) for x in a.values()] == [
        (x.dtype, x.shape, len(x.data)) for x in b.values()
    ]
    assert kept.metadata.message_type == dropped.metadata.message_type
    assert all(hold <= t < 2 * hold for t in elapsed)  # both leave at the first multiple of the hold
    # The update (1.0 per weight, clipped to C = 1 over 2,050 weights) is in one reply only: the kept
    # one's mean is shifted by C / sqrt(2050) per coordinate against the dropped one's (noise std z C = 1,
    # so the means' std is 1 / sqrt(2050) each).
    mean = [np.concatenate([x.numpy().ravel() for x in r.content[ARRAYS_RECORD].values()]).mean() for r in replies]
    assert mean[0] - mean[1] == pytest.approx(1 / np.sqrt(2050), abs=5 * np.sqrt(2 / 2050))


def test_a_worst_case_account_at_a_sampling_order_is_charged_the_subsampled_bound_too(tmp_path):
    # worst-case-epsilon 8 keeps its best order above 2: the subsampled bound applies to it as well.
    request = RoundSpec(RUN, 0, 1.0, 1.0, placement="distributed", min_reports=2, planned_asks=40)
    grid = skellam_grid(request, target_range=secaggplus_settings(4)["quantization_range"], sample_num=4)
    update = [np.full(20, 0.5, np.float32)]
    ledger = enrol(tmp_path, epsilon=4.0, order=6.0, worst=8.0)
    assert sampling_order(ledger.worst_filter) is not None
    m = self_sampling(
        request, ClientPolicy(allow_distributed=True), lambda a: SkellamMechanism.for_update(request, grid, a)
    )(update)
    release(
        ledger,
        m,
        update,
        run_id=RUN,
        round_id=0,
        exhausted_below=1e-3,
        after_exhaustion="noise-only",
        stream=NoiseStream(),
    )
    payload, _ = m.inner.clip_and_snap(m.inner.check(update, ledger.filter), 1.0)
    rec = ledger.records()[0]
    assert rec.status == "contributed" and 0 < m.rate < 1
    want = sampled_skellam_charge(
        ledger.worst_filter, rate=m.rate, l1=payload.l1, l2=payload.l2, mu_total=grid.mu_share
    )
    assert np.array_equal(rec.worst_charge, want)
    assert ledger.worst_state()[0] <= ledger.worst_filter.budget[0]
    ledger.close()


def test_a_coordinators_planned_asks_cannot_make_a_device_leave_or_stay(tmp_path):
    """Exhaustion reads the whole room, never the request's planned_asks: however many asks the
    coordinator claims, a device with budget left contributes (at the floor rate at least), and a
    spent one leaves whatever it claims; so a leave marker does not probe the budget."""
    policy = ClientPolicy(after_exhaustion="leave")
    ledger = enrol(tmp_path, epsilon=1.0, order=10.6)
    statuses, rates = [], []
    for r, asks in enumerate([10**6, 10**6, 1, 10**6, 1]):
        request = RoundSpec(RUN, r, 1.1, 1.0, planned_asks=asks)
        rel, m = gaussian_release(ledger, request, [np.ones(8)], policy=policy)
        statuses.append(rel.status)
        rates.append(m.rate)
    # A million asks claimed: the floor rate, not a departure. Then one: what is left is spent at once.
    assert statuses[:3] == ["contributed"] * 3 and rates[:2] == [policy.exhausted_below] * 2
    assert rates[2] > 10 * policy.exhausted_below
    # The whole room spent, the device leaves, and stays gone whatever is claimed next.
    assert statuses[3:] == ["left", "left"]
    assert ledger.state()[0] <= ledger.filter.budget[0]
    ledger.close()


def test_a_coordinators_noise_multiplier_cannot_probe_the_budget_through_the_leave_marker(tmp_path):
    """The attack: two ``leave`` devices get the same 60 requests and differ only in their updates' norms,
    so their budgets left differ. At a small z a full-clip ask at the floor rate costs much of a budget,
    at a large one almost nothing: were being spent read at the request's z, the coordinator could pick
    a z between the two rooms and read from the markers which device has more left, and ask again at
    another z. Being spent reads the owner's settings alone, so every z gets the same answer from both
    (neither is spent); the rate, which z does move, is accounted, and at rate 0 the reply is noise."""
    policy = ClientPolicy(after_exhaustion="leave")
    small, full = enrol(tmp_path, "small"), enrol(tmp_path, "full")
    for r in range(60):
        for ledger, norm in ((small, 0.05), (full, 1.0)):
            gaussian_release(
                ledger, RoundSpec(RUN, r, 1.1, 1.0, planned_asks=100), [np.full(4, norm / 2)], policy=policy
            )
    assert small.state()[0] < full.state()[0] < full.filter.budget[0]  # their data left them different rooms
    answers = {}
    for z in np.geomspace(policy.min_noise_multiplier, 50.0, 25):
        for name, ledger in (("small", small), ("full", full)):
            request = RoundSpec(f"probe-{z:.6g}", 0, float(z), 1.0, planned_asks=10**6)
            rel, m = gaussian_release(ledger, request, [np.zeros(4)], policy=policy)
            answers.setdefault(name, []).append((rel.status, rel.arrays is not None))
    assert answers["small"] == answers["full"] == [("contributed", True)] * 25
    # At the owner's smallest z the floor rate costs more than the full device has left: it takes what its
    # room pays for (below the floor), not a departure.
    rel, m = gaussian_release(full, RoundSpec("low", 0, 0.5, 1.0, planned_asks=10**6), [np.ones(4)], policy=policy)
    assert rel.status == "contributed" and m.rate < policy.exhausted_below
    for ledger in (small, full):
        assert ledger.state()[0] <= ledger.filter.budget[0]
        ledger.close()


@pytest.mark.parametrize("worst_epsilon", [1.0, 1.5])
def test_a_worst_case_budget_set_after_sampled_local_rounds_holds_what_they_cost_at_its_own_order(
    tmp_path, worst_epsilon
):
    """The attack: a device samples itself in local rounds (charged at its main order, 10.6), then its owner
    sets a worst-case budget, whose account holds another order (18 at epsilon 1, 13 at 1.5). Copied as
    is, the main charges sit far below what the same releases cost at that order (the subsampled curve
    is steeper there), and the account would admit distributed rounds its guarantee cannot pay for.
    Reference: dp_accounting's sampled Gaussian at each round's own rate, at the account's order."""
    from dp_accounting.rdp.rdp_privacy_accountant import _compute_rdp_poisson_subsampled_gaussian

    from fedfilter.privacy.filters import rdp_order

    ledger = enrol(tmp_path, epsilon=1.0, order=10.6)
    rates = []
    for r in range(60):
        rel, m = gaussian_release(ledger, RoundSpec(RUN, r, 1.1, 1.0, planned_asks=141), [np.full(4, 10.0)])
        assert rel.status == "contributed"
        rates.append(m.rate)
    ledger.set_worst_case(worst_epsilon)
    worst = ledger.worst_filter
    order = rdp_order(worst)
    assert order != 10.6  # the account's own order: the copy would be in the wrong units
    true = sum(float(_compute_rdp_poisson_subsampled_gaussian(q, 1.1, [order])[0]) for q in rates) / order
    held = float(ledger.worst_state()[0])
    assert held >= true
    # What the copy of the main charges held: far below the truth (the attack it replaces).
    copied = sum(float(rec.charge[0]) for rec in ledger.records())
    assert copied < true / 100
    ledger.close()
