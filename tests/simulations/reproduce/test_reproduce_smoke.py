"""Smoke tests of the Feldman & Zrnic (2021) Section 5 reproduction on small subsets (a few steps each)."""

from __future__ import annotations

import numpy as np
import pytest

from fedfilter.privacy.filters import make_filter
from fedfilter.simulations.engine import Engine
from fedfilter.simulations.engine.checkpoint import checkpoint_round, load_checkpoint, save_checkpoint
from fedfilter.simulations.reproduce.private_gd import (
    QUERIES,
    QUERY_EVERY,
    GDSetting,
    engine_config,
    full_steps,
    paper_setting,
    run_cell,
)


def _flat(weights):
    return np.concatenate([w.ravel() for w in weights])


def test_gd_and_gd_with_filtering_share_their_first_k_steps():
    """Algorithm 7 with B_norm = k C^2 is Algorithm 6 for k steps (Feldman & Zrnic (2021) Section 5), bitwise."""
    from fedfilter.simulations.reproduce.mnist_gd import mnist_task

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
    from fedfilter.simulations.reproduce.adult_gd import adult_task

    task = adult_task("full")
    sub = type(task)(
        task.name, task.model_fn, task.loss, task.train_data[:1500], task.test_data, 2, task.client_ids[:1500]
    )
    s = paper_setting(
        0.5, "tuned", sigma=8.0, clip=1.0, eta=1.0, k=3, delta=1e-5, extra_steps=(QUERIES - 1) * QUERY_EVERY
    )
    r = run_cell(s, sub, trial=0, seed=0, chunk_size=4096)
    assert r.query_steps == [3 + QUERY_EVERY * q for q in range(QUERIES)]  # steps k, k+5, ..., k+35
    best = int(np.argmax(r.query_train_accuracy))
    assert r.chosen_step == r.query_steps[best]
    assert r.filtered_test_accuracy == r.query_test_accuracy[best]
    assert r.gd_test_accuracy == r.query_test_accuracy[0]  # Algorithm 6's answer is the step-k iterate
    assert r.prefix_max_clip_deficit <= 0.0  # every clip in the first k steps was exactly C
    assert r.max_spent_epsilon <= s.filter_epsilon
    assert r.steps_run == 3 + 35


class _Stop(Exception):
    pass


def test_a_stopped_cell_resumes_from_its_checkpoint_with_the_same_result(tmp_path):
    """Stopped after step 5 (checkpoint at step 4), restarted: the same answers as one straight run."""
    from fedfilter.simulations.reproduce.mnist_gd import mnist_task

    task = mnist_task(400)
    s = paper_setting(0.3, "tuned", sigma=6.0, clip=1.0, eta=0.2, k=2, delta=1e-5, extra_steps=5)
    straight = run_cell(s, task, trial=0, seed=5, chunk_size=128)

    ckpt = tmp_path / "cell.npz"

    def stop_at_step_5(message):
        if message.startswith("step 5/"):
            raise _Stop

    with pytest.raises(_Stop):
        run_cell(s, task, trial=0, seed=5, chunk_size=128, checkpoint=ckpt, checkpoint_every=2, log=stop_at_step_5)
    assert ckpt.exists()
    logs = []
    resumed = run_cell(s, task, trial=0, seed=5, chunk_size=128, checkpoint=ckpt, checkpoint_every=2, log=logs.append)
    assert logs[0].endswith("after step 4") and logs[1].startswith("step 5/")
    same = lambda r: {k: v for k, v in r.__dict__.items() if k not in ("seconds", "seconds_per_step")}
    assert same(resumed) == same(straight)
    assert straight.query_steps == [2, 7] and straight.max_spent_epsilon <= s.filter_epsilon

    # A checkpoint of another run is refused, naming the file, and left as it was.
    other = paper_setting(0.3, "tuned", sigma=7.0, clip=1.0, eta=0.2, k=2, delta=1e-5, extra_steps=5)
    before = ckpt.read_bytes()
    with pytest.raises(ValueError, match="cell.npz belongs to another run"):
        run_cell(other, task, trial=0, seed=5, chunk_size=128, checkpoint=ckpt)
    assert ckpt.read_bytes() == before


def test_engine_snapshot_restores_every_round_state(tmp_path):
    """Engine.restore(snapshot) on a fresh engine, then one step each: bitwise the same."""
    from fedfilter.simulations.reproduce.mnist_gd import mnist_task

    task = mnist_task(300)
    s = paper_setting(0.3, "tuned", sigma=6.0, clip=1.0, eta=0.2, k=1, delta=1e-5, extra_steps=3)
    a = Engine(engine_config(s, n=task.num_clients, seed=2, chunk_size=128), task=task)
    for _ in range(3):
        a.step()
    save_checkpoint(tmp_path / "e.npz", a.snapshot(), {"note": "x"})
    snap, meta = load_checkpoint(tmp_path / "e.npz")
    assert meta == {"note": "x"} and checkpoint_round(tmp_path / "e.npz") == 3 == snap["round_id"]
    b = Engine(engine_config(s, n=task.num_clients, seed=2, chunk_size=128), task=task)
    b.restore(snap)
    ra, rb = a.step(), b.step()
    assert np.array_equal(_flat(a.weights), _flat(b.weights))
    assert np.array_equal(a.state, b.state) and np.array_equal(a.run_state, b.run_state)
    assert np.array_equal(a.exhausted_round, b.exhausted_round)
    assert ra.contributing == rb.contributing and len(b.records) == 4 == len(a.records)
    assert a.state.max() > 0  # the filter has been charged, so the comparison means something
