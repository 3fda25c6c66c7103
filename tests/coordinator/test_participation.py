"""Participation that matches the plan, on the real strategy behind a fake Grid: balanced passes ask
every node within one of the others, a node asked beyond its plan is named exactly when it is (in
the log and counted in the round's public record), and nodes that vanish or join late break nothing.
The asks are counted here from what the grid was sent, independently of the strategy's counter."""

from __future__ import annotations

import logging
import random
import re
from collections import Counter

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp.strategy import FedAvg
from harness.secagg_loopback import LoopbackGrid, stage_of
from helpers.strategy import (
    NODES,
    FakeGrid,
    _client,
    _task_identity,  # noqa: F401 (an autouse fixture: Flower's ids for messages built here)
    as_record,
    global_arrays,
    wrap,
)

from fedfilter.client.filter_mod import individual_filter_mod
from fedfilter.client.secagg.mod import secure_aggregation_mod
from fedfilter.client.settings.node_config import enrol_device
from fedfilter.coordinator.participation import ASKED_BEYOND_PLAN, AskCounter, Participation
from fedfilter.coordinator.public_ledger import PublicLedger
from fedfilter.coordinator.strategy import IndividualFilterStrategy
from fedfilter.planning.participation import balanced_asks
from fedfilter.protocol.wire import ARRAYS_RECORD

BEYOND = re.compile(r"round (\d+) asks node (\d+) for the (\d+)-th time; its plan paid for (\d+) asks")


def _inner(per_round=3):
    return FedAvg(fraction_train=per_round / len(NODES), min_available_nodes=1, min_train_nodes=1, fraction_evaluate=0)


def _run(strategy, grid, rounds):
    strategy.start(grid=grid, initial_arrays=as_record(global_arrays()), num_rounds=rounds, timeout=60)
    return [[int(m.metadata.dst_node_id) for m in sent] for sent in grid.sent if sent]


def _warned(caplog):
    return [tuple(map(int, m.groups())) for r in caplog.records if (m := BEYOND.search(r.getMessage()))]


@pytest.mark.parametrize("rounds", [1, 4, 7, 10])
def test_balanced_passes_ask_every_node_within_one_over_a_run(rounds, caplog):
    caplog.set_level(logging.WARNING)
    planned = balanced_asks(rounds, 3, len(NODES))
    strategy = wrap(_inner(), participation=Participation("balanced", planned, population=len(NODES), seed=3))
    asked = _run(strategy, FakeGrid(client=_client()), rounds)
    assert len(asked) == rounds and all(len(r) == len(set(r)) == 3 for r in asked)
    counts = Counter(n for r in asked for n in r)
    counts.update({n: 0 for n in NODES})
    assert max(counts.values()) - min(counts.values()) <= 1
    assert max(counts.values()) == planned and not _warned(caplog)


def test_the_passes_follow_the_public_seed():
    def asked(seed):
        strategy = wrap(_inner(), participation=Participation("balanced", 3, population=len(NODES), seed=seed))
        return _run(strategy, FakeGrid(client=_client()), 4)

    random.seed(1)
    first = asked(5)
    random.seed(2)  # Flower's own sampling draws differently: the schedule does not follow it
    assert asked(5) == first and asked(6) != first


def test_a_node_asked_beyond_its_plan_is_named_exactly_then(tmp_path, caplog):
    caplog.set_level(logging.WARNING)
    random.seed(0)  # Flower's FedAvg samples with Python's generator
    ledger = tmp_path / "public.sqlite"
    strategy = wrap(_inner(), participation=Participation("uniform", 1, population=len(NODES)), public_ledger=ledger)
    asked = _run(strategy, FakeGrid(client=_client()), 6)
    # Independently: each node's k-th ask with k > 1 is one warning, in that round.
    seen, expected = Counter(), []
    for round_id, nodes in enumerate(asked, start=1):
        for node in nodes:
            seen[node] += 1
            if seen[node] > 1:
                expected.append((round_id, node, seen[node], 1))
    assert expected and _warned(caplog) == expected
    with PublicLedger(ledger, read_only=True) as public:
        per_round = [int(r.metrics[ASKED_BEYOND_PLAN]) for r in public.records("run-w")]
        config = public.runs()[0].config_json
    assert per_round == [sum(1 for e in expected if e[0] == r) for r in range(1, 7)]
    assert '"asks-planned": 1' in config and '"participation": "uniform"' in config


class _ChangingGrid(FakeGrid):
    """A grid whose nodes change after some rounds: node 11 leaves, node 99 joins."""

    def __init__(self, change_after, **kwargs):
        super().__init__(**kwargs)
        self.change_after = change_after

    def send_and_receive(self, messages, *, timeout=None):
        replies = super().send_and_receive(messages, timeout=timeout)
        if len([s for s in self.sent if s]) == self.change_after:
            self.nodes = [n for n in self.nodes if n != 11] + [99]
        return replies


def test_nodes_that_vanish_or_join_late_are_skipped_or_stand_in_and_said(caplog):
    caplog.set_level(logging.INFO)
    strategy = wrap(_inner(), participation=Participation("balanced", 10, population=len(NODES)))
    grid = _ChangingGrid(2, client=_client())
    asked = _run(strategy, grid, 8)
    assert len(asked) == 8 and all(len(set(r)) == 3 for r in asked)
    assert all(11 not in r for r in asked[2:])  # gone: never asked again
    assert any(99 in r for r in asked[2:])  # stand-in for the scheduled node that left
    assert "skips scheduled nodes not connected: [11]" in caplog.text
    assert "node 99 joined after the balanced passes were drawn" in caplog.text


def test_a_grid_of_another_size_than_the_plan_is_said(caplog):
    caplog.set_level(logging.WARNING)
    counter = AskCounter(Participation("balanced", 2, population=20))
    assert len(counter.choose(NODES, 3, round_id=1)) == 3
    assert "the plan counted a population of 20" in caplog.text


def test_hand_driven_rounds_are_addressed_and_counted():
    strategy = wrap(_inner(), participation=Participation("balanced", 1, population=len(NODES)))
    grid = FakeGrid(client=_client())
    nodes = []
    for round_id in (1, 2, 3):
        messages = list(strategy.configure_train(round_id, as_record(global_arrays()), _config(), grid))
        nodes += [m.metadata.dst_node_id for m in messages]
        strategy.aggregate_train(round_id, grid.send_and_receive(messages))
    assert len(nodes) == len(set(nodes)) == 9  # three rounds of three, none twice within a pass of ten
    assert strategy._asks.asks == dict.fromkeys(nodes, 1)


def _config():
    return ConfigRecord({"local-epochs": 1, "lr": 0.1})


def test_bad_participation_is_named():
    with pytest.raises(ValueError, match=r"participation asks_planned must be an integer >= 1. Found 0."):
        wrap(participation=Participation("balanced", 0))
    with pytest.raises(ValueError, match=r"participation must be a Participation or None. Found 'balanced'."):
        wrap(participation="balanced")


def test_distributed_rounds_ask_the_scheduled_nodes_through_secagg(tmp_path):
    # The product's devices (SecAgg+ mod and filter mod) behind the in-process SecAgg+ loopback.
    nodes = list(range(100, 108))
    configs = {}
    for n in nodes:
        configs[n] = {
            "ledger-dir": str(tmp_path / str(n)),
            "client-id": f"d{n}",
            "budget-epsilon": 50.0,
            "worst-case-epsilon": 1000.0,
            "budget-delta": 1e-5,
            "filter": "rdp",
            "reply-hold-s": 0,
        }
        enrol_device(configs[n])

    def train(msg, ctx):
        return Message(RecordDict({ARRAYS_RECORD: msg.content[ARRAYS_RECORD]}), reply_to=msg)

    def device():
        app = ClientApp(mods=[secure_aggregation_mod, individual_filter_mod])
        app.train()(train)
        return app

    grid = LoopbackGrid({n: device() for n in nodes}, configs)
    strategy = IndividualFilterStrategy(
        FedAvg(fraction_train=0.5, min_available_nodes=len(nodes), fraction_evaluate=0.0),
        noise_multiplier=0.5,
        clip=1.0,
        placement="distributed",
        min_reports=3,
        run_name="d",
        participation=Participation("balanced", 2, population=len(nodes), seed=1),
    )
    arrays = ArrayRecord({"w": Array(np.zeros(16, np.float32))})
    strategy.start(grid=grid, initial_arrays=arrays, num_rounds=4, timeout=60)
    first_stage = stage_of(grid.sent[0])
    asked = Counter(int(m.metadata.dst_node_id) for m in grid.sent if stage_of(m) == first_stage)
    assert asked == dict.fromkeys(nodes, 2)  # 4 rounds of 4 over 8 nodes: two passes, each node twice
