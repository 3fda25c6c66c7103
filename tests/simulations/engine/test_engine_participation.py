"""Who the engine asks each round: uniform sampling as before, or balanced passes."""

from __future__ import annotations

import numpy as np
import pytest

from fedfilter.simulations.engine import Engine, EngineConfig
from fedfilter.simulations.engine.seeds import sampling_rng
from fedfilter.simulations.tasks.registry import load_task

N = 10


@pytest.fixture(scope="module")
def digits():
    return load_task("digits", num_clients=N)


def config(**kw) -> EngineConfig:
    base = dict(
        task="digits",
        num_clients=N,
        epsilon=1e4,
        fraction=0.3,
        rounds=7,
        local_epochs=1,
        group_by="none",
        torch_threads=1,
        noise_draw="aggregate",
        eval_every=1000,
    )
    return EngineConfig(**{**base, **kw})


def asked(engine: Engine, rounds: int) -> list[list[int]]:
    """The clients each round trains (every asked client has budget here), round by round."""
    seen: list[list[int]] = []
    train = engine._updates

    def spy(clients):
        seen.append(clients.tolist())
        return train(clients)

    engine._updates = spy
    for _ in range(rounds):
        engine.step()
    return seen


def test_balanced_counts_stay_within_one(digits):
    engine = Engine(config(participation="balanced"), task=digits)
    rounds = asked(engine, 7)
    counts = np.zeros(N, dtype=int)
    for clients in rounds:
        assert len(clients) == len(set(clients)) == 3 and clients == sorted(clients)
        counts[clients] += 1
        assert counts.max() - counts.min() <= 1
    assert counts.sum() == 21


def test_uniform_counts_can_spread_and_are_the_seeds_draws(digits):
    """Uniform stays what it was: each round ``choice(n, k, replace=False)`` of the sampling generator, sorted."""
    cfg = config()
    rng = sampling_rng(cfg.seed, cfg.run_id)
    expected = [sorted(rng.choice(N, size=3, replace=False).tolist()) for _ in range(7)]
    assert asked(Engine(cfg, task=digits), 7) == expected


def test_balanced_is_seeded_and_resumes_from_a_checkpoint(digits):
    cfg = config(participation="balanced")
    straight = asked(Engine(cfg, task=digits), 7)
    assert asked(Engine(cfg, task=digits), 7) == straight
    assert asked(Engine(config(participation="balanced", seed=1), task=digits), 7) != straight
    first = Engine(cfg, task=digits)
    head = asked(first, 3)
    second = Engine(cfg, task=digits)
    second.restore(first.snapshot())
    assert head + asked(second, 4) == straight


def test_participation_is_checked():
    with pytest.raises(ValueError, match="participation must be one of"):
        config(participation="round-robin")
