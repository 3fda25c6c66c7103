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


def test_poisson_is_each_clients_own_coin_from_the_seeds_generator(digits):
    """A trusted server's Poisson sampling: ``random(n) < fraction`` of the sampling generator, each round."""
    cfg = config(participation="poisson", placement="central")
    rng = sampling_rng(cfg.seed, cfg.run_id)
    expected = [np.flatnonzero(rng.random(N) < 0.3).tolist() for _ in range(7)]
    seen = asked(Engine(cfg, task=digits), 7)
    assert seen == [c for c in expected if c]  # a round that asks nobody trains nobody
    assert len({len(c) for c in expected}) > 1  # the count varies from round to round


class _Zeros:
    """The engine's aggregate Gaussian generator with every draw zero (the sum is then exact)."""

    def normal(self, loc, scale, size):
        return np.zeros(size)


def test_poisson_divides_the_sum_by_the_expected_count(digits, monkeypatch):
    """The mean's sensitivity must not depend on how many were drawn: sum / (q N), not sum / count."""
    import fedfilter.simulations.engine.gaussian_round as gaussian

    monkeypatch.setattr(gaussian, "aggregate_noise_rng", lambda *key: _Zeros())
    engine = Engine(config(participation="poisson", placement="central", clip=100.0), task=digits)
    clients = engine._sample()
    engine._sampler = sampling_rng(engine.config.seed, engine.config.run_id)  # the same clients again
    _, active, _, mean = engine._gaussian_round(engine._sample())
    assert active.tolist() == clients.tolist() and len(clients) != 3
    total = engine._updates(clients).astype(np.float64).sum(axis=0)  # clip 100: nothing is clipped
    assert np.allclose(mean, total / (0.3 * N), rtol=1e-4, atol=1e-6)


def test_poisson_needs_a_trusted_server():
    with pytest.raises(ValueError, match="placement 'central'"):
        config(participation="poisson")
