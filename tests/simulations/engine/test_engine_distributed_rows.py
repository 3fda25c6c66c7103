"""Worst-case accounting in distributed placement with one aggregate draw: rows whose charges are the
bound's run the spend template together (``DistributedPlacement._spend_rows``) and only the updates that
enter the sum are trained. The same sums, states and coins as every client through the template alone."""

from __future__ import annotations

import numpy as np
import pytest

from fedfilter.simulations.engine import EngineConfig
from fedfilter.simulations.engine.core import Engine

BUDGETS = [4.0, 8.0] * 5


def _config(sampling: bool, norms: str = "device") -> EngineConfig:
    extra = dict(planned_asks=4, rdp_order=6.0) if sampling else dict(fraction=0.6, participation="balanced")
    return EngineConfig(
        task="digits",
        num_clients=len(BUDGETS),
        epsilon=BUDGETS,
        worst_case_epsilon=[2 * e for e in BUDGETS],
        filter_kind="rdp",
        placement="distributed",
        accounting="worst-case",
        noise_draw="aggregate",
        noise_multiplier=2.0,  # the budget-4 rows sample at 0.57, the budget-8 rows at 1; the 5th ask is past the plan
        clip=0.05,
        min_reports=2,
        rounds=5,
        local_epochs=1,
        group_by="none",
        eval_every=5,
        torch_threads=1,
        norms=norms,
        **extra,
    )


def _run(config: EngineConfig, batched: bool, trained: list[int]):
    engine = Engine(config)
    engine._distributed.batched = batched
    updates = engine._updates

    def counted(clients):
        trained.append(len(clients))
        return updates(clients)

    engine._updates = counted
    records = [engine.step() for _ in range(config.rounds)]
    return engine, records


@pytest.mark.parametrize(
    "sampling, norms",
    [(True, "device"), (True, "vectorised"), (False, "device")],
    ids=["devices-sample", "devices-sample-vectorised-norms", "coordinator-asks"],
)
def test_rows_spent_together_match_every_client_spent_alone(sampling, norms):
    config = _config(sampling, norms)
    together, alone = [], []
    a, rec_a = _run(config, True, together)
    b, rec_b = _run(config, False, alone)
    assert np.array_equal(a.state, b.state)
    assert np.array_equal(a.run_state, b.run_state)
    assert np.array_equal(a.worst_state, b.worst_state)
    assert all(np.array_equal(x, y) for x, y in zip(a.weights, b.weights))
    assert [r.kept for r in rec_a] == [r.kept for r in rec_b]
    assert [r.contributing for r in rec_a] == [r.contributing for r in rec_b]
    assert all(r.released for r in rec_a)
    # Only the kept updates were trained together; alone, every active client trains.
    assert sum(together) == (sum(r.kept for r in rec_a) if sampling else sum(r.contributing for r in rec_a))
    assert sum(alone) == sum(r.contributing for r in rec_b)
    if sampling:
        assert 0 < sum(together) < sum(alone)
    assert a.state.any()


def test_each_row_is_charged_the_worst_case_so_a_budget_group_moves_as_one():
    engine, _ = _run(_config(True), True, [])
    for g in (0, 1):
        rows = engine.state[engine.group == g]
        assert np.array_equal(rows, np.broadcast_to(rows[0], rows.shape))


def test_the_coins_of_many_clients_at_once_are_each_devices_own_coin():
    """``device_coins`` computes every client's first ChaCha20 word at once; each must be the word the
    device's own stream gives (``NoiseStream``, the ``cryptography`` cipher), at every kind of rate."""
    from fedfilter.client.mechanisms.sampled import coin
    from fedfilter.simulations.engine.seeds import client_noise_stream, device_coins

    rng = np.random.default_rng(5)
    clients = rng.integers(0, 10**9, 400)
    rates = np.concatenate([rng.random(250), np.ones(50), np.zeros(50), np.full(50, 0.5)])
    together = device_coins(3, "run-7", 12, clients, rates)
    alone = [bool(coin(client_noise_stream(3, int(c), "run-7", 12), float(r))) for c, r in zip(clients, rates)]
    assert together.tolist() == alone
    assert together[250:300].all() and not together[300:350].any() and 0 < together[350:].sum() < 50
