"""Smoke tests of the papers/004 Section 5 reproduction on small subsets (a few steps each)."""

from __future__ import annotations

import numpy as np
import pytest

from client.privacy.filters import make_filter
from simulations.engine import Engine
from simulations.reproduce.private_gd import (
    GDSetting, QUERIES, QUERY_EVERY, engine_config, full_steps, paper_setting, run_cell,
)


def _flat(weights):
    return np.concatenate([w.ravel() for w in weights])


def test_gd_and_gd_with_filtering_share_their_first_k_steps():
    """Algorithm 7 with B_norm = k C^2 is Algorithm 6 for k steps (papers/004 Section 5), bitwise."""
    from simulations.reproduce.mnist_gd import mnist_task

    task = mnist_task(2000)
    k = 1  # one shared step, then the step where the filter first bites (4 steps of 2,000 gradients)
    filtered = paper_setting(0.3, "tuned", sigma=6.0, clip=1.0, eta=0.2, k=k, delta=1e-5, extra_steps=1)
    assert full_steps(make_filter("zcdp", filtered.filter_epsilon, 1e-5), sigma=6.0, clip=1.0) == k
    # Algorithm 6: the same run with a budget that never binds (every clip is C, as in the paper).
    plain = GDSetting(0.3, "tuned", "no-filter", 6.0, 1.0, 0.2, k, "zcdp", 1e6, 1e-5, 1)
    runs = {}
    for s in (filtered, plain):
        engine = Engine(engine_config(s, n=task.num_clients, seed=3, chunk_size=1024), task=task)
        runs[s.variant] = []
        for _ in range(k + 1):
            rec = engine.step()
            runs[s.variant].append((_flat(engine.weights), rec.contributing))
    for step in range(k):
        assert np.array_equal(runs["paper"][step][0], runs["no-filter"][step][0]), f"step {step + 1} differs"
    # Step k+1: the filter has removed every client that was clipped at C in all k steps.
    assert runs["paper"][k][1] < task.num_clients == runs["no-filter"][k][1]
    assert not np.array_equal(runs["paper"][k][0], runs["no-filter"][k][0])


def test_run_cell_applies_the_papers_stopping_rule():
    from simulations.reproduce.adult_gd import adult_task

    task = adult_task("full")
    sub = type(task)(task.name, task.model_fn, task.loss, task.train_data[:1500], task.test_data, 2,
                     task.client_ids[:1500])
    s = paper_setting(0.5, "tuned", sigma=8.0, clip=1.0, eta=1.0, k=3, delta=1e-5,
                      extra_steps=(QUERIES - 1) * QUERY_EVERY)
    r = run_cell(s, sub, trial=0, seed=0, chunk_size=4096)
    assert r.query_steps == [3 + QUERY_EVERY * q for q in range(QUERIES)]  # steps k, k+5, ..., k+35
    best = int(np.argmax(r.query_train_accuracy))
    assert r.chosen_step == r.query_steps[best]
    assert r.filtered_test_accuracy == r.query_test_accuracy[best]
    assert r.gd_test_accuracy == r.query_test_accuracy[0]  # Algorithm 6's answer is the step-k iterate
    assert r.prefix_max_clip_deficit <= 0.0  # every clip in the first k steps was exactly C
    assert r.max_spent_epsilon <= s.filter_epsilon
    assert r.steps_run == 3 + 35
