"""Run a dropout study: every run of the sweep through the vectorised engine, then the outputs.

Each run drives ``fedfilter.simulations.engine.Engine`` one round at a time (its public API) and records,
per round: clients asked, clients whose data entered the round (ground truth), reports the
coordinator saw, pure-noise reports, ``left`` markers, whether the round was released, test accuracy,
how many clients still have budget for a contribution (ground truth: the filter's own allowance,
read with ``Engine.allowance`` for every client, so a client that was not asked still counts), and
the same per group (``fedfilter.simulations.study.groups``).
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

from fedfilter.protocol.adaptive_clip import AdaptiveClipping
from fedfilter.simulations.study.config_checks import ADAPTIVE_KEYS
from fedfilter.simulations.study.groups import Grouping, make_grouping
from fedfilter.simulations.study.specs import DataSpec, RunSpec, StudyConfig

RESULTS_SCHEMA = "fedfilter.study.dropout.v1"


def _load_task(spec: DataSpec):
    """The task of a ``[data.X]`` table, with its optional random caps on client and test data.

    Also returns every client's number of training examples before the cap.
    """
    from dataclasses import replace

    from fedfilter.simulations.tasks.registry import load_task

    task = load_task(
        spec.task,
        num_clients=spec.num_clients,
        partition="iid" if spec.partition == "natural" else spec.partition,
        alpha=spec.alpha,
        seed=spec.partition_seed,
    )
    rng = np.random.default_rng([spec.partition_seed, 0x5EED])
    train, test = task.train_data, task.test_data
    full_sizes = [len(y) for _, y in train]
    if spec.max_examples_per_client:
        cap = spec.max_examples_per_client
        train = []
        for x, y in task.train_data:
            if len(y) > cap:
                idx = np.sort(rng.choice(len(y), size=cap, replace=False))
                x, y = np.ascontiguousarray(x[idx]), np.ascontiguousarray(y[idx])
            train.append((x, y))
    if spec.max_test_examples and len(test[1]) > spec.max_test_examples:
        idx = np.sort(rng.choice(len(test[1]), size=spec.max_test_examples, replace=False))
        test = (np.ascontiguousarray(test[0][idx]), np.ascontiguousarray(test[1][idx]))
    if train is not task.train_data or test is not task.test_data:
        task = replace(task, train_data=train, test_data=test)
    return task, full_sizes


def _quantiles(x: np.ndarray) -> dict:
    x = np.asarray(x, dtype=np.float64)
    if x.size == 0:
        return {}
    q = np.quantile(x, [0.0, 0.1, 0.5, 0.9, 1.0])
    return {
        "min": float(q[0]),
        "p10": float(q[1]),
        "median": float(q[2]),
        "p90": float(q[3]),
        "max": float(q[4]),
        "mean": float(x.mean()),
    }


def _finite_or_none(x):
    return None if x is None or not math.isfinite(x) else float(x)


def _within_budget(study: StudyConfig, eps: np.ndarray, state: np.ndarray) -> bool:
    """Every client's lifetime state is admitted by a freshly built filter of its own budget."""
    from fedfilter.privacy.filters import make_filter

    ok = True
    for e in np.unique(eps):
        rows = eps == e
        ok &= bool(np.all(make_filter(study.filter, float(e), study.delta).within_budget(state[rows])))
    return ok


def run_one(
    study: StudyConfig, run: RunSpec, task, grouping: Grouping, on_round: Callable[[dict], object] | None = None
) -> dict:
    """One run of the sweep through the vectorised engine; returns its JSON-ready record.

    The record's keys are described in ``docs/results.md``.

    Parameters
    ----------
    study : StudyConfig
        The study.
    run : RunSpec
        The point of the sweep to run.
    task : fedfilter.simulations.tasks.registry.Task
        The run's task, loaded.
    grouping : Grouping
        The task's groups of clients.
    on_round : callable, optional
        Called after every round with a dict (``accuracy``, ``contributing``, ...).

    Returns
    -------
    dict
        The run's record (per-round lists, budgets, exhaustion, groups, accuracy).

    Examples
    --------
    It trains a model for ``study.rounds`` rounds:

    >>> from fedfilter.simulations.study import load_study
    >>> study = load_study("study.toml")  # doctest: +SKIP
    >>> run = study.runs()[0]  # doctest: +SKIP
    >>> task, full_sizes = _load_task(run.data)  # doctest: +SKIP
    >>> grouping = make_grouping(run.data.groups, task.train_data, task.num_classes, full_sizes)  # doctest: +SKIP
    >>> record = run_one(study, run, task, grouping)  # doctest: +SKIP
    """
    from fedfilter.simulations.engine import Engine, EngineConfig

    started = time.perf_counter()
    eps = study.budgets(run, task.num_clients)
    # [federation] settings, with the data set's own fraction asked per round in place of the shared one.
    fed: dict[str, Any] = dict(study.federation)
    if run.data.fraction is not None:
        fed["fraction"] = run.data.fraction
    if run.data.min_reports is not None:
        fed["min_reports"] = run.data.min_reports
    factor = fed.pop("worst_case_factor", None)
    adaptive = {k: fed.pop(k) for k in ADAPTIVE_KEYS if k in fed}
    if adaptive:  # [federation] target_clipped_quantile and its companions: EngineConfig.adaptive_clipping
        fed["adaptive_clipping"] = AdaptiveClipping(**adaptive)
    if run.noise == "distributed" and factor is not None:  # the study's rule (config_checks.check_min_reports)
        fed["worst_case_epsilon"] = np.asarray(eps, dtype=np.float64) * float(factor)
    ec = EngineConfig(
        task=run.data.task,
        num_clients=task.num_clients,
        epsilon=eps,
        delta=study.delta,
        filter_kind=study.filter,
        placement=run.noise,
        after_exhaustion=run.after_exhaustion,
        rounds=study.rounds,
        seed=run.seed,
        run_id=study.name,
        eval_every=study.eval_every,
        group_by=grouping.engine_group_by,
        torch_threads=1,
        **fed,
    )
    engine = Engine(ec, task=task)
    everyone = np.arange(task.num_clients)

    def budget_left(clients: np.ndarray) -> np.ndarray:
        return engine.has_budget(clients)  # the placement's own exhaustion rule (Gaussian or Skellam)

    # A client's filter state changes only when it contributes, so after the first full check only
    # the rows that changed this round are read again (the allowance is one call per distinct budget).
    _, acc0, groups0 = engine.evaluate()
    alive = budget_left(everyone)
    seen_state = engine.state.copy()
    per_round: dict[str, list] = {
        k: []
        for k in (
            "sampled",
            "contributing",
            "reports_seen",
            "noise_only",
            "left",
            "released",
            "exhausted_total",
            "with_budget",
            "accuracy",
            "accuracy_evaluated",
            "aggregate_norm",
            "clip",
        )
    }
    group_share: dict[str, list[float]] = {g: [] for g in grouping.names}
    group_acc: dict[str, list[float | None]] = {g: [] for g in grouping.names}
    share0 = grouping.share(alive)
    gacc_last = grouping.accuracy(groups0, task.client_ids) or {}
    gacc0 = dict(gacc_last)
    acc_last = acc0
    for _ in range(study.rounds):
        rec = engine.step()
        changed = np.flatnonzero(np.any(engine.state != seen_state, axis=1) & alive)
        if changed.size:
            alive[changed] = budget_left(changed)
            seen_state[changed] = engine.state[changed]
        if rec.accuracy is not None:
            acc_last = rec.accuracy
            gacc_last = grouping.accuracy(rec.group_accuracy, task.client_ids) or gacc_last
        per_round["sampled"].append(rec.sampled)
        per_round["contributing"].append(rec.contributing)
        per_round["reports_seen"].append(rec.reports_seen)
        per_round["noise_only"].append(rec.noise_only)
        per_round["left"].append(rec.left)
        per_round["released"].append(bool(rec.released))
        per_round["exhausted_total"].append(rec.exhausted_total)
        per_round["with_budget"].append(int(alive.sum()))
        per_round["accuracy"].append(float(acc_last))
        per_round["accuracy_evaluated"].append(rec.accuracy is not None)
        per_round["aggregate_norm"].append(float(rec.aggregate_norm))
        per_round["clip"].append(rec.clip)  # public: the round's clip (moves with adaptive clipping)
        for g, s in zip(grouping.names, grouping.share(alive)):
            group_share[g].append(float(s))
        for g in grouping.names:
            group_acc[g].append(_finite_or_none(gacc_last.get(g)))
        if on_round is not None:
            on_round({"round": rec.round_id, "accuracy": acc_last, "contributing": rec.contributing})
    res = engine.result()

    ex = res.exhausted_round
    ex_rounds = ex[ex > 0]
    half = next((r + 1 for r, w in enumerate(per_round["with_budget"]) if w <= task.num_clients / 2), None)
    summary = grouping.exhaustion_summary(ex, study.rounds)
    group_records = {}
    for j, g in enumerate(grouping.names):
        accs = [a for a in group_acc[g] if a is not None]
        group_records[g] = {
            **summary[g],
            "initial_share_with_budget": float(share0[j]),
            "share_with_budget_per_round": group_share[g],
            "accuracy_per_round": group_acc[g],
            "initial_accuracy": _finite_or_none(gacc0.get(g)),
            "final_accuracy": accs[-1] if accs else None,
            "peak_accuracy": max(accs) if accs else None,
        }
    finals = {g: r["final_accuracy"] for g, r in group_records.items() if r["final_accuracy"] is not None}
    return {
        "label": run.label,
        "settings": run.settings(),
        "data": asdict(run.data),
        "budget": {
            "distribution": run.heterogeneity.describe(run.budget_level),
            "shape": {"distribution": run.heterogeneity.distribution, **run.heterogeneity.params},
            "epsilon_quantiles": _quantiles(eps),
            "epsilon_per_client": [float(e) for e in eps],
        },
        "num_clients": int(task.num_clients),
        "rounds": study.rounds,
        "initial_accuracy": float(acc0),
        "contributing_per_round": per_round["contributing"],
        "accuracy_per_round": per_round["accuracy"],
        "reports_seen_per_round": per_round["reports_seen"],
        "sampled_per_round": per_round["sampled"],
        "noise_only_per_round": per_round["noise_only"],
        "left_per_round": per_round["left"],
        "released_per_round": per_round["released"],
        "with_budget_per_round": per_round["with_budget"],
        "exhausted_total_per_round": per_round["exhausted_total"],
        "accuracy_evaluated_per_round": per_round["accuracy_evaluated"],
        "aggregate_norm_per_round": per_round["aggregate_norm"],
        "clip_per_round": per_round["clip"],
        "exhaustion": {
            "clients_exhausted": int(ex_rounds.size),
            "first_round": int(ex_rounds.min()) if ex_rounds.size else None,
            "median_round_of_exhausted": float(np.median(ex_rounds)) if ex_rounds.size else None,
            "round_half_without_budget": half,
            "exhausted_round_per_client": [int(r) for r in ex],
            "spent_epsilon_quantiles": _quantiles(res.spent_epsilon),
            "spent_fraction_quantiles": _quantiles(res.spent_fraction),
            # spent_epsilon is rounded up (an upper bound), so it may exceed the budget by an ulp
            # for a client that spent exactly all of it; the filter check below is the exact one.
            "max_spent_epsilon_over_budget": float(np.max(res.spent_epsilon / eps)),
            "max_spent_fraction": float(np.max(res.spent_fraction)),
            "all_within_budget": _within_budget(study, eps, res.state),
        },
        "groups": {
            "kind": grouping.kind,
            "names": grouping.names,
            "per_group": group_records,
            "final_accuracy_gap": (max(finals.values()) - min(finals.values())) if finals else None,
            "worst_group": min(finals, key=lambda g: finals[g]) if finals else None,
        },
        # distributed runs: the SecAgg+ graph every round ran on (k, t, its abort bound)
        "secagg_graph": asdict(res.graph) if res.graph is not None else None,
        "final_accuracy": per_round["accuracy"][-1],
        "peak_accuracy": max([acc0] + per_round["accuracy"]),
        "seconds": time.perf_counter() - started,
    }


def run_study(study: StudyConfig, out_dir: str | Path, *, progress: bool = True, resume: bool = False) -> dict:
    """Run every run of ``study``; write ``results.json``, the PNG plots and ``report.md`` to ``out_dir``.

    Parameters
    ----------
    study : StudyConfig
        The study.
    out_dir : str or Path
        The output folder (created if missing).
    progress : bool, optional
        Show a progress bar.
    resume : bool, optional
        Keep the runs an earlier, interrupted call of the very same study file (same ``config_toml``)
        already wrote to ``out_dir/results.json`` and run only the others.

    Returns
    -------
    dict
        The study's results (what ``results.json`` holds).

    Examples
    --------
    It trains a model per run (the packaged ``smoke`` study takes minutes):

    >>> from fedfilter.cli.study import study_config
    >>> from fedfilter.simulations.study import load_study
    >>> results = run_study(load_study(study_config("smoke")), "runs/smoke")  # doctest: +SKIP
    >>> len(results["runs"])  # doctest: +SKIP
    16
    """
    from tqdm.auto import tqdm

    from fedfilter.simulations.study.report import write_outputs

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    runs = study.runs()
    tasks: dict[str, tuple] = {}
    records = []
    done: dict[str, dict] = {}
    if resume and (out / "results.json").exists():
        earlier = json.loads((out / "results.json").read_text(encoding="utf-8"))
        if earlier.get("config_toml") == study.source_text:
            done = {r["label"]: r for r in earlier.get("runs", [])}
    started = time.perf_counter()
    bar = tqdm(
        total=len(runs) * study.rounds,
        unit="round",
        desc=f"study {study.name}",
        disable=not progress,
        dynamic_ncols=True,
    )
    try:
        for i, run in enumerate(runs):
            if run.label in done:
                records.append(done[run.label])
                bar.update(study.rounds)
                continue
            if run.data.name not in tasks:
                bar.set_postfix_str(f"loading {run.data.name}")
                task, full_sizes = _load_task(run.data)
                tasks[run.data.name] = (
                    task,
                    make_grouping(run.data.groups, task.train_data, task.num_classes, full_sizes),
                )
            task, grouping = tasks[run.data.name]
            bar.set_description(f"run {i + 1}/{len(runs)}")

            def tick(info, _label=run.label):
                bar.update(1)
                bar.set_postfix_str(f"{_label} | acc {info['accuracy']:.3f} | contrib {info['contributing']}")

            records.append(run_one(study, run, task, grouping, on_round=tick))
            # Kept up to date after every run, so a long study that stops early keeps what it did.
            _write_json(out / "results.json", _results(study, records, time.perf_counter() - started))
    finally:
        bar.close()
    results = _results(study, records, time.perf_counter() - started)
    _write_json(out / "results.json", results)
    write_outputs(results, out)
    return results


def _write_json(path: Path, obj: dict) -> None:
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(obj, indent=1) + "\n", encoding="utf-8")
    tmp.replace(path)


def _results(study: StudyConfig, records: list[dict], seconds: float) -> dict:
    return {
        "schema": RESULTS_SCHEMA,
        "study": study.name,
        "description": study.description,
        "config_toml": study.source_text,
        "filter": study.filter,
        "delta": study.delta,
        "budget_grid": study.budget_grid,
        "federation": study.federation,
        "sweep": study.sweep,
        "heterogeneity": {
            k: {"distribution": d.distribution, **d.params, "describe": d.describe()}
            for k, d in study.heterogeneity.items()
        },
        "data_sets": {k: {**asdict(d), "describe": d.describe()} for k, d in study.data.items()},
        "seconds": seconds,
        "runs_planned": len(study.runs()),
        "runs": records,
    }
