"""The engine's distributed rounds on SecAgg+'s graph: Flower's ring, its threshold, and the delta
each client's guarantee carries for the graph's failure probability (issue 23)."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from fedfilter.privacy.secagg_graph import SecAggGraph, choose_graph, honest_coordinator_delta
from fedfilter.simulations.engine import Engine, EngineConfig, run_engine
from fedfilter.simulations.engine.distributed_round import ring_unmasks
from fedfilter.simulations.engine.seeds import graph_rng
from fedfilter.simulations.tasks.registry import load_task

N = 30


def brute_unmasks(sent: list[bool], num_shares: int, threshold: int) -> bool:
    """Flower's neighbour sets (offsets -h..h over the ring order), every node checked one by one."""
    n, half = len(sent), num_shares >> 1
    for i in range(n):
        holders = {(i + off) % n for off in range(-half, half + 1)}
        if sum(sent[j] for j in holders) < threshold:
            return False
    return True


def test_ring_unmasks_matches_a_node_by_node_check():
    for n in (5, 8, 11):
        for num_shares in range(3, n + 1, 2):
            for threshold in range(1, num_shares + 1):
                for sent in itertools.product([False, True], repeat=n):
                    assert ring_unmasks(np.array(sent), num_shares, threshold) == brute_unmasks(
                        list(sent), num_shares, threshold
                    ), (n, num_shares, threshold, sent)


@pytest.fixture(scope="module")
def digits():
    return load_task("digits", num_clients=N)


def config(**kw) -> EngineConfig:
    base = dict(
        task="digits",
        num_clients=N,
        filter_kind="rdp",
        placement="distributed",
        min_reports=4,
        noise_multiplier=3.0,
        clip=0.1,
        rounds=6,
        local_epochs=1,
        lr=0.5,
        group_by="none",
        torch_threads=1,
        noise_draw="aggregate",
        eval_every=100,
        # a third of the clients are spent before round 1 and leave: they drop out of every ring;
        # client 1 is spent too but keeps sending pure noise, a masked report like any other
        epsilon=[1e-4 if i % 3 == 0 or i == 1 else 8.0 for i in range(N)],
        after_exhaustion=["leave" if i % 3 == 0 else "noise-only" for i in range(N)],
        secagg_graph="sparse",
        secagg_dropout_rate=0.2,
        worst_case_epsilon=1000.0,  # does not bind: these tests are about the graph
    )
    return EngineConfig(**{**base, **kw})


@pytest.mark.parametrize("assumed", [0.1, 0.34])
def test_sparse_rounds_release_exactly_when_flowers_ring_unmasks_within_the_assumed_dropouts(digits, assumed):
    """A third of the clients leave: beyond an assumed 10% no round is released (the failure bound
    would not cover it); within an assumed 34% a round is released iff the ring unmasks."""
    cfg = config(secagg_dropout_rate=assumed, rounds=4)
    res = run_engine(cfg, task=digits)
    assert res.graph == choose_graph(N, dropout_rate=assumed, corrupt_rate=0.0)
    k, t = res.graph.num_shares, res.graph.threshold
    assert k < N  # a sparse graph
    sent = np.array([i % 3 != 0 for i in range(N)])
    within = N - sent.sum() <= math.ceil(assumed * N)
    expected = []
    for round_id in range(1, cfg.rounds + 1):
        order = graph_rng(cfg.seed, cfg.run_id, round_id).permutation(N)
        expected.append(bool(within and brute_unmasks(list(sent[order]), k, t)))
    assert [r.released for r in res.rounds] == expected
    assert any(expected) == within
    # each client is accounted for every round it sent a masked report in, released or not
    assert np.array_equal(res.graph_rounds, np.where(sent, cfg.rounds, 0))


def test_full_graph_is_the_flower_paths_default(digits):
    res = run_engine(config(secagg_graph="full", rounds=2), task=digits)
    # The coordinator's round_graph for Flower's full graph: t above half of k = N (what the devices'
    # consistency round requires, issue 22) and at least min_reports = 4: t = N // 2 + 1 = 16.
    assert (res.graph.num_shares, res.graph.threshold, res.graph.failure_probability) == (N, N // 2 + 1, 0.0)
    assert all(r.released for r in res.rounds)  # 20 reports >= threshold 16 on the full graph


def test_honest_coordinator_delta_adds_the_graph_failure_per_round_reported(digits):
    res = run_engine(config(rounds=2), task=digits)
    beta = 3.0e-13
    res.graph = SecAggGraph(res.graph.num_shares, res.graph.threshold, beta, 0.0)
    got = res.honest_coordinator_delta()
    for i in range(N):
        assert got[i] == honest_coordinator_delta(1e-5, [beta] * int(res.graph_rounds[i]))
    assert got[1] > 1e-5 + 1.9 * beta and got[0] == 1e-5


def test_graph_rounds_survive_a_checkpoint(digits, tmp_path):
    from fedfilter.simulations.engine.checkpoint import load_checkpoint, save_checkpoint

    engine = Engine(config(rounds=3), task=digits)
    engine.step()
    save_checkpoint(tmp_path / "c.npz", engine.snapshot(), {})
    again = Engine(config(rounds=3), task=digits)
    again.restore(load_checkpoint(tmp_path / "c.npz")[0])
    assert np.array_equal(again.graph_rounds, engine.graph_rounds) and again.graph_rounds.sum() > 0
    snap = engine.snapshot()
    del snap["graph_rounds"]
    with pytest.raises(ValueError, match="graph_rounds"):
        Engine(config(rounds=3), task=digits).restore(snap)


@pytest.mark.parametrize(
    ("field", "value"),
    [("secagg_graph", "ring"), ("secagg_dropout_rate", 1.0), ("secagg_corrupt_rate", -0.1)],
)
def test_bad_graph_settings_name_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        config(**{field: value})
