"""Devices that sample themselves in the engine (``EngineConfig.planned_asks``): budget tiers spend what
they hold, each budget enrols at its plan's order, and the settings that cannot combine are refused.
The engine against the Flower path, bit for bit: ``test_engine_conformance*.py``."""

from __future__ import annotations

import numpy as np
import pytest

from fedfilter.planning.sampled_rounds import enrolment_order
from fedfilter.simulations.engine import EngineConfig, run_engine
from fedfilter.simulations.engine.core import Engine

TIERS = [2.0, 4.0, 6.0] * 2


@pytest.fixture(scope="module")
def tiers():
    config = EngineConfig(
        task="digits",
        num_clients=len(TIERS),
        epsilon=TIERS,
        filter_kind="rdp",
        rdp_order="plan",
        noise_multiplier=1.0,
        clip=0.01,  # every update reaches the clip: each ask costs its full-clip charge
        planned_asks=6,
        rounds=6,
        local_epochs=1,
        group_by="none",
        eval_every=6,
        torch_threads=1,
    )
    return config, run_engine(config)


def test_every_tier_asked_as_planned_spends_at_least_90_percent_of_its_budget(tiers):
    _, result = tiers
    assert np.all(result.spent_fraction >= 0.9), result.spent_fraction
    assert np.all(result.spent_fraction <= 1.0)
    assert np.all(result.spent_epsilon <= np.array(TIERS) * (1 + 1e-9))


def test_each_budget_enrols_at_its_plans_order_and_the_coins_keep_some_updates(tiers):
    config, result = tiers
    engine = Engine(config)
    for filt in engine.filters:
        want = enrolment_order(epsilon=filt.epsilon, delta=1e-5, noise_multiplier=1.0, asks=6)
        assert filt.orders == (float(want),)
    assert sum(r.kept for r in result.rounds) > 0
    assert all(r.kept <= r.contributing for r in result.rounds)


@pytest.mark.parametrize(
    "bad, named",
    [
        (dict(filter_kind="gdp"), "filter_kind 'rdp'"),
        (dict(accounting="worst-case"), "individual accounting"),
        (dict(placement="central", noise_draw="aggregate"), "a device's placement"),
        (dict(planned_asks=-1), "planned_asks must be"),
        (dict(max_sampling_rate=0.0), "max_sampling_rate"),
        (dict(expected_rate=1.5), "expected_rate"),
        (dict(rdp_order="best"), "rdp_order"),
        (dict(rdp_order=None), "rdp_order 'plan' or in"),
        (dict(rdp_order=1.5), "rdp_order 'plan' or in"),
        # the device's worst-case account can bind a sampled local round; the local rows keep none
        (dict(placement="local", worst_case_epsilon=2.0), "no worst_case_epsilon in local placement"),
    ],
)
def test_settings_that_cannot_sample_are_refused_by_name(bad, named):
    settings = {"num_clients": 4, "filter_kind": "rdp", "rdp_order": 6.0, "planned_asks": 5, **bad}
    with pytest.raises(ValueError, match=named):
        EngineConfig(**settings)


def test_a_checkpoint_keeps_the_asks_each_device_counts():
    config = EngineConfig(
        num_clients=4, epsilon=4.0, filter_kind="rdp", rdp_order=6.0, planned_asks=4, local_epochs=1, group_by="none"
    )
    first = Engine(config)
    assert first.has_budget(np.arange(4)).all()  # the sampled rule: a rate above 0
    first.step()
    second = Engine(config)
    second.restore(first.snapshot())
    assert second.asks_in_run.tolist() == [1, 1, 1, 1]
    snap = first.snapshot()
    del snap["asks_in_run"]
    with pytest.raises(ValueError, match="asks_in_run"):
        Engine(config).restore(snap)
