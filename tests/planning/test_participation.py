"""Participation: balanced passes keep every device's asks within one, and the planned quantile of
uniform sampling is scipy's Binomial quantile."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from fedfilter.planning.participation import BalancedSchedule, asks_planned, balanced_asks


@settings(max_examples=300, deadline=None)
@given(data=st.data(), population=st.integers(1, 60), rounds=st.integers(1, 50), seed=st.integers(0, 2**32 - 1))
def test_balanced_passes_ask_each_device_within_one_and_never_twice_a_round(data, population, rounds, seed):
    per_round = data.draw(st.integers(1, population))
    schedule = BalancedSchedule(population, per_round, np.random.default_rng(seed))
    counts = np.zeros(population, dtype=int)
    for _ in range(rounds):
        asked = schedule.next_round()
        assert asked.size == per_round and np.unique(asked).size == per_round
        assert asked.min() >= 0 and asked.max() < population
        counts[asked] += 1
        assert counts.max() - counts.min() <= 1
    assert counts.max() == balanced_asks(rounds, per_round, population)


@pytest.mark.parametrize("rounds,per_round,population", [(20, 200, 1000), (100, 200, 1000), (30, 10, 50), (7, 1, 3)])
@pytest.mark.parametrize("quantile", [0.5, 0.9, 0.99])
def test_the_planned_quantile_is_scipys(rounds, per_round, population, quantile):
    expected = int(stats.binom.ppf(quantile, rounds, per_round / population))
    assert asks_planned(rounds, per_round, population, quantile) == expected


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match=r"per_round must be an integer in \[1, population=3\]. Found 4."):
        BalancedSchedule(3, 4, np.random.default_rng(0))
    with pytest.raises(ValueError, match=r"quantile must lie in \(0, 1\). Found 1.0."):
        asks_planned(10, 1, 2, 1.0)
