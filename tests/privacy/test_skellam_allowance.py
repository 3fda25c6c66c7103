"""``skellam_allowance``: admitted wherever the device's Gaussian allowance is, constant work on every
state, monotone, and within 1e-9 of the largest admitted L2."""

from __future__ import annotations

import math

import numpy as np
import pytest
from helpers.trace import lines_in, trace_of
from hypothesis import given, settings
from hypothesis import strategies as st

from fedfilter.privacy.filters import rdp_filter, rdp_order, round_allowance
from fedfilter.privacy.rounding import down, up
from fedfilter.privacy.skellam import l1_cap, skellam_allowance, skellam_charge, skellam_rho


def states_of(filt):
    """Fresh, half, a few ulps below, at and past the budget: what a timing observer would tell apart."""
    b = float(filt.budget[0])
    return {
        "fresh": np.array([0.0]),
        "half": np.array([b / 2]),
        "ulps": np.array([float(down(down(b)))]),
        "at_budget": np.array([b]),
        "past": np.array([float(up(b)) * 3]),
    }


def device_allowance(filt, state, *, z, clip, mu, dim):
    """What the device does: Gaussian allowance a_G (Algorithm 7), its charge, then the Skellam L2."""
    gamma = clip / 4096.0
    a_g = round_allowance(filt, state, noise_std=z * clip, clip=clip)
    g = filt.charge(sensitivity=a_g, noise_std=z * clip)
    return a_g, g, skellam_allowance(g, mu_total=mu, alpha=rdp_order(filt), dim=dim, max_l2=clip / gamma)


@settings(max_examples=300, deadline=None)
@given(
    eps=st.floats(0.05, 20),
    log_delta=st.floats(-12, -3),
    which=st.sampled_from(["fresh", "half", "ulps", "at_budget", "past"]),
    log_mu=st.floats(-3, 12),
    dim=st.sampled_from([1, 2, 1000, 10**7]),
    z=st.floats(0.3, 200),
)
def test_allowance_is_admitted_wherever_the_gaussian_one_is(eps, log_delta, which, log_mu, dim, z):
    filt = rdp_filter(eps, 10**log_delta)
    state = states_of(filt)[which]
    mu = 10.0**log_mu
    a_g, g, allow = device_allowance(filt, state, z=z, clip=1.0, mu=mu, dim=dim)
    assert filt.admits(state, g) or float(a_g) == 0.0
    assert 0.0 <= float(allow) <= 4096.0
    charge = skellam_charge(filt, l1_cap(allow, dim), allow, mu)
    assert float(charge[0]) <= float(g[0])  # within the Gaussian charge ...
    if float(allow) > 0:
        assert filt.admits(state, charge)  # ... hence admitted wherever the Gaussian one was
    if which == "past":
        assert float(allow) == 0.0
    # Nearly the best: 1e-9 more (or max_l2) would not fit.
    if float(allow) < 4096.0:
        more = min(4096.0, float(allow) * (1 + 1e-9) + 4096.0 * 2.0**-60)
        assert float(skellam_rho(l1_cap(more, dim), more, mu, rdp_order(filt))) > float(g[0])


@pytest.mark.parametrize("dim", [1, 10, 10**7])
def test_allowance_is_monotone_in_the_charge_and_vectorised(dim):
    a = 18.0
    g = np.sort(np.concatenate([[0.0, 1e-300], 10.0 ** np.linspace(-12, 3, 60), [1e300]]))
    rows = skellam_allowance(g[:, None], mu_total=1e8, alpha=a, dim=dim, max_l2=8191.0)
    assert rows.shape == g.shape and np.all(np.diff(rows) >= 0)
    one = [float(skellam_allowance(x, mu_total=1e8, alpha=a, dim=dim, max_l2=8191.0)) for x in g]
    assert rows.tolist() == one  # a row of many equals the device's one row
    assert rows[0] == 0.0 and rows[-1] == 8191.0


def test_allowance_is_close_to_the_gaussian_one_when_mu_is_large():
    """Small dim relative to mu: the discreteness term is negligible and the Skellam L2 is the
    Gaussian allowance in grid units, less a hair."""
    filt = rdp_filter(1.0, 1e-5)
    clip, z, dim = 1.0, 20.0, 1000
    mu = (z * 4096.0) ** 2
    for state in (np.array([0.0]), np.array([float(filt.budget[0]) * 0.9])):
        a_g, _, allow = device_allowance(filt, state, z=z, clip=clip, mu=mu, dim=dim)
        assert float(a_g) * 4096.0 * 0.999 <= float(allow) <= float(a_g) * 4096.0


def test_allowance_refuses_bad_input():
    with pytest.raises(ValueError, match="gaussian_charge"):
        skellam_allowance(-1.0, mu_total=1.0, alpha=2.0, dim=1, max_l2=1.0)
    with pytest.raises(ValueError, match="max_l2"):
        skellam_allowance(1.0, mu_total=1.0, alpha=2.0, dim=1, max_l2=math.inf)
    with pytest.raises(ValueError, match="dim"):
        skellam_allowance(1.0, mu_total=1.0, alpha=2.0, dim=0, max_l2=1.0)
    with pytest.raises(ValueError, match="mu_total"):
        skellam_allowance(1.0, mu_total=0.0, alpha=2.0, dim=1, max_l2=1.0)


def test_allowance_work_is_the_same_on_every_state():
    filt = rdp_filter(1.0, 1e-5)
    traces, results = {}, {}
    for label, state in states_of(filt).items():

        def decide(state=state, label=label):
            results[label] = device_allowance(filt, state, z=3.0, clip=1.0, mu=(3.0 * 4096) ** 2, dim=1000)[2]

        traces[label] = trace_of(decide)
    assert float(results["fresh"]) > 0 and float(results["past"]) == 0.0  # the states do differ
    first = traces["fresh"]
    assert lines_in(first, "privacy/skellam.py") > 0  # the trace sees the bisection's own lines
    assert all(t == first for t in traces.values())  # the very same sequence of calls
