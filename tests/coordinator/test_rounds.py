"""One round object per round: ``start`` drives its own loop (never Flower's configure/aggregate pair),
and nothing of a round is left on the strategy between rounds or after the run."""

from __future__ import annotations

import numpy as np
from flwr.app import ConfigRecord, Message, MetricRecord
from helpers.strategy import (
    FakeGrid,
    _client,
    _task_identity,  # noqa: F401 (an autouse fixture: Flower's ids for messages built here)
    as_record,
    global_arrays,
    wrap,
)

from fedfilter.coordinator.rounds import LocalRound, RoundSettings, SecureRound, open_round
from fedfilter.coordinator.run_log import RunLog


def _held_round_state(strategy) -> list[str]:
    """Attributes of the strategy holding anything of a round: a round object, messages or arrays."""
    kinds = (LocalRound, SecureRound, Message, np.ndarray)
    held = []
    for name, value in vars(strategy).items():
        items = value if isinstance(value, (list, tuple)) else [value]
        if any(isinstance(v, kinds) for v in items):
            held.append(name)
    return held


def test_start_drives_one_round_object_per_round_without_configure_or_aggregate_train():
    strategy = wrap()
    calls = []
    strategy.configure_train = lambda *a, **k: calls.append("configure")  # type: ignore[method-assign]
    strategy.aggregate_train = lambda *a, **k: calls.append("aggregate")  # type: ignore[method-assign]
    grid = FakeGrid(nodes=[11, 12, 13], client=_client())
    result = strategy.start(grid=grid, initial_arrays=as_record(global_arrays()), num_rounds=2, timeout=60)
    assert calls == []
    assert sorted(result.train_metrics_clientapp) == [1, 2]
    assert dict(result.train_metrics_clientapp[2]) == {
        "reports-received": 3,
        "markers-received": 0,
        "replies-dropped": 0,
        "released": 1,
    }
    assert _held_round_state(strategy) == []


def test_evaluate_fn_runs_at_round_zero_and_after_every_round_as_in_flowers_loop():
    strategy = wrap()
    seen = []

    def evaluate_fn(server_round, arrays):
        seen.append(server_round)
        return MetricRecord({"loss": float(server_round)})

    grid = FakeGrid(nodes=[11, 12], client=_client())
    result = strategy.start(
        grid=grid, initial_arrays=as_record(global_arrays()), num_rounds=3, timeout=60, evaluate_fn=evaluate_fn
    )
    assert seen == [0, 1, 2, 3]
    assert sorted(result.evaluate_metrics_serverapp) == [0, 1, 2, 3]
    assert result.evaluate_metrics_clientapp == {}


def test_by_hand_only_the_open_round_is_held_and_released_rounds_are_dropped():
    strategy = wrap()
    grid = FakeGrid(nodes=[11, 12], client=_client())
    messages = list(strategy.configure_train(1, as_record(global_arrays()), ConfigRecord(), grid))
    assert _held_round_state(strategy) == ["_open"]
    strategy.aggregate_train(1, grid.send_and_receive(messages))
    assert _held_round_state(strategy) == []


def test_the_round_for_each_placement_says_what_it_asks():
    grid = FakeGrid(nodes=[11, 12, 13], client=_client())
    for placement, kind, asks in (("local", LocalRound, 3), ("distributed", SecureRound, 0)):
        settings = RoundSettings(noise_multiplier=1.0, clip=0.5, placement=placement, min_reports=2)
        strategy = wrap()
        training = open_round(
            settings,
            run_id="r",
            server_round=1,
            arrays=as_record(global_arrays()),
            config=ConfigRecord({"local-epochs": 2}),
            grid=grid,
            inner=strategy.strategy,
            run_log=RunLog(1.0, 0.5, placement, 2),
        )
        assert isinstance(training, kind) and len(training.ask()) == asks and len(training.asked) == 3
    local = LocalRound(
        RoundSettings(noise_multiplier=1.0, clip=0.5, placement="local", min_reports=1),
        run_id="r",
        server_round=4,
        arrays=as_record(global_arrays()),
        config=ConfigRecord({"local-epochs": 2, "lr": 0.1}),
        grid=grid,
        inner=wrap().strategy,
        run_log=RunLog(1.0, 0.5, "local", 1),
    )
    out = local.release(local.collect())
    assert out.outcome.released and out.outcome.reports == 3 and out.arrays is not None
    assert (out.record.round_id, out.record.request.local_epochs, out.record.reports_received) == (4, 2, 3)
