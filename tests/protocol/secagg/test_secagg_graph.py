"""The coordinator's SecAgg+ graph choice and its abort bound against independent computations.

References: enumeration of every drop-out set on Flower's own ring with Flower's own threshold rule
(``SecAggPlusWorkflow._check_threshold``), scipy's hypergeometric distribution, and the devices' rule
(``protocol/secagg/rule.py``) for every graph chosen.
"""

from __future__ import annotations

import itertools
import math
from fractions import Fraction

import pytest
from flwr.server.workflow.secure_aggregation.secaggplus_workflow import SecAggPlusWorkflow, WorkflowState
from scipy.stats import hypergeom

from fedfilter.protocol.secagg.graph import (
    ABORT_TARGET,
    SecAggGraph,
    _abort_exact,
    choose_graph,
    graph_abort_probability,
)
from fedfilter.protocol.secagg.rule import graph_problems


def flower_neighbours(n: int, num_shares: int) -> dict[int, set[int]]:
    """Flower 1.42 ``SecAggPlusWorkflow.setup_stage``: ring offsets ``-h..h`` (its shuffle only relabels)."""
    half = num_shares >> 1
    return {i: {(i + off) % n for off in range(-half, half + 1)} for i in range(n)}


def aborting_nodes(n: int, k: int, t: int, alive: set[int]) -> int:
    """How many nodes Flower's rule finds short of ``t`` answering holders (its own code decides each)."""
    neighbours = flower_neighbours(n, k)
    count = 0
    for node in range(n):
        state = WorkflowState()
        state.sampled_node_ids, state.active_node_ids = {node}, alive
        state.nid_to_neighbours, state.threshold = neighbours, t
        # Flower's own rule, private in flwr 1.42: the brute force runs Flower's code, not a copy of it.
        count += not SecAggPlusWorkflow(num_shares=1.0, reconstruction_threshold=2)._check_threshold(state)
    return count


@pytest.mark.parametrize("n, k", [(7, 3), (8, 5), (9, 5), (10, 7), (9, 9), (11, 9)])
def test_the_abort_bound_is_the_expected_number_of_aborting_nodes_on_flowers_ring(n, k):
    """Over every drop-out set of each size: the bound is the exact mean number of nodes Flower's check
    fails (capped at 1), so it bounds the probability that any does."""
    for t in range(2, k + 1):
        for dropped in range(0, n - 1):
            sets = list(itertools.combinations(range(n), dropped))
            counts = [aborting_nodes(n, k, t, set(range(n)) - set(gone)) for gone in sets]
            mean = Fraction(sum(counts), len(sets))
            aborts = Fraction(sum(c > 0 for c in counts), len(sets))
            bound = _abort_exact(n, k, t, dropped)
            assert bound == min(Fraction(1), mean) >= aborts, (n, k, t, dropped)


def test_the_abort_probability_counts_the_rate_as_written_and_rounds_up():
    """``dropout_rate`` 0.3 of 10 nodes is 3 drop-outs (not its binary neighbour's ceiling, 4)."""
    assert graph_abort_probability(10, 7, 5, dropout_rate=0.3) == float(_abort_exact(10, 7, 5, 3))
    exact = _abort_exact(1000, 141, 110, 100)
    assert Fraction(graph_abort_probability(1000, 141, 110, dropout_rate=0.1)) >= exact
    assert float(exact) == graph_abort_probability(1000, 141, 110, dropout_rate=0.1) or Fraction(
        graph_abort_probability(1000, 141, 110, dropout_rate=0.1)
    ) == Fraction(math.nextafter(float(exact), math.inf))


def test_the_abort_bound_against_scipy_at_a_thousand_nodes():
    n, k, dropped = 1000, 141, 100
    for t in (100, 110, 120):
        answering = (n - dropped) * hypergeom.sf(k - t, n - 1, dropped, k - 1)
        gone = dropped * hypergeom.sf(k - t - 1, n - 1, dropped - 1, k - 1)
        ours = graph_abort_probability(n, k, t, dropout_rate=dropped / n)
        assert ours == pytest.approx(min(1.0, answering + gone), rel=1e-6, abs=1e-300)


@pytest.mark.parametrize("colluders", [0, 1, 3])
@pytest.mark.parametrize("n", [3, 5, 10, 33, 100, 1000])
def test_choose_graph_passes_the_devices_rule_meets_the_target_and_is_minimal(n, colluders):
    for m in sorted({1, 2, n // 10, n // 4, n // 2, -(-n // 2), n - colluders} - {0}):
        if m + colluders > n or m < 1:
            with pytest.raises(ValueError, match="exceeds the"):
                choose_graph(n, min_reports=m, colluders=colluders, dropout_rate=0.1)
            continue
        g = choose_graph(n, min_reports=m, colluders=colluders, dropout_rate=0.1)
        k, t = g.num_shares, g.threshold
        assert graph_problems(sample_num=n, share_num=k, threshold=t, min_reports=m, colluders=colluders) == []
        assert k == n or k % 2 == 1  # Flower's ring: an even k below n crashes its clients
        assert t >= max(2, m + colluders)
        assert g.abort_probability == graph_abort_probability(n, k, t, dropout_rate=0.1)
        smaller = [
            j
            for j in range(t, k)
            if (j % 2 == 1 or j == n)
            and not graph_problems(sample_num=n, share_num=j, threshold=t, min_reports=m, colluders=colluders)
        ]
        if g.abort_probability <= ABORT_TARGET:
            assert all(graph_abort_probability(n, j, t, dropout_rate=0.1) > ABORT_TARGET for j in smaller)
        else:  # none meets the target: the allowed k with the fewest aborts
            assert not any(j > k for j in range(k + 1, min(n, 2 * t - 1 - colluders) + 1) if j % 2 or j == n)


def test_a_thousand_devices_with_half_as_min_reports():
    g = choose_graph(1000, min_reports=500, dropout_rate=0.1)
    assert g == SecAggGraph(g.num_shares, 500, g.abort_probability)
    assert 500 < g.num_shares < 1000 and g.abort_probability <= ABORT_TARGET
    assert math.isclose(choose_graph(1000, min_reports=100, dropout_rate=0.1).threshold, 100)


@pytest.mark.parametrize(
    ("call", "field"),
    [
        (lambda: choose_graph(1000, min_reports=10, dropout_rate=1.0), "dropout_rate"),
        (lambda: choose_graph(1000, min_reports=10, dropout_rate=float("nan")), "dropout_rate"),
        (lambda: choose_graph(1, min_reports=1, dropout_rate=0.1), "n"),
        (lambda: choose_graph(10, min_reports=0, dropout_rate=0.1), "min_reports"),
        (lambda: choose_graph(10, min_reports=2, colluders=-1, dropout_rate=0.1), "colluders"),
        (lambda: choose_graph(10, min_reports=8, colluders=3, dropout_rate=0.1), "exceeds the 10 sampled"),
        (lambda: graph_abort_probability(100, 10, 5, dropout_rate=0.1), "odd"),
        (lambda: graph_abort_probability(100, 11, 12, dropout_rate=0.1), "threshold"),
        (lambda: graph_abort_probability(100, 101, 5, dropout_rate=0.1), "num_shares"),
    ],
)
def test_bad_input_names_the_field(call, field):
    with pytest.raises(ValueError, match=field):
        call()
