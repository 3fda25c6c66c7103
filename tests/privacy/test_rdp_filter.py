"""The rdp filter is as tight as dp_accounting's RdpAccountant, never above gdp, and valid at the
full delta; a ledger written with the old per-order rdp state fails closed."""

import json
import sqlite3

import numpy as np
import pytest
from dp_accounting import dp_event
from dp_accounting.rdp import rdp_privacy_accountant as google_rdp
from hypothesis import given, settings
from hypothesis import strategies as st

from fedfilter.client.ledger.budget import BudgetLedger
from fedfilter.client.ledger.schema import LEDGER_FILE
from fedfilter.client.release import FilteredClient
from fedfilter.planning.rounds import plan_rounds
from fedfilter.privacy import renyi
from fedfilter.privacy.filters import rdp_filter, rdp_order
from fedfilter.protocol.request import RoundSpec

GRID = [(z, eps, delta) for z in (5.0, 20.0, 170.0) for eps in (0.3, 1.0, 2.0, 8.0) for delta in (1e-5, 1e-9)]


def google_rounds(epsilon: float, delta: float, z: float) -> int:
    """The most full-norm rounds (noise multiplier z) RdpAccountant prices at <= epsilon."""

    def eps_of(k):
        acc = google_rdp.RdpAccountant()  # dp_accounting's default orders and conversion
        acc.compose(dp_event.GaussianDpEvent(z), k)
        return acc.get_epsilon(delta)

    if eps_of(1) > epsilon:
        return 0
    lo, hi = 1, 2
    while eps_of(hi) <= epsilon:
        lo, hi = hi, 2 * hi
    while hi - lo > 1:  # epsilon grows with k
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if eps_of(mid) <= epsilon else (lo, mid)
    return lo


@pytest.mark.parametrize("z,eps,delta", GRID)
def test_rdp_rounds_match_rdp_accountant_and_stay_below_gdp(z, eps, delta):
    ours = plan_rounds("rdp", epsilon=eps, delta=delta, noise_multiplier=z).rounds
    google = google_rounds(eps, delta, z)
    assert google * 0.97 <= ours <= google  # as tight, and never more than the accountant certifies
    assert ours <= plan_rounds("gdp", epsilon=eps, delta=delta, noise_multiplier=z).rounds


def test_papers_004_setting_gets_the_accountant_count():
    """eps 0.3, z 170, delta 1e-5: the union bound over 12 orders gave 144 rounds."""
    assert plan_rounds("rdp", epsilon=0.3, delta=1e-5, noise_multiplier=170).rounds == google_rounds(0.3, 1e-5, 170)
    assert plan_rounds("rdp", epsilon=0.3, delta=1e-5, noise_multiplier=170).rounds >= 185


def test_tiny_budget_uses_the_kl_bound_like_the_accountant():
    """Below every order's conversion offset only the KL shortcut of compute_epsilon admits rounds."""
    for z in (1e6, 3e6):
        ours = plan_rounds("rdp", epsilon=1e-3, delta=1e-5, noise_multiplier=z).rounds
        google = google_rounds(1e-3, 1e-5, z)
        assert google > 0 and google * 0.97 <= ours <= google


@pytest.mark.parametrize("eps,delta", [(0.3, 1e-5), (1.0, 1e-8), (8.0, 1e-5), (0.05, 1e-3)])
def test_threshold_is_the_best_order_at_the_full_delta(eps, delta):
    """At rho* every order's loss alpha * rho* converts (dp_accounting) to <= eps at the full delta;
    a little above it, to more: the threshold is neither invalid nor loose."""
    filt = rdp_filter(eps, delta)
    rho = float(filt.budget[0])
    orders = list(filt.orders)
    at = google_rdp.compute_epsilon(orders, [a * rho for a in orders], delta)[0]
    above = google_rdp.compute_epsilon(orders, [a * rho * (1 + 1e-9) for a in orders], delta)[0]
    assert at <= eps < above


def test_old_per_order_rdp_ledger_fails_closed(tmp_path):
    old_grid = (1.5, 2, 3, 4, 6, 8, 12, 16, 32, 64, 128, 256)  # the pre-i13 default
    ledger = BudgetLedger.enrol(tmp_path, client_id="old", epsilon=1.0, delta=1e-5, filter_kind="rdp", orders=old_grid)
    ledger.close()
    # What the old version wrote: one Rényi sum per order (alpha/2 * sum mu^2).
    per_order = json.dumps([a / 2 * 0.01 for a in old_grid])
    conn = sqlite3.connect(tmp_path / LEDGER_FILE)
    conn.execute(
        "INSERT INTO spends (run_id, round_id, status, sensitivity, noise_std, noise_multiplier,"
        " clip, placement, charge, state_after, run_state_after, created_at)"
        " VALUES ('r', 0, 'contributed', 0.1, 1.0, 1.0, 1.0, 'local', ?, ?, ?, 0)",
        (per_order, per_order, per_order),
    )
    conn.commit()
    conn.close()
    client = FilteredClient(BudgetLedger.open(tmp_path))
    with pytest.raises(ValueError, match=r"state must have 1 coordinate.*Found shape \(12,\).*rdp ledger"):
        client.release(RoundSpec("r2", 0, 1.0, 1.0), [np.ones(4)])
    assert len(client.ledger.records()) == 1  # nothing spent
    with pytest.raises(ValueError, match="rdp ledger"):
        client.ledger.spent_epsilon()


@settings(max_examples=200, deadline=None)
@given(log_rho=st.floats(-9, 1), log_delta=st.floats(-12, -2))
def test_spent_epsilon_builds_a_filter_that_admits_the_state(log_rho, log_delta):
    """epsilon_spent builds a filter that admits the state (rounded so that it does), and is the
    smallest epsilon whose budget AT THIS FILTER'S ORDER alpha* covers the state: the state may hold
    Skellam charges, valid at alpha* only. (Before Skellam charges this test read the best order, which is
    valid only for Gaussian-only states.)"""
    delta, state = 10**log_delta, np.array([10.0**log_rho])
    filt = rdp_filter(1e3, delta)
    eps = filt.epsilon_spent(state)
    if eps > 0:
        assert rdp_filter(eps, delta).within_budget(state)
        a = rdp_order(filt)
        assert renyi.rdp_budgets([a], eps * (1 - 1e-9), delta)[0] < a * state[0] * (1 + 1e-6)
