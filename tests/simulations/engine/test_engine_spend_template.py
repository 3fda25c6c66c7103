"""The engine's Gaussian rounds run the device's spend template once per round for the whole spend:
allowance, exhaustion, training and clipping of the rows with something left, charges, the commit,
and only then the noise (``spend(..., noise=)``)."""

from __future__ import annotations

import numpy as np
import pytest

from fedfilter.client.mechanisms import spend as spend_module
from fedfilter.simulations.engine import Engine, EngineConfig, core
from fedfilter.simulations.tasks.registry import load_task

N = 8
# 1e-4: spent before the first round (it must not train, and reports noise only)
EPS = [0.5, 1.0, 1.5, 2.0, 1e-4, 1.0, 1.5, 8.0]


@pytest.fixture(scope="module")
def digits():
    return load_task("digits", num_clients=N)


def _config(placement: str) -> EngineConfig:
    return EngineConfig(
        task="digits",
        num_clients=N,
        epsilon=EPS,
        filter_kind="gdp",
        placement=placement,
        min_reports=2,
        noise_multiplier=3.0,
        clip=0.1,
        rounds=2,
        local_epochs=1,
        lr=0.5,
        group_by="none",
        torch_threads=1,
        noise_draw="per-client" if placement == "local" else "aggregate",
        eval_every=100,
    )


@pytest.mark.parametrize("placement", ["local", "central"])
def test_one_spend_per_round_noise_after_the_commit_and_spent_clients_never_train(digits, monkeypatch, placement):
    engine = Engine(_config(placement), task=digits)
    events: list[str] = []
    trained: list[int] = []
    original_updates = engine._updates

    def updates(clients):
        trained.extend(int(c) for c in clients)
        events.append("train")
        return original_updates(clients)

    monkeypatch.setattr(engine, "_updates", updates)

    def spy(account, mechanism, arrays, *, noise=None, **kwargs):
        events.append("spend")
        commit = account.commit

        def committing(record):
            events.append("commit")
            return commit(record)

        account.commit = committing

        def noising(record, payload):
            events.append("noise")
            return noise(record, payload)

        assert noise is not None  # the engine hands its noise step to the template
        return spend_module.spend(account, mechanism, arrays, noise=noising, **kwargs)

    monkeypatch.setattr(core, "spend", spy)
    for _ in range(2):
        events.clear()
        engine.step()
        assert events.count("spend") == 1 and events.count("commit") == 1 and events.count("noise") == 1
        assert events.index("spend") < events.index("train") < events.index("commit") < events.index("noise")
    assert 4 not in trained  # the client spent before round 1
    assert np.all(engine.state[4] == 0)


def test_a_distributed_release_is_noised_by_the_template_after_its_commit(digits, monkeypatch):
    from fedfilter.simulations.engine import distributed_round

    cfg = _config("local")
    engine = Engine(
        EngineConfig(
            **{
                **cfg.__dict__,
                "placement": "distributed",
                "filter_kind": "rdp",
                "worst_case_epsilon": 1000.0,
                "noise_draw": "per-client",
            }
        ),
        task=digits,
    )
    events: list[str] = []

    def spy(account, mechanism, arrays, *, noise=None, **kwargs):
        commit = account.commit
        account.commit = lambda record: (events.append("commit"), commit(record))[1]
        assert noise is not None  # the engine hands its noise step to the template
        return spend_module.spend(
            account, mechanism, arrays, noise=lambda r, p: (events.append("noise"), noise(r, p))[1], **kwargs
        )

    monkeypatch.setattr(distributed_round, "spend", spy)
    engine.step()
    assert events and events == ["commit", "noise"] * (len(events) // 2)
