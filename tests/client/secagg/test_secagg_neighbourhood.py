"""SecAgg+ graphs on the device: the rule it checks (``protocol/secagg/rule.py``) against a brute force
of the counting argument behind it, the coordinator's graphs always accepted and nothing else, the
owner's limits, and a graph outside them refused with nothing spent.
"""

from __future__ import annotations

import itertools

import pytest
from helpers.secagg import assert_refused_before_training, run_round
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from fedfilter.client.secagg.neighbourhood import SecAggStateCheck, assess_secagg_state, check_secagg_graph
from fedfilter.client.settings.node_config import RETIRED_KEYS, device_config
from fedfilter.client.settings.policy import SecAggGraphPolicy
from fedfilter.coordinator.secagg.secure_round import AUTO_SHARES, RoundGraph, round_graph
from fedfilter.protocol.secagg.graph import choose_graph
from fedfilter.protocol.secagg.rule import fewest_honest_reports, graph_problems


def both_kinds_possible(k: int, t: int, c: int) -> bool:
    """Brute force of the step the bound rests on: can a coordinator, with ``c`` colluders among a node's
    ``k`` holders, get ``t`` key shares of a node that authenticated itself as a survivor and was shown
    ``t - 1`` tags? Each other holder is a tagger (honest, believes the node alive), a revealer (honest,
    believes it dropped), silent, or a colluder (tags and reveals)."""
    others = k - 1
    for colluding in range(0, min(c, others) + 1):
        for taggers in range(0, others - colluding + 1):
            revealers = others - colluding - taggers
            if taggers + colluding >= t - 1 and revealers + colluding >= t:
                return True
    return False


@pytest.mark.parametrize("k", range(2, 12))
def test_the_rule_is_exactly_where_a_survivor_can_lose_its_key(k):
    """``2 t > k + c`` holds exactly when no split of a survivor's holders yields both its tags and its key."""
    for t in range(2, k + 1):
        for c in range(0, k):
            refused = any(
                "must exceed half" in p
                for p in graph_problems(sample_num=k, share_num=k, threshold=t, min_reports=1, colluders=c)
            )
            assert refused == both_kinds_possible(k, t, c), (k, t, c)


def test_the_bound_is_the_threshold_less_the_colluders_whatever_the_claimed_population():
    for n in (10, 200, 10**6):  # the claimed population changes nothing
        assert graph_problems(sample_num=n, share_num=9, threshold=9, min_reports=9) == []
        (problem,) = graph_problems(sample_num=n, share_num=9, threshold=8, min_reports=9)
        assert "leaves 8 honest reports" in problem and "below min-reports 9" in problem
    assert fewest_honest_reports(12, 2) == 10
    assert graph_problems(sample_num=30, share_num=21, threshold=12, min_reports=10, colluders=2) == []
    problems = graph_problems(sample_num=30, share_num=21, threshold=12, min_reports=10, colluders=3)
    assert any("leaves 9" in p for p in problems)


def accepted(n, k, t, m, c) -> bool:
    """The rule written out independently: a graph Flower can run, whose threshold holds m honest reports
    with c colluders and exceeds half the holders plus the colluders."""
    return 2 <= t <= k <= n and t - c >= m and 2 * t > k + c


@pytest.mark.parametrize("c", [0, 1, 2])
def test_the_device_accepts_exactly_the_graphs_the_rule_allows(c):
    policy = SecAggGraphPolicy(colluders=c)
    for n, m in itertools.product(range(2, 12), range(1, 8)):
        for k in range(2, n + 1):
            for t in range(1, k + 1):
                state = {"sample_num": n, "share_num": k, "threshold": t}
                assert (check_secagg_graph(state, m, policy) == []) == accepted(n, k, t, m, c), (n, k, t, m, c)


@settings(max_examples=300, deadline=None)
@given(
    n=st.integers(2, 3000),
    m_fraction=st.floats(0.0, 1.0),
    c=st.integers(0, 5),
    shares=st.one_of(st.just(AUTO_SHARES), st.sampled_from([1.0, 0.5, 0.1]), st.sampled_from([3, 5, 21, 101])),
)
def test_whatever_the_coordinator_picks_the_device_accepts(n, m_fraction, c, shares):
    m = max(1, round(m_fraction * n))
    graph = round_graph(n, m, shares, colluders=c)
    state = {"sample_num": n, "share_num": graph.num_shares, "threshold": graph.threshold}
    if m + c > n:  # no round can be unmasked: Flower halts after its setup stage
        assert graph.abort_probability == 1.0 and graph.threshold == max(2, m + c) > n
        return
    assert check_secagg_graph(state, m, SecAggGraphPolicy(colluders=c)) == []
    assert graph.num_shares == n or graph.num_shares % 2 == 1


def test_round_graph_keeps_explicit_choices_and_raises_t_to_the_rule():
    full = round_graph(10, 4, 1.0)
    assert (full.num_shares, full.threshold) == (10, 6)  # 2 t > k, and t >= min_reports
    assert round_graph(10, 4, "1.0") == full  # as a run config holds it
    sparse = round_graph(100, 50, 101)
    assert (sparse.num_shares, sparse.threshold) == (100, 51)
    assert round_graph(100, 10, 21).threshold == 11  # 2 t > 21
    assert round_graph(100, 30, 21).num_shares == 31  # 21 holders cannot hold a threshold of 30
    assert round_graph(100, 30, 21, colluders=2).threshold == 32
    with pytest.raises(ValueError, match="secagg_num_shares"):
        round_graph(10, 3, "many")
    with pytest.raises(ValueError, match="secagg_colluders"):
        round_graph(10, 3, colluders=-1)
    # Fewer sampled than min_reports: a graph Flower halts on (t > n), not an error that ends the run.
    assert round_graph(3, 4) == round_graph(3, 4, 1.0) == RoundGraph(3, 4, 1.0)
    assert round_graph(2, 3) == RoundGraph(2, 3, 1.0)


def test_the_owners_policy_is_checked_and_bad_policies_are_refused_by_name():
    state = {"sample_num": 100, "share_num": 29, "threshold": 18}
    assert check_secagg_graph(state, 18, SecAggGraphPolicy()) == []
    (problem,) = check_secagg_graph(state, 18, SecAggGraphPolicy(min_threshold=20))
    assert "threshold 18 is below this device's secagg-min-threshold 20" in problem
    problems = check_secagg_graph(state, 18, SecAggGraphPolicy(colluders=1))
    assert any("threshold 18 with 1 colluders leaves 17 honest reports" in p for p in problems)
    too_many = check_secagg_graph({**state, "share_num": 101}, 18, SecAggGraphPolicy())
    assert any("exceeds sample_num" in p for p in too_many)
    assert "integers" in check_secagg_graph({**state, "share_num": None}, 18, SecAggGraphPolicy())[0]
    with pytest.raises(ValueError) as err:
        SecAggGraphPolicy(min_threshold=1, colluders=-2)
    for word in ("min_threshold", "colluders"):
        assert word in str(err.value)


@pytest.mark.parametrize("key", sorted(RETIRED_KEYS))
def test_a_retired_graph_setting_is_refused_by_name_not_ignored(tmp_path, key):
    """An owner who set an assumed corruption or failure rate relied on it: the device says it no longer
    reads it and what replaced it, rather than serve rounds under an assumption it does not make."""
    config = {"ledger-dir": str(tmp_path / "d"), "budget-epsilon": 1.0, key: 0.1}
    with pytest.raises(ValueError) as err:
        device_config(config)
    assert key in str(err.value) and "secagg-colluders" in str(err.value)


@pytest.mark.parametrize(
    "over, words",
    [
        ({"secagg-min-threshold": 5}, ["threshold 4 is below this device's secagg-min-threshold 5"]),
        ({"secagg-colluders": 1}, ["threshold 4 with 1 colluders leaves 3 honest reports"]),
    ],
)
def test_a_graph_outside_the_owners_limits_is_refused_before_training(tmp_path, monkeypatch, over, words):
    n = 6  # Flower's full graph of 6 with threshold 4, min-reports 4
    result = run_round(tmp_path, monkeypatch, n, threshold=4, node_over={i: over for i in range(n)})
    assert_refused_before_training(tmp_path, result, n, "secure aggregation refused", *words)


def secagg_setup(n: int, k: int, t: int) -> dict:
    """A saved SecAgg+ state whose grid is sound for up to 2**11 nodes: only the graph can be at fault."""
    grid = {"target_range": 2**20, "clipping_range": 2.0**19, "mod_range": 2**32, "max_weight": 1.0}
    return {**grid, "sample_num": n, "share_num": k, "threshold": t}


@settings(max_examples=200, deadline=None)
@given(
    n=st.integers(2, 2000),
    m_fraction=st.floats(0.0, 1.0),
    c=st.integers(0, 5),
    dropout_rate=st.floats(0.0, 0.6),
)
def test_the_device_accepts_what_the_coordinator_picks_and_nothing_else(n, m_fraction, c, dropout_rate):
    """Both ways the coordinator picks a graph (``choose_graph``, ``round_graph``) pass the device's whole
    check; a threshold one lower, and share counts the rule forbids, are refused for the graph alone, with
    exactly the rule's own problems (the device adds and drops none)."""
    m = max(1, round(m_fraction * n))
    assume(m + c <= n)
    policy = SecAggGraphPolicy(colluders=c)
    picked = choose_graph(n, min_reports=m, colluders=c, dropout_rate=dropout_rate)
    via_round = round_graph(n, m, AUTO_SHARES, colluders=c, dropout_rate=dropout_rate)
    for k, t in {(picked.num_shares, picked.threshold), (via_round.num_shares, via_round.threshold)}:
        assert assess_secagg_state(secagg_setup(n, k, t), m, policy) == SecAggStateCheck(setup=[], graph=[])

        def verdict(k2: int, t2: int) -> tuple[SecAggStateCheck, list[str]]:
            rule = graph_problems(sample_num=n, share_num=k2, threshold=t2, min_reports=m, colluders=c)
            return assess_secagg_state(secagg_setup(n, k2, t2), m, policy), rule

        device, rule = verdict(k, t - 1)  # the coordinator picks the smallest threshold the rule allows
        assert rule and device == SecAggStateCheck(setup=[], graph=rule)
        forbidden = [k2 for k2 in (2 * t - c, n + 1, t - 1) if k2 >= 2]  # 2 t <= k + c; k > n; t > k
        for k2 in forbidden:
            device, rule = verdict(k2, t)
            assert rule and device == SecAggStateCheck(setup=[], graph=rule), k2
        for k2 in range(max(2, t - 2), min(n, 2 * t - c) + 2):  # around the allowed range: the same verdict
            device, rule = verdict(k2, t)
            assert device == SecAggStateCheck(setup=[], graph=rule), k2


def test_the_verdict_keeps_the_setups_problems_apart_from_the_graphs():
    sound = secagg_setup(10, 10, 6)
    assert assess_secagg_state(sound, 6) == SecAggStateCheck(setup=[], graph=[])
    graph_only = assess_secagg_state({**sound, "threshold": 5}, 6)
    assert not graph_only.setup and graph_only.graph == graph_problems(
        sample_num=10, share_num=10, threshold=5, min_reports=6
    )
    # a grid too small for the population (10 * 2**30 >= 2**32): the setup's problem, the graph still checked
    both = assess_secagg_state({**sound, "threshold": 5, "target_range": 2**30, "clipping_range": 2.0**29}, 6)
    assert both.setup and both.graph == graph_only.graph and both.problems == both.setup + both.graph
    untyped = assess_secagg_state({**sound, "share_num": None}, 6)
    assert untyped.setup and untyped.graph == []  # a field that is no integer: the graph is not read


def test_a_drop_out_rate_that_drops_every_node_aborts_every_round():
    # ceil(0.6 * 2) = 2 of 2 nodes drop: no node answers, so no round can be unmasked (and no crash)
    assert choose_graph(2, min_reports=1, dropout_rate=0.6).abort_probability == 1.0
    assert round_graph(3, 1, 3, dropout_rate=0.9).abort_probability == 1.0
