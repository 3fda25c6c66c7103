"""SecAgg+ neighbourhoods on the device: the fewest reports an unmasking can hold (against a brute force
over Flower's own threshold rule on its ring), the owner's graph limits, and the coordinator's default
graphs passing the default device's check (and a coordinator's weak graph refused, with nothing spent).
"""

from __future__ import annotations

import itertools

import pytest
from flwr.server.workflow.secure_aggregation.secaggplus_workflow import SecAggPlusWorkflow, WorkflowState
from helpers.secagg import assert_refused_before_training, run_round

from fedfilter.client.secagg.neighbourhood import check_secagg_graph
from fedfilter.client.settings.policy import SecAggGraphPolicy
from fedfilter.coordinator.secure_round import RoundGraph, round_graph
from fedfilter.privacy.secagg_graph import PRIVACY_FAILURE_TARGET, graph_failure_probability
from fedfilter.protocol.secagg_grid import fewest_released_reports


def _flower_ring(n: int, k: int) -> dict[int, set[int]]:
    """flwr 1.42 ``setup_stage``'s neighbours (before its shuffle, which only relabels the ring)."""
    half = k >> 1
    return {idx: {(idx + offset) % n for offset in range(-half, half + 1)} for idx in range(n)}


def _flower_halts(n: int, k: int, t: int, alive: set[int]) -> bool:
    state = WorkflowState()
    state.sampled_node_ids, state.active_node_ids = set(range(n)), alive
    state.nid_to_neighbours, state.threshold = _flower_ring(n, k), t
    # Flower's own rule, private in flwr 1.42 and reachable only mid-round: the brute force must run
    # Flower's code, not a copy of it (kept on purpose; the integrator lists it as an allowed private).
    return not SecAggPlusWorkflow(num_shares=1.0, reconstruction_threshold=2)._check_threshold(state)


@pytest.mark.parametrize("n, k", [(5, 3), (7, 3), (8, 5), (9, 5), (10, 7), (6, 6), (7, 7), (11, 9)])
def test_every_sum_flower_unmasks_holds_at_least_the_fewest_released_reports(n, k):
    for t in range(2, k + 1):
        smallest = min(
            (
                len(alive)
                for r in range(n + 1)
                for alive in map(set, itertools.combinations(range(n), r))
                if not _flower_halts(n, k, t, alive)
            ),
            default=None,
        )
        bound = fewest_released_reports(n, k, t)
        assert smallest is None or smallest >= bound, (n, k, t, smallest, bound)
        if k == n:
            assert bound == t and smallest == t  # the full graph: exactly the threshold


def test_the_full_graph_keeps_the_former_rule_threshold_at_least_min_reports():
    state = {"sample_num": 10, "share_num": 10, "threshold": 5}
    assert check_secagg_graph(state, 5, SecAggGraphPolicy()) == []
    (problem,) = check_secagg_graph(state, 6, SecAggGraphPolicy())
    assert "sum of 5 reports" in problem and "threshold 5" in problem and "below min-reports 6" in problem


@pytest.mark.parametrize("n", [3, 10, 100, 1000])
def test_the_coordinators_default_graph_passes_the_default_devices_check(n):
    m = -(-n // 2)  # the app's default min-reports for n clients: ceil(n / 2)
    graph = round_graph(n, m)
    k, t = graph.num_shares, graph.threshold
    assert (k == n or (k % 2 == 1 and k < n)) and k // 2 < t <= k
    assert fewest_released_reports(n, k, t) >= m
    state = {"sample_num": n, "share_num": k, "threshold": t}
    assert check_secagg_graph(state, m, SecAggGraphPolicy()) == []
    assert graph.failure_probability <= PRIVACY_FAILURE_TARGET
    if n >= 100:
        assert k <= 101  # O(log n) holders, not n: the point of the sparse graph
    # The device recomputes the bound itself; it equals the coordinator's for the same rates.
    assert graph.failure_probability == graph_failure_probability(n, k, t, dropout_rate=0.1, corrupt_rate=0.05)


def test_round_graph_keeps_explicit_choices_and_raises_t_to_the_released_floor():
    full = round_graph(10, 4, 1.0)
    assert (full.num_shares, full.threshold) == (10, 6)  # t > k / 2 (consistency round) and >= min_reports
    assert round_graph(10, 4, "1.0") == full  # as a run config holds it
    sparse = round_graph(100, 50, 21)
    assert sparse.num_shares == 21 and fewest_released_reports(100, 21, sparse.threshold) >= 50
    assert round_graph(100, 90, 21).threshold == 19  # ceil(100 * 19 / 21) = 91 >= 90
    assert round_graph(100, 98, 21).num_shares == 100  # no t < 21 holds 98 reports: the full graph
    # A tiny explicit neighbourhood runs, but its bound is far above the default device's limit.
    weak = round_graph(10, 3, 3)
    assert (weak.num_shares, weak.threshold) == (3, 3 // 2 + 1)
    problems = check_secagg_graph({"sample_num": 10, "share_num": 3, "threshold": 2}, 3, SecAggGraphPolicy())
    assert weak.failure_probability > PRIVACY_FAILURE_TARGET and "secagg-max-failure-probability" in problems[0]
    with pytest.raises(ValueError, match="secagg_num_shares"):
        round_graph(10, 3, "many")
    # Fewer sampled than min_reports: a graph Flower halts on (t > n), not an error that ends the run.
    assert round_graph(3, 4) == round_graph(3, 4, 1.0) == RoundGraph(3, 4, 1.0)
    assert round_graph(2, 3) == RoundGraph(2, 3, 1.0)


def test_the_owners_policy_is_checked_and_bad_policies_are_refused_by_name():
    state = {"sample_num": 100, "share_num": 29, "threshold": 18}
    assert check_secagg_graph(state, 50, SecAggGraphPolicy()) == []
    (problem,) = check_secagg_graph(state, 50, SecAggGraphPolicy(min_threshold=20))
    assert "threshold 18 is below this device's secagg-min-threshold 20" in problem
    (problem,) = check_secagg_graph(state, 50, SecAggGraphPolicy(corrupt_rate=0.3))
    assert "secagg-max-failure-probability" in problem and "corrupt rate 0.3" in problem
    assert "not one Flower builds" in check_secagg_graph({**state, "share_num": 28}, 50, SecAggGraphPolicy())[0]
    assert any(
        "exceeds sample_num" in p for p in check_secagg_graph({**state, "share_num": 101}, 50, SecAggGraphPolicy())
    )
    assert "integers" in check_secagg_graph({**state, "share_num": None}, 50, SecAggGraphPolicy())[0]
    with pytest.raises(ValueError) as err:
        SecAggGraphPolicy(max_failure_probability=2.0, min_threshold=1, dropout_rate=1.0, corrupt_rate=float("nan"))
    for word in ("max_failure_probability", "min_threshold", "dropout_rate", "corrupt_rate"):
        assert word in str(err.value)


@pytest.mark.parametrize(
    "over, words",
    [
        ({"secagg-min-threshold": 5}, ["threshold 4 is below this device's secagg-min-threshold 5"]),
        ({"secagg-corrupt-rate": 0.7}, ["secagg-max-failure-probability", "corrupt rate 0.7"]),
    ],
)
def test_a_graph_outside_the_owners_limits_is_refused_before_training(tmp_path, monkeypatch, over, words):
    n = 6  # Flower's full graph of 6 with threshold 4
    result = run_round(tmp_path, monkeypatch, n, threshold=4, node_over={i: over for i in range(n)})
    assert_refused_before_training(tmp_path, result, n, "secure aggregation refused", *words)
