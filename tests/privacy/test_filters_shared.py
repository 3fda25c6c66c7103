"""One suite every filter must pass, plus hypothesis searches for sequences that overspend."""

import math

import numpy as np
import pytest
from dp_accounting.rdp import rdp_privacy_accountant as google_rdp
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fedfilter.privacy import gaussian_dp, zcdp
from fedfilter.privacy.filters import FILTER_KINDS, make_filter

BUDGETS = [(0.3, 1e-5), (1.0, 1e-5), (8.0, 1e-9)]


def certified_epsilon(filt, state):
    """The epsilon the state certifies, by each kind's own conversion (independent of the filter)."""
    if filt.kind == "gdp":
        return gaussian_dp.epsilon_for_mu(math.sqrt(state[0]), filt.delta)
    if filt.kind == "zcdp":
        return zcdp.epsilon_from_zcdp(state[0], filt.delta)
    # rdp: the state is rho, order alpha's loss alpha * rho; dp_accounting converts at the full delta.
    return google_rdp.compute_epsilon(filt.orders, [a * state[0] for a in filt.orders], filt.delta)[0]


@pytest.fixture(params=[(k, e, d) for k in FILTER_KINDS for e, d in BUDGETS], ids=str)
def filt(request):
    kind, eps, delta = request.param
    return make_filter(kind, eps, delta)


def test_fresh_state_admits_nothing_spent(filt):
    s = filt.initial_state()
    assert filt.admits(s, filt.charge(sensitivity=0.0, noise_std=1.0))
    assert filt.epsilon_spent(s) == 0.0


def test_zero_charge_leaves_state_unchanged(filt):
    s = filt.spend(filt.initial_state(), filt.charge(sensitivity=0.3, noise_std=2.0))
    assert np.array_equal(filt.spend(s, filt.charge(sensitivity=0.0, noise_std=2.0)), s)


def test_allowance_lands_on_the_budget(filt):
    s = filt.initial_state()
    for std in (3.0, 1.0, 10.0):  # spend half the allowance at two noise levels, then all of it
        s = filt.spend(s, filt.charge(sensitivity=float(filt.allowance(s, noise_std=std)) / 2, noise_std=std))
    a = float(filt.allowance(s, noise_std=7.0))
    c = filt.charge(sensitivity=a, noise_std=7.0)
    assert a > 0 and filt.admits(s, c)
    assert not filt.admits(s, filt.charge(sensitivity=a * (1 + 1e-9), noise_std=7.0))
    s = filt.spend(s, c)
    # Spent to the budget: nothing more fits, and the certified epsilon is the budget.
    assert float(filt.allowance(s, noise_std=1.0)) < 1e-6
    assert certified_epsilon(filt, s) <= filt.epsilon * (1 + 1e-12)
    assert filt.epsilon_spent(s) == pytest.approx(filt.epsilon, rel=1e-6)
    assert filt.epsilon_spent(s) <= filt.epsilon  # spent to the budget never reads above it


def test_monotone(filt):
    s = filt.spend(filt.initial_state(), filt.charge(sensitivity=1.0, noise_std=20.0))
    a = float(filt.allowance(s, noise_std=5.0))
    for smaller in (0.0, a / 2, a * 0.999):
        assert filt.admits(s, filt.charge(sensitivity=smaller, noise_std=5.0))


def test_vectorised_equals_one_at_a_time(filt):
    rng = np.random.default_rng(0)
    norms, stds = rng.uniform(0, 2, size=(6, 40)), rng.uniform(0.5, 30, size=40)
    states = filt.initial_state(n_clients=6)
    singles = [filt.initial_state() for _ in range(6)]
    for t in range(40):
        allow = filt.allowance(states, noise_std=stds[t])
        sens = np.minimum(norms[:, t], allow)
        states = filt.spend(states, filt.charge(sensitivity=sens, noise_std=stds[t]))
        for i in range(6):
            a = filt.allowance(singles[i], noise_std=stds[t])
            singles[i] = filt.spend(singles[i], filt.charge(sensitivity=min(norms[i, t], a), noise_std=stds[t]))
    assert np.array_equal(states, np.stack(singles))


def test_scaled_quota(filt):
    q = filt.scaled(0.25)
    assert np.all(q.budget <= filt.budget * 0.25)
    with pytest.raises(ValueError, match="quota"):
        filt.scaled(1.5)


# --- adversarial, adaptive sequences -------------------------------------------------------------
steps = st.lists(
    st.tuples(
        st.floats(0, 1e3, allow_nan=False),  # requested update norm
        st.floats(1e-3, 1e4, allow_nan=False),  # noise std
        st.floats(1e-3, 1e3, allow_nan=False),  # clip C
    ),
    min_size=1,
    max_size=80,
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(kind=st.sampled_from(FILTER_KINDS), eps=st.floats(0.01, 20), log_delta=st.floats(-12, -2), seq=steps)
def test_no_adaptive_sequence_spends_beyond_the_budget(kind, eps, log_delta, seq):
    filt = make_filter(kind, eps, 10**log_delta)
    s = filt.initial_state()
    for norm, std, clip in seq:
        # An adversary sees the state (worst case) and always asks for the whole allowance or more.
        allow = min(clip, float(filt.allowance(s, noise_std=std)))
        if allow < clip:  # probing with more than the allowance is refused
            # "More": 1e-6 more norm, plus enough to cost 1e-12 of the budget (the allowance lands
            # within that of the budget; a smaller step can vanish in the state's rounding).
            step = std * math.sqrt(1e-12 * float(filt.budget[0]) / float(filt.weights[0]))
            assert not filt.admits(s, filt.charge(sensitivity=allow * (1 + 1e-6) + step, noise_std=std))
        c = filt.charge(sensitivity=min(norm, allow), noise_std=std)
        assert filt.admits(s, c)
        s = filt.spend(s, c)
    assert filt.within_budget(s)
    assert certified_epsilon(filt, s) <= eps * (1 + 1e-12)


@settings(max_examples=150, deadline=None)
@given(
    eps=st.floats(0.01, 20),
    log_delta=st.floats(-12, -2),
    charges=st.lists(st.floats(0, 10, allow_nan=False), min_size=1, max_size=300),
)
def test_rounding_edges_exact_budget_hits(eps, log_delta, charges):
    """Charges chosen to land exactly on (or one ulp around) the budget never get past it."""
    filt = make_filter("gdp", eps, 10**log_delta)
    s = filt.initial_state()
    for c in charges:
        room = float(filt.budget[0] - s[0])
        for cand in (c, room, np.nextafter(room, np.inf), np.nextafter(room, -np.inf)):
            ch = np.array([max(float(cand), 0.0)])
            if filt.admits(s, ch):
                s = filt.spend(s, ch)
    assert s[0] <= filt.budget[0]
    assert gaussian_dp.epsilon_for_mu(math.sqrt(s[0]), filt.delta) <= eps * (1 + 1e-12)
