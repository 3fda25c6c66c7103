"""The allowance does the same work on every state (no timing channel on exhaustion), is admitted,
and lands within 1e-12 of the budget."""

import importlib.util
import subprocess
import sys
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
from helpers.trace import lines_in, trace_of
from hypothesis import given, settings
from hypothesis import strategies as st

from fedfilter.privacy.filters import FILTER_KINDS, exhausted, make_filter, round_allowance
from fedfilter.privacy.rounding import down, sub_down


def states_of(filt):
    """Fresh, half-spent, nearly spent (a few ulps of room), exactly at the budget, and spent to the
    allowance: the states a timing observer would like to tell apart."""
    b = float(filt.budget[0])
    s = filt.initial_state()
    spent = filt.spend(s, filt.charge(sensitivity=float(filt.allowance(s, noise_std=1.0)), noise_std=1.0))
    return {
        "fresh": s,
        "half": np.array([b / 2]),
        "ulps": np.array([float(down(down(down(b))))]),
        "at_budget": np.array([b]),
        "spent": spent,
    }


@pytest.mark.parametrize("kind", FILTER_KINDS)
def test_allowance_work_is_the_same_on_every_state(kind):
    filt = make_filter(kind, 1.0, 1e-5)
    run_filt = filt.scaled(0.5)
    traces = {}
    for label, state in states_of(filt).items():

        def decide(state=state):
            allow = round_allowance(
                filt, state, noise_std=3.0, clip=1.0, run_filter=run_filt, run_state=np.minimum(state, run_filt.budget)
            )
            return exhausted(allow, 1.0, 1e-3)

        traces[label] = trace_of(decide)
    assert bool(decide(states_of(filt)["fresh"])) is False and bool(decide(states_of(filt)["spent"])) is True
    first = traces["fresh"]
    assert lines_in(first, "privacy/filters.py") > 0  # the trace sees the filter's own lines
    assert all(t == first for t in traces.values())  # the very same lines and calls, in the same order


def old_closed_form(filt, state, std):
    """The allowance of earlier versions on its fast path (kept bit for bit)."""
    room = np.maximum(sub_down(filt.budget, state), 0.0)
    per = np.sqrt(np.maximum(down(room / filt.weights), 0.0))
    return np.maximum(down(std * np.max(per, axis=-1) * (1 - 64 * 2.0**-52)), 0.0)


@settings(max_examples=300, deadline=None)
@given(
    kind=st.sampled_from(FILTER_KINDS),
    eps=st.floats(0.01, 20),
    log_delta=st.floats(-12, -2),
    log_room=st.floats(-17, 0),
    log_std=st.floats(-3, 4),
)
def test_allowance_is_admitted_and_lands_within_1e_12_of_the_budget(kind, eps, log_delta, log_room, log_std):
    filt = make_filter(kind, eps, 10**log_delta)
    b, w, std = float(filt.budget[0]), float(filt.weights[0]), 10.0**log_std
    state = np.array([b * (1 - 10.0**log_room)])
    a = float(filt.allowance(state, noise_std=std))
    assert filt.admits(state, filt.charge(sensitivity=a, noise_std=std))
    # Exact arithmetic: the true loss after the release is within the budget and within 1e-12 of it.
    after = Fraction(float(state[0])) + Fraction(w) * (Fraction(a) / Fraction(std)) ** 2
    assert Fraction(b) * (1 - Fraction(1, 10**12)) <= after <= Fraction(b)
    if log_room > -2:  # a room of 1% of the budget or more: the earlier fast path, bit for bit
        assert a == float(old_closed_form(filt, state, std))
        exact = std * float((Fraction(b) - Fraction(float(state[0]))) / Fraction(w)) ** 0.5
        assert a == pytest.approx(exact, rel=1e-12)


def test_timing_benchmark_runs_and_its_classifier_is_right():
    root = Path(__file__).resolve().parents[2]
    spec = importlib.util.spec_from_file_location("allowance_timing", root / "benchmarks/allowance_timing.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    assert bench.best_threshold_accuracy(np.array([1.0, 2, 3]), np.array([4.0, 5, 6])) == 1.0
    assert bench.best_threshold_accuracy(np.array([4.0, 5, 6]), np.array([1.0, 2, 3])) == 1.0  # mirror rule
    assert bench.best_threshold_accuracy(np.array([1.0, 4]), np.array([2.0, 3])) == 0.75
    out = subprocess.run(
        [sys.executable, str(root / "benchmarks/allowance_timing.py"), "--samples", "5", "--release"],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert [line.split()[0] for line in out.stdout.splitlines()[1:4]] == list(FILTER_KINDS)
    assert "FilteredClient.release, 5 each" in out.stdout
