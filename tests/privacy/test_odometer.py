"""Odometers (privacy/odometer.py) against independent references.

mpmath at 50 digits for every closed form; a Monte Carlo run of adaptive Gaussian sequences for the
time-uniform guarantee; hypothesis for monotonicity; the filters' exact readouts as a floor.
"""

from __future__ import annotations

import math

import mpmath
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fedfilter.privacy import odometer as odo
from fedfilter.privacy import pure_dp
from fedfilter.privacy.filters import gdp_filter, rdp_filter, rdp_order
from fedfilter.privacy.gaussian_dp import epsilon_for_mu

mpmath.mp.dps = 50
REL = mpmath.mpf("1e-12")


def _mp_advanced(eps, delta_g, n):
    """Rogers et al. (2016) Theorem 6.5, equations (11) and (12), at 50 digits (written from the paper)."""
    e = [mpmath.mpf(x) for x in eps]
    d, n_ = mpmath.mpf(delta_g), mpmath.mpf(n)
    drift = mpmath.fsum(x * (mpmath.e**x - 1) / 2 for x in e)
    s2 = mpmath.fsum(x**2 for x in e)
    if 1 / n_**2 <= s2 <= 1:
        return drift + mpmath.sqrt(2 * s2 * (mpmath.log(110 * mpmath.e) + 2 * mpmath.log(mpmath.log(n_) / d)))
    tail = (1 + mpmath.log(1 + n_**2 * s2) / 2) * mpmath.log(4 * mpmath.log(n_, 2) / d)
    return drift + mpmath.sqrt(2 * (1 / n_**2 + s2) * tail)


def _mp_gdp(v, delta_g):
    v, d = mpmath.mpf(v), mpmath.mpf(delta_g)
    best = mpmath.inf
    for j in range(odo.MAX_LEVELS):
        b = mpmath.mpf(odo.GDP_FIRST_LEVEL) * mpmath.mpf(odo.GDP_RATIO) ** j
        log_inv = -mpmath.log(d / ((j + 1) * (j + 2)))
        lam = mpmath.sqrt(2 * log_inv / b)
        best = min(best, log_inv / lam + lam * v / 2)
    return v / 2 + best


def _close_above(value, exact):
    """Rounded up (never below the exact value) and within 1e-12 relative of it."""
    assert mpmath.mpf(value) >= exact
    assert mpmath.mpf(value) <= exact * (1 + REL)


@pytest.mark.parametrize(
    "eps, delta_g, n, branch",
    [
        ([0.1] * 50, 1e-6, 1000, 11),  # sum eps^2 = 0.5
        ([0.3, 0.05, 0.2, 0.01], 1e-3, 100, 11),
        ([0.5] * 10, 1e-6, 1000, 12),  # sum eps^2 = 2.5 > 1
        ([1e-4] * 3, 1e-5, 100, 12),  # sum eps^2 < 1/n^2
    ],
)
def test_advanced_odometer_is_equations_11_and_12(eps, delta_g, n, branch):
    assert odo.advanced_branch(eps, n) == branch
    _close_above(odo.advanced_odometer(eps, delta_g=delta_g, n=n), _mp_advanced(eps, delta_g, n))


def test_basic_odometer_is_the_sum():
    eps = [0.1, 0.2, 0.3, 1e-9]
    _close_above(odo.basic_odometer(eps), mpmath.fsum(mpmath.mpf(e) for e in eps))
    assert odo.basic_odometer([]) == 0.0


def test_lemma33_doubles_epsilons_and_halts_on_the_delta_charge():
    eps, dels = [0.1, 0.2], [1e-7, 1e-7]
    charge = mpmath.fsum(2 * mpmath.mpf(d) / (mpmath.mpf(e) * mpmath.e ** mpmath.mpf(e)) for e, d in zip(eps, dels))
    assert odo.lemma33_odometer(odo.basic_odometer, eps, dels, float(charge) * 1.01) == odo.basic_odometer([0.2, 0.4])
    assert odo.lemma33_odometer(odo.basic_odometer, eps, dels, float(charge) * 0.99) == math.inf
    assert pure_dp.lemma33_delta_charge(0.1, 1e-7) >= 2e-7 / (0.1 * math.exp(0.1))


def test_no_data_released_is_no_loss():
    assert odo.gdp_odometer(0.0, delta_g=1e-6) == 0.0 == odo.rdp_odometer(0.0, order=4.0, delta_g=1e-6)
    assert odo.gdp_odometer(1e-300, delta_g=1e-6) > 0 and odo.rdp_odometer(1e-300, order=4.0, delta_g=1e-6) > 0


@pytest.mark.parametrize("v", [1e-4, 0.37, 2.0, 55.0])
def test_gdp_odometer_against_mpmath(v):
    _close_above(odo.gdp_odometer(v, delta_g=1e-5), _mp_gdp(v, 1e-5))


def test_rdp_odometer_against_mpmath():
    exact = mpmath.mpf("1.25") + mpmath.log(1 / mpmath.mpf("1e-6")) / (mpmath.mpf(12) - 1)
    _close_above(odo.rdp_odometer(1.25, order=12.0, delta_g=1e-6), exact)


@pytest.mark.parametrize(
    "call, field",
    [
        (lambda: odo.advanced_odometer([0.1], delta_g=0.5, n=100), "delta_g"),
        (lambda: odo.advanced_odometer([0.1], delta_g=1e-6, n=1), "n"),
        (lambda: odo.basic_odometer([-0.1]), "epsilons"),
        (lambda: odo.gdp_odometer(float("nan"), delta_g=1e-6), "sum_mu_sq"),
        (lambda: odo.rdp_odometer(1.0, order=1.0, delta_g=1e-6), "order"),
        (lambda: odo.lemma33_odometer(odo.basic_odometer, [0.1], [], 0.1), "deltas"),
    ],
)
def test_bad_input_names_the_field(call, field):
    with pytest.raises(ValueError, match=field):
        call()


def _adaptive_paths(rule, paths=4000, rounds=40, seed=7):
    """Realized loss L_k = sum mu_t Z_t + V_k / 2 under an adaptive choice of mu_t; (L, V) per round."""
    rng = np.random.default_rng(seed)
    m = np.zeros(paths)
    v = np.zeros(paths)
    ls, vs = [], []
    for _ in range(rounds):
        mu = rule(m, v)
        m = m + mu * rng.standard_normal(paths)
        v = v + mu * mu
        ls.append(m + v / 2)
        vs.append(v.copy())
    return np.array(ls), np.array(vs)


def _chase(m, v):
    """The adversary pushes hard while the loss is running high (this breaks fixed-time bounds)."""
    return np.where(m > 0, 0.6, 0.02)


def test_gdp_odometer_bounds_the_realized_loss_of_adaptive_sequences():
    delta_g = 0.05
    ls, vs = _adaptive_paths(_chase)
    bound = np.vectorize(lambda x: odo.gdp_odometer(float(x), delta_g=delta_g))(vs)
    failed = np.mean(np.any(ls > bound, axis=0))
    assert failed <= delta_g  # the odometer: every round at once
    # Not vacuous: half its deviation term (the part above V/2) fails far more often than delta_g.
    assert np.mean(np.any(ls > vs / 2 + (bound - vs / 2) / 2, axis=0)) > 2 * delta_g
    # The same check catches a bound valid per round only: the Gaussian quantile at each fixed k.
    z = float(mpmath.sqrt(2) * mpmath.erfinv(1 - 2 * mpmath.mpf(delta_g)))
    fixed_time = vs / 2 + z * np.sqrt(vs)
    assert np.mean(np.any(ls > fixed_time, axis=0)) > delta_g


def test_rdp_odometer_bounds_the_realized_loss_of_adaptive_sequences():
    delta_g, order = 0.05, 8.0
    ls, vs = _adaptive_paths(_chase, seed=11)
    bound = np.vectorize(lambda x: odo.rdp_odometer(float(order * x / 2), order=order, delta_g=delta_g))(vs)
    assert np.mean(np.any(ls > bound, axis=0)) <= delta_g


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.floats(0, 2), min_size=1, max_size=12),
    st.integers(0, 11),
    st.floats(1e-6, 1.0),
)
def test_every_odometer_is_monotone_in_every_epsilon(eps, i, bump):
    i %= len(eps)
    more = list(eps)
    more[i] += bump
    assert odo.basic_odometer(more) >= odo.basic_odometer(eps)
    assert odo.advanced_odometer(more, delta_g=1e-6, n=1000) >= odo.advanced_odometer(eps, delta_g=1e-6, n=1000)
    s, s_more = sum(e * e for e in eps), sum(e * e for e in more)
    assert odo.gdp_odometer(s_more, delta_g=1e-6) >= odo.gdp_odometer(s, delta_g=1e-6)
    assert odo.rdp_odometer(s_more, order=10.0, delta_g=1e-6) >= odo.rdp_odometer(s, order=10.0, delta_g=1e-6)


@pytest.mark.parametrize("mus", [[0.3] * 10, [0.1, 0.5, 0.2], [1.5], [0.05] * 200])
def test_never_below_the_filter_readout_on_fixed_histories(mus):
    delta = 1e-5
    v = sum(m * m for m in mus)
    assert odo.gdp_odometer(v, delta_g=delta) >= epsilon_for_mu(math.sqrt(v), delta)
    filt = rdp_filter(4.0, delta)
    alpha = rdp_order(filt)
    rho = np.array([v / 2])
    assert odo.rdp_odometer(alpha * v / 2, order=alpha, delta_g=delta) >= filt.epsilon_spent(rho)
    assert gdp_filter(4.0, delta).epsilon_spent(np.array([v])) <= odo.gdp_odometer(v, delta_g=delta)
