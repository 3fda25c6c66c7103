"""The vectorised engine against independent references: raw per-client states and sensitivities.

The engine keeps no spend rows, so ``record_spends`` wraps the device's spend template where the engine
calls it (``fedfilter.client.mechanisms.spend.spend`` on its rows) and records, per client, what each
spend was handed (certified norms, or the integer update) and the states around it. Every client's
sensitivities are converted with ``tests/budget_reference.py`` (mpmath's exact Gaussian-DP curve,
dp_accounting), never with ``epsilon_spent`` (capped at the budget), and the states are checked
against exact fractions.
"""

from __future__ import annotations

import math
from collections import defaultdict
from fractions import Fraction

import numpy as np
import pytest
from helpers.budget_reference import check_spends, exact_mu2, rdp_epsilon, weights

from fedfilter.client.mechanisms.skellam import SkellamPayload
from fedfilter.client.mechanisms.spend import spend
from fedfilter.privacy.filters import make_filter
from fedfilter.simulations.engine import Engine, EngineConfig, core, distributed_round
from fedfilter.simulations.engine.skellam_round import SkellamRound
from fedfilter.simulations.tasks.registry import load_task

N = 10
DELTA = 1e-5
EPS = [0.3, 0.5, 0.8, 1.0, 2.0, 0.3, 0.5, 0.8, 1.0, 4.0]


def record_spends(monkeypatch, module, engine: Engine) -> dict[int, list[tuple]]:
    """Per client, ``(sensitivity, state before, state after)`` of every spend ``module`` makes; in
    distributed placement ``(l1, l2 squared, before, after)`` of the integer update, in exact integers."""
    rows: dict[int, list[tuple]] = defaultdict(list)
    real = spend

    def recording(account, mechanism, arrays, **kwargs):
        clients = np.asarray(account.rows)
        before = engine.state[clients].copy()
        record, payload = real(account, mechanism, arrays, **kwargs)
        for i, c in enumerate(clients):
            if isinstance(payload, SkellamPayload):
                ints = [int(v) for a in payload.k for v in np.asarray(a).ravel()]  # Python integers: exact
                head = (sum(abs(v) for v in ints), sum(v * v for v in ints))
            else:
                head = (float(np.asarray(record.sensitivity)[i]),)
            rows[int(c)].append((*head, before[i], engine.state[c].copy()))
        return record, payload

    monkeypatch.setattr(module, "spend", recording)
    return rows


@pytest.fixture(scope="module")
def digits():
    return load_task("digits", num_clients=N)


@pytest.mark.parametrize(
    "kind,norms", [("gdp", "device"), ("gdp", "vectorised"), ("zcdp", "device"), ("rdp", "vectorised")]
)
def test_engine_states_and_sensitivities_stay_within_budget_by_independent_accountants(
    digits, kind, norms, monkeypatch
):
    z, clip = 2.0, 0.5
    cfg = EngineConfig(
        task="digits",
        num_clients=N,
        epsilon=EPS,
        delta=DELTA,
        filter_kind=kind,
        noise_multiplier=z,
        clip=clip,
        rounds=6,
        local_epochs=1,
        lr=0.1,
        group_by="none",
        torch_threads=1,
        noise_draw="aggregate",
        eval_every=100,
        norms=norms,
    )
    engine = Engine(cfg, task=digits)
    spends = record_spends(monkeypatch, core, engine)
    for _ in range(cfg.rounds):
        engine.step()
    std = cfg.accounted_std
    assert std == z * clip
    exhausted = engine.exhausted_round > 0
    assert exhausted.sum() >= 4, "too few clients ran out: the budgets would not bind"
    for k in range(N):
        filt = make_filter(kind, EPS[k], DELTA)  # only for its orders (the rdp state's coordinates)
        rows = spends[k]
        assert len(rows) == cfg.rounds  # every client answers every round (fraction 1)
        check_spends(
            kind,
            EPS[k],
            DELTA,
            filt.orders,
            [(s, std) for s, _, _ in rows],
            exhausted=bool(exhausted[k]),
            slack_mu2=2 * (cfg.exhausted_below / z) ** 2,
            use_pld=k < 3,
        )
        # Exact fractions: each round's state covers the state before it plus the exact cost of
        # its sensitivity, and the final state covers the exact sum of all of them.
        w = weights(kind, filt.orders)
        total = [Fraction(0)] * len(w)
        for i, (s, before, after) in enumerate(rows):
            for j, wj in enumerate(w):
                cost = wj * exact_mu2(s, std)
                total[j] += cost
                assert Fraction(float(after[j])) >= Fraction(float(before[j])) + cost, (k, i, j)
                assert Fraction(float(after[j])) >= total[j], (k, i, j)
        assert np.array_equal(rows[-1][2], engine.state[k])


def akl_rdp(l1: int, l2sq: int, mu: Fraction, order: int) -> Fraction:
    """Agarwal, Kairouz, Liu 2021 (arXiv 2110.04995) Corollary 3.6 at an integer order, exactly: the
    RDP of ``k + Sk(mu)`` for an integer k with norms l1 and sqrt(l2sq) (the formula uses l2 squared)."""
    a = Fraction(order)
    gaussian = a * l2sq / (2 * mu)
    discrete = min(((2 * a - 1) * l2sq + 6 * l1) / (4 * mu * mu), Fraction(3 * l1) / (2 * mu))
    return gaussian + discrete if l2sq else Fraction(0)


def akl_rdp_at(l1: int, l2sq: int, mu: Fraction, alpha: float) -> Fraction:
    """An upper bound on the RDP at a real order alpha from the integer orders around it, exactly:
    ``(a - 1) D_a`` is convex in ``a`` (van Erven and Harremoes 2014), so with ``n = floor(alpha)``,
    ``t = alpha - n``: ``D_alpha <= ((1 - t)(n - 1) D_n + t n D_(n+1)) / (alpha - 1)`` (n >= 2), and
    ``D_alpha <= D_2`` below 2 (monotone in the order)."""
    a = Fraction(alpha)
    n = math.floor(a)
    if n < 2:
        return akl_rdp(l1, l2sq, mu, 2)
    t = a - n
    return ((1 - t) * (n - 1) * akl_rdp(l1, l2sq, mu, n) + t * n * akl_rdp(l1, l2sq, mu, n + 1)) / (a - 1)


@pytest.mark.parametrize("norms", ["device", "vectorised"])
def test_distributed_states_are_the_skellam_charges_at_the_actual_integer_norms(digits, norms, monkeypatch):
    """Each client's lifetime state is the sum of its rounds' Skellam RDP at alpha* (computed here
    exactly from the integer updates' norms), divided by alpha*: never below it, and above it only by
    the rounding up of each charge and sum; and that RDP converts to at most the client's epsilon."""
    from fedfilter.privacy.filters import rdp_order  # the order is the filter's choice, fixed in advance

    eps = [0.5, 1.0, 1.5, 2.0, 3.0, 0.5, 1.0, 1.5, 2.0, 8.0]
    cfg = EngineConfig(
        task="digits",
        num_clients=N,
        epsilon=eps,
        delta=DELTA,
        filter_kind="rdp",
        placement="distributed",
        worst_case_epsilon=1000.0,  # does not bind: this test is about the main account
        min_reports=4,
        noise_multiplier=3.0,
        clip=0.1,
        rounds=5,
        local_epochs=1,
        lr=0.5,
        group_by="none",
        torch_threads=1,
        noise_draw="aggregate",
        eval_every=100,
        norms=norms,
    )
    engine = Engine(cfg, task=digits)
    spends = record_spends(monkeypatch, distributed_round, engine)
    for _ in range(cfg.rounds):
        engine.step()
    params = SkellamRound.from_request(
        cfg.noise_multiplier, cfg.clip, cfg.min_reports, N, make_filter("rdp", 1.0, DELTA)
    )
    gamma = params.gamma
    mu = Fraction(params.mu_total)
    # The variance the charges assume is at most the request's (float z * C, squared in grid units), and
    # min_reports shares carry at least it (fewer reports are never released).
    assert mu <= (Fraction(cfg.accounted_std) / Fraction(gamma)) ** 2
    assert Fraction(params.mu_share) * cfg.min_reports >= mu
    spent_most = 0
    for k in range(N):
        filt = make_filter("rdp", eps[k], DELTA)
        alpha = rdp_order(filt)
        rows = spends[k]
        assert rows, f"client {k} never contributed"
        total = Fraction(0)
        for l1, l2sq, before, after in rows:
            cost = akl_rdp_at(l1, l2sq, mu, alpha) / Fraction(alpha)
            total += cost
            assert Fraction(float(after[0])) >= Fraction(float(before[0])) + cost
        state = Fraction(float(engine.state[k, 0]))
        assert total <= state <= total * (1 + Fraction(1, 10**9)) + Fraction(1, 10**300)
        # The filter's guarantee, converted independently at alpha* (Canonne-Kamath-Steinke Prop. 12).
        assert rdp_epsilon([total * Fraction(alpha)], [alpha], DELTA) <= eps[k] * (1 + 1e-12)
        spent_most += state >= Fraction(float(filt.budget[0])) * Fraction(99, 100)
    assert spent_most >= 6, "the budgets did not bind"
