"""The engine's distributed rounds on SecAgg+'s graph: Flower's ring and its threshold, on the graph
the coordinator's own rule picks."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from fedfilter.coordinator.secagg.secure_round import round_graph
from fedfilter.protocol.secagg.graph import choose_graph
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
def test_sparse_rounds_release_exactly_when_flowers_ring_unmasks(digits, assumed):
    """A third of the clients leave. The assumed drop-out rate only sizes the graph (privacy does not
    rest on it): a round is released iff Flower's ring can be unmasked."""
    cfg = config(secagg_dropout_rate=assumed, rounds=6)
    res = run_engine(cfg, task=digits)
    assert res.graph == choose_graph(N, min_reports=4, dropout_rate=assumed)
    k, t = res.graph.num_shares, res.graph.threshold
    assert k < N and t == 4  # a sparse graph, its threshold min_reports
    sent = np.array([i % 3 != 0 for i in range(N)])
    expected = []
    for round_id in range(1, cfg.rounds + 1):
        order = graph_rng(cfg.seed, cfg.run_id, round_id).permutation(N)
        expected.append(brute_unmasks(list(sent[order]), k, t))
    assert [r.released for r in res.rounds] == expected
    # each client is accounted for every round it sent a masked report in, released or not
    assert np.array_equal(res.graph_rounds, np.where(sent, cfg.rounds, 0))


def test_a_sparse_round_without_drop_outs_is_released(digits):
    res = run_engine(config(epsilon=8.0, after_exhaustion="noise-only", rounds=2), task=digits)
    assert all(r.released for r in res.rounds)


def test_full_graph_is_the_flower_paths_default(digits):
    res = run_engine(config(secagg_graph="full", rounds=2), task=digits)
    # The coordinator's round_graph for Flower's full graph: t above half of k = N (the devices' rule)
    # and at least min_reports = 4: t = N // 2 + 1 = 16.
    assert (res.graph.num_shares, res.graph.threshold) == (N, N // 2 + 1)
    assert all(r.released for r in res.rounds)  # 20 reports >= threshold 16 on the full graph


def test_the_engine_allows_colluders_as_the_coordinator_does(digits):
    res = run_engine(config(secagg_colluders=2, rounds=1), task=digits)
    g = round_graph(N, 4, "auto", colluders=2, dropout_rate=0.2)
    assert (res.graph.num_shares, res.graph.threshold) == (g.num_shares, g.threshold) and g.threshold == 6


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
    [("secagg_graph", "ring"), ("secagg_dropout_rate", 1.0), ("secagg_colluders", -1), ("secagg_colluders", 0.5)],
)
def test_bad_graph_settings_name_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        config(**{field: value})
