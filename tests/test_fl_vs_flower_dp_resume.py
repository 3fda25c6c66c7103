"""``benchmarks/fl_vs_flower_dp.py``: an arm killed mid-run and rerun ends where the uninterrupted run
ends (the same accuracy and loss every round, the same accountant, the same device states).

Each arm runs three ways at the smoke size: straight through; stopped by an exception in its progress
callback after round 2 (the checkpoint of round 1 on disk, as after a kill); and rerun from that
checkpoint. The stopped run must really stop (else the test proves nothing) and the rerun must start
from the checkpoint (it calls progress for the rounds done without running them).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import fl_vs_flower_dp as bench  # noqa: E402


class Stop(Exception):
    """The stand-in for a kill."""


class Bar:
    """A progress bar that raises once it has seen ``stop_at`` rounds."""

    def __init__(self, stop_at: int | None = None):
        self.n, self.stop_at = 0, stop_at

    def update(self, k: int = 1) -> None:
        self.n += k
        if self.stop_at is not None and self.n >= self.stop_at:
            raise Stop


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    out = tmp_path_factory.mktemp("resume")
    args = bench.parse_args(["--smoke", "--out", str(out), "--checkpoint-every", "1", "--no-progress"])
    task = bench.load(args)
    eps = bench.budgets(task.num_clients, args.epsilon[0], args.budgets, args.seed)
    return args, task, eps


def three_ways(run_arm, path: Path, work: list[int]):
    """``work`` counts the units of training the arm does (one per round or per device update)."""
    whole = run_arm(Bar(), None)
    per_round = len(work) // whole["rounds_run"]
    with pytest.raises(Stop):
        run_arm(Bar(stop_at=2), path)
    assert path.exists(), "the stopped run left no checkpoint"
    from fedfilter.simulations.engine.checkpoint import checkpoint_round

    assert checkpoint_round(path) == 1
    bar = Bar()
    work.clear()
    resumed = run_arm(bar, path)
    assert bar.n == whole["rounds_run"]  # the rounds done are reported once, then the rest run
    assert len(work) == per_round * (whole["rounds_run"] - 1)  # round 1 is not trained again
    return whole, resumed


@pytest.fixture
def engine_steps(monkeypatch) -> list[int]:
    from fedfilter.simulations.engine import core

    steps: list[int] = []
    step = core.Engine.step

    def counted(self):
        steps.append(1)
        return step(self)

    monkeypatch.setattr(core.Engine, "step", counted)
    return steps


@pytest.fixture
def device_updates(monkeypatch) -> list[int]:
    from fedfilter.simulations.tasks import training

    updates: list[int] = []
    local_update = training.local_update

    def counted(*args, **kwargs):
        updates.append(1)
        return local_update(*args, **kwargs)

    monkeypatch.setattr(training, "local_update", counted)
    return updates


@pytest.mark.parametrize("arm", ["b", "d", "c"])
def test_an_engine_arm_resumes_where_it_stopped(setup, arm, engine_steps):
    args, task, eps = setup
    path = bench.arm_checkpoint(args, args.epsilon[0], arm)

    def run_arm(bar, checkpoint):
        return bench.engine_arm(task, args, arm=arm, z=2.0, eps=eps, bar=bar, checkpoint=checkpoint)

    whole, resumed = three_ways(run_arm, path, engine_steps)
    assert resumed["accuracy_per_round"] == whole["accuracy_per_round"]
    assert resumed["loss_per_round"] == whole["loss_per_round"]
    assert resumed["contributing_per_round"] == whole["contributing_per_round"]
    for a, b in zip(whole["devices"], resumed["devices"], strict=True):
        assert a["state"] == b["state"] and a["spent_epsilon"] == b["spent_epsilon"]


def test_an_engine_checkpoint_of_another_arm_is_refused(setup):
    args, task, eps = setup
    path = bench.arm_checkpoint(args, args.epsilon[0], "x")
    with pytest.raises(Stop):
        bench.engine_arm(task, args, arm="b", z=2.0, eps=eps, bar=Bar(stop_at=2), checkpoint=path)
    with pytest.raises(SystemExit, match="another run"):
        bench.engine_arm(task, args, arm="b", z=2.5, eps=eps, bar=Bar(), checkpoint=path)
    path.unlink()


@pytest.mark.parametrize("private", [True, False])
def test_a_flower_arm_resumes_where_it_stopped(setup, private, device_updates):
    from harness.flower_central_dp import flower_noise_multiplier

    args, task, eps = setup
    path = bench.arm_checkpoint(args, args.epsilon[0], "a" if private else "e")
    epsilon = float(eps.min())
    z = flower_noise_multiplier(epsilon, args.delta, args.rounds, task.num_clients, args.clients_per_round)

    def run_arm(bar, checkpoint):
        return bench.flower_arm(
            task,
            args,
            z=z if private else None,
            epsilon=epsilon if private else None,
            progress=bar.update,
            checkpoint=checkpoint,
        )

    whole, resumed = three_ways(run_arm, path, device_updates)
    assert resumed["accuracy_per_round"] == whole["accuracy_per_round"]
    assert resumed["loss_per_round"] == whole["loss_per_round"]
    if private:  # Flower's accountant continues from its saved ledger
        assert resumed["releases"] == whole["releases"] == args.rounds
        assert resumed["spent_epsilon"] == whole["spent_epsilon"]
    assert np.isfinite(resumed["accuracy"])


def test_a_preset_fills_what_the_command_line_leaves_out():
    from fl_vs_flower_dp_presets import PRESETS

    args = bench.parse_args(["--preset", "mnist-long", "--rounds", "7", "--lr=0.3", "--clients-per", "50"])
    preset = PRESETS["mnist-long"]
    assert (args.rounds, args.lr, args.clients_per_round) == (7, 0.3, 50)  # given: the command line wins
    for name in ("task", "local_epochs", "batch_size", "clip", "eval_every"):
        assert getattr(args, name) == preset[name]
    assert args.epsilon == [1.0, 2.0, 4.0, 8.0]
    plain = bench.parse_args([])
    assert (plain.task, plain.rounds, plain.lr) == ("femnist", 30, 0.05)  # no preset: the old defaults


def test_two_runs_sharing_out_keep_each_others_arms(tmp_path):
    path = tmp_path / "results.json"
    settings = {"task": "t"}

    def doc(arms_by_eps):
        results = [{"epsilon": e, "arms": {a: {"accuracy": 0.5} for a in arms}} for e, arms in arms_by_eps]
        return {"schema": bench.SCHEMA, "settings": settings, "results": results}

    bench._checkpoint(path, doc([(1.0, "a"), (2.0, "a")]))
    mine = doc([(1.0, "b")])
    bench._checkpoint(path, mine)
    held = {(r["epsilon"], a) for r in bench.json.loads(path.read_text())["results"] for a in r["arms"]}
    assert held == {(1.0, "a"), (1.0, "b"), (2.0, "a")}
    other = {**doc([(4.0, "b")]), "settings": {"task": "other"}}  # another run's file is never merged
    bench._merge(other, bench.json.loads(path.read_text()))
    assert [r["epsilon"] for r in other["results"]] == [4.0]


def test_the_long_queue_skips_what_is_done(tmp_path, monkeypatch):
    import fl_vs_flower_dp_long as long

    monkeypatch.setattr(long, "LONG", tmp_path)
    job = long.mnist(0, "ae")
    assert job.missing() == [f"{e:g}/{a}" for e in long.EPSILONS for a in "ae"]
    (tmp_path / job.out).mkdir()
    results = [{"epsilon": e, "arms": {"a": {}, "e": {}}} for e in long.EPSILONS[:3]]
    (tmp_path / job.out / "results.json").write_text(bench.json.dumps({"results": results}))
    assert job.missing() == ["8/a", "8/e"]
    held = long.take(job)
    assert held is not None and long.take(job) is None  # a second worker does not take a running job
    held.close()
    assert "--preset" in job.command() and job.command()[job.command().index("--arms") + 1] == "ae"
    assert len({j.name for j in long.JOBS}) == len(long.JOBS)


def test_the_spending_table_reads_each_budgets_share_from_the_devices_filters(tmp_path):
    import fl_vs_flower_dp_long as long

    def device(eps, spent):
        return {"epsilon": eps, "spent_epsilon": spent}

    arm = {
        "accuracy": 0.5,
        "noise_multiplier": 4.5,
        "sampling_plan": {"rates": {"2.0": 0.13, "6.0": 1.0}},
        "devices": [device(2.0, 2.0), device(2.0, 1.8), device(6.0, 4.2)],
    }
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "results.json").write_text(
        bench.json.dumps({"results": [{"epsilon": 2.0, "arms": {"h": arm}}]})
    )
    rows = long.spending([tmp_path / "run"]).splitlines()[2:]
    assert rows == [
        "| run | 2 | (h) | 4.5 | 0.5000 | 2 | 2 | 0.13 | 0.950 | 0.900 |",
        "| run | 2 | (h) | 4.5 | 0.5000 | 6 | 1 | 1 | 0.700 | 0.700 |",
    ]
