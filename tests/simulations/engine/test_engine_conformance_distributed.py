"""The engine's distributed placement against the Flower path under SecAgg+, same seeds.

The reference is the real code path without the transport: ``IndividualFilterStrategy`` (placement
``distributed``) runs each round through Flower's ``SecAggPlusWorkflow`` over
``tests/harness/secagg_loopback.py``,
whose nodes are the built-in ClientApp's ``train`` handler under the device's own mods
``[secure_aggregation_mod, individual_filter_mod]`` with a device ``node_config`` (own rdp ledger on disk,
own budget, ``noise-seed``). The engine (``noise_draw="per-client"``) must reproduce every device's
lifetime and run filter states bitwise, what the coordinator saw (reports in each sum, released), and
the model: the integer sum of the reports is exact whatever the order, so the mean is too.
"""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord
from flwr.clientapp import ClientApp
from flwr.serverapp.strategy import FedAvg
from flwr.supercore.task_identity import TaskIdentity
from harness.secagg_loopback import LoopbackGrid

from fedfilter.app.client_app import train as client_train
from fedfilter.client.filter_mod import individual_filter_mod
from fedfilter.client.ledger.budget import BudgetLedger
from fedfilter.client.secagg.mod import secure_aggregation_mod
from fedfilter.client.settings.node_config import enrol_device
from fedfilter.coordinator.strategy import IndividualFilterStrategy
from fedfilter.protocol.adaptive_clip import AdaptiveClipping
from fedfilter.simulations.engine import EngineConfig, run_engine
from fedfilter.simulations.engine.seeds import client_noise_seed
from fedfilter.simulations.tasks.registry import load_task
from fedfilter.simulations.tasks.training import get_weights

N, ROUNDS, SEED, RUN = 10, 4, 7, "conformance-sa"
Z, CLIP, M = 3.0, 0.1, 4
# At z = 3 a full-clip round costs rho = 1/18 and digits updates (lr 0.5) are about the clip: budgets
# from spent-before-round-1 (1e-4) to a few rounds' worth; noise-only and leave alternate.
EPSILONS = [1e-4, 0.5, 1.0, 2.0, 8.0, 1e-4, 0.5, 1.0, 2.0, 8.0]
# Each device's worst-case-epsilon (its share read alone, 1/M of the sum's variance): 2x binds before the
# main budget for some devices, 40x for none; the engine keeps both accounts bitwise as the ledgers do.
WORST = [2 * e for e in EPSILONS[:5]] + [40 * e for e in EPSILONS[5:]]
AFTER = ["noise-only", "leave"] * 5
TRAIN = {
    "task": "digits",
    "num-clients": N,
    "partition": "iid",
    "alpha": 0.5,
    "partition-seed": 0,
    "local-epochs": 1,
    "lr": 0.5,
    "batch-size": 32,
}


def flower_reference(tmp_path, run_quota: float = 1.0, adaptive=None, sampling=None, order=None, after=AFTER):
    torch.set_num_threads(1)
    torch.manual_seed(SEED)
    # Flower's SecAgg+ workflow shuffles the nodes into its ring with Python's global generator, and
    # FedAvg samples with it: seeded here, so the reference is the same run every time (unseeded, a
    # round with drop-outs was unmasked or not depending on the process: about 1 run in 8).
    random.seed(SEED)
    model = load_task("digits", num_clients=1).model_fn()
    keys, weights = list(model.state_dict().keys()), get_weights(model)
    app = ClientApp(mods=[secure_aggregation_mod, individual_filter_mod])  # the built-in app's own order
    app.train()(client_train)
    configs = {
        100 + k: {
            "partition-id": k,
            "num-partitions": N,
            "ledger-dir": str(tmp_path / f"dev{k}"),
            "client-id": f"dev{k}",
            "budget-epsilon": EPSILONS[k],
            "worst-case-epsilon": WORST[k],
            "budget-delta": 1e-5,
            "filter": "rdp",
            **({} if order is None else {"rdp-order": order[k]}),
            "run-quota": run_quota,
            "after-exhaustion": after[k],
            "noise-seed": client_noise_seed(SEED, k),
            "reply-hold-s": 0,
        }
        for k in range(N)
    }
    for cfg in configs.values():
        enrol_device(cfg)  # the owner's act, up front: the mod never enrols
    grid = LoopbackGrid({nid: app for nid in configs}, configs, run_id=1)
    strategy = IndividualFilterStrategy(
        FedAvg(min_available_nodes=N, fraction_evaluate=0.0),
        noise_multiplier=Z,
        clip=CLIP,
        placement="distributed",
        min_reports=M,
        run_name=RUN,
        adaptive_clipping=adaptive,
        **(sampling or {}),
    )
    seen = []

    def after_round(server_round, arrays):
        if server_round > 0:
            o = strategy.last_outcome
            seen.append(((o.reports, o.released), [arrays[k].numpy().copy() for k in keys]))
        return None

    initial = ArrayRecord({k: Array(np.array(w, order="C")) for k, w in zip(keys, weights)})
    strategy.start(
        grid, initial, num_rounds=ROUNDS, timeout=600, train_config=ConfigRecord(dict(TRAIN)), evaluate_fn=after_round
    )
    states, run_states, worst_states, statuses = [], [], [], []
    for k in range(N):
        ledger = BudgetLedger.open(tmp_path / f"dev{k}")
        try:
            states.append(ledger.state())
            run_states.append(ledger.run_state(RUN))
            worst_states.append(ledger.worst_state())
            statuses.append([r.status for r in ledger.records(RUN)])
        finally:
            ledger.close()
    return np.array(states), np.array(run_states), np.array(worst_states), statuses, seen


def engine_config(**settings) -> EngineConfig:
    """The engine run of the reference's federation: its budgets, SecAgg+ graph, seeds and training."""
    base = dict(task="digits", num_clients=N, epsilon=EPSILONS, worst_case_epsilon=WORST, delta=1e-5)
    base.update(filter_kind="rdp", noise_multiplier=Z, clip=CLIP, placement="distributed", min_reports=M)
    base.update(after_exhaustion=AFTER, rounds=ROUNDS, local_epochs=1, lr=0.5, batch_size=32, seed=SEED, run_id=RUN)
    # secagg_graph "sparse": the strategy's default secagg_num_shares="auto", the same graph and threshold.
    base.update(noise_draw="per-client", secagg_graph="sparse", group_by="none", torch_threads=1)
    return EngineConfig(**{**base, **settings})


# Adaptive clipping: sigma_b = 2 lets z_eff = 3 (z_eff < 2 sigma_b); the clip moves every round.
ADAPTIVE = AdaptiveClipping(target_clipped_quantile=0.5, clip_norm_lr=0.5, clipped_count_stddev=2.0)


# A run quota caps both accounts (client/ledger/quota.py): at 0.3 it binds the worst-case accounts too.
@pytest.mark.parametrize("run_quota,adaptive", [(1.0, None), (0.3, None), (1.0, ADAPTIVE)])
def test_engine_matches_the_flower_secagg_path_bitwise(tmp_path, monkeypatch, run_quota, adaptive):
    for name, value in (("_run_id", 1), ("_node_id", 1), ("_task_id", 1)):
        monkeypatch.setattr(TaskIdentity, name, value)  # restored after the loopback grid sets them
    states, run_states, worst_states, statuses, seen = flower_reference(tmp_path, run_quota, adaptive)
    assert len(seen) == ROUNDS

    result = run_engine(engine_config(run_quota=run_quota, adaptive_clipping=adaptive))

    # Per-client spending: bitwise, every round recorded as distributed.
    assert result.state.tobytes() == states.tobytes()
    assert result.run_state.tobytes() == run_states.tobytes()
    assert result.worst_state is not None and result.worst_state.tobytes() == worst_states.tobytes()
    if adaptive is not None:  # the clip moved, from the same unmasked bits on both paths
        assert len({r.clip for r in result.rounds}) == ROUNDS
    else:
        _fixed_clip_scenario(result, states, statuses)
    for k in range(N):
        first = next((i + 1 for i, s in enumerate(statuses[k]) if s != "contributed"), -1)
        assert result.exhausted_round[k] == first
    # What the coordinator saw: the number of reports in each sum, and whether it was released.
    # (The strategy counts the reports in the unmasked sum, none when nothing is unmasked; the engine's
    # reports_seen counts the masked reports sent, released or not.)
    assert [(r.reports_seen if r.released else 0, r.released) for r in result.rounds] == [c for c, _ in seen]
    # The model: the integer sum is exact, so the released mean and the step are the coordinator's.
    _, final = seen[-1]
    for a, b in zip(result.weights, final):
        np.testing.assert_array_equal(a, b)


def test_engine_matches_the_flower_secagg_path_bitwise_when_devices_sample_themselves(tmp_path, monkeypatch):
    """Devices that sample themselves under SecAgg+: the same rates, charges in both accounts, coins and
    Skellam shares as the Flower path's, so the same integer sums and the same model."""
    for name, value in (("_run_id", 1), ("_node_id", 1), ("_task_id", 1)):
        monkeypatch.setattr(TaskIdentity, name, value)
    from fedfilter.planning.sampled_rounds import enrolment_order

    # Every spent device reports its share alone (a device that left would halt this small SecAgg+ graph).
    sampling, after = {"planned_asks": 12, "expected_rate": 0.5}, ["noise-only"] * N
    orders = {e: float(enrolment_order(epsilon=e, delta=1e-5, noise_multiplier=Z, asks=12)) for e in set(EPSILONS)}
    order = [orders[e] for e in EPSILONS]  # each owner enrols at its plan's order (rdp_order="plan" below)
    states, run_states, worst_states, statuses, seen = flower_reference(
        tmp_path, sampling=sampling, order=order, after=after
    )
    result = run_engine(engine_config(after_exhaustion=after, rdp_order="plan", **sampling))
    assert result.state.tobytes() == states.tobytes()
    assert result.run_state.tobytes() == run_states.tobytes()
    assert result.worst_state is not None and result.worst_state.tobytes() == worst_states.tobytes()
    kept = sum(r.kept for r in result.rounds)
    assert 0 < kept < sum(r.contributing for r in result.rounds)  # some coins kept, some dropped
    assert sum(r.released for r in result.rounds) >= 2
    assert [(r.reports_seen if r.released else 0, r.released) for r in result.rounds] == [c for c, _ in seen]
    _, final = seen[-1]
    for a, b in zip(result.weights, final):
        np.testing.assert_array_equal(a, b)


def _fixed_clip_scenario(result, states, statuses) -> None:
    """What this fixed-clip setting was chosen to exercise (else the comparison would prove little)."""
    # The worst-case account bound for some devices: they stopped with most of the main budget left.
    assert any(result.exhausted_round[k] > 0 and result.spent_fraction[k] < 0.5 for k in range(N))
    assert (states[:, 0] > 0).sum() == 8  # every budget but the two spent ones paid something
    flat = [s for row in statuses for s in row]
    assert "noise-only" in flat and "left" in flat and "contributed" in flat
