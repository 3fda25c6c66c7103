"""What individual accounting buys a federation, against Flower's own differential privacy.

The same federation (task, clients, clients asked per round, rounds), the same model and local training
(``local_epochs`` epochs of SGD, the shuffling seed ``1_000_003 * round + partition_id`` of
``fedfilter.app.client_app.train``), the same clip ``C`` and noise multiplier ``z`` and the same
per-device ``(epsilon, delta)``, five ways:

(a) ``flower-central``: Flower's central DP, ``DifferentialPrivacyServerSideFixedClipping`` around
    Flower's ``FedAvg`` with Flower's RDP accountant (``flwr.supercore.privacy_accounting``:
    ``PrivacyConfig(target_delta, population_size, ADD_OR_REMOVE_ONE, NO_AMPLIFICATION, max_epsilon)``,
    the one model flwr 1.42 accepts for fixed clipping), run by Flower's own strategy code on a Grid
    (``harness.secagg_loopback.LoopbackGrid``) whose nodes are Flower ClientApps
    training the same torch model. A TRUSTED server: it sees every clipped update in the clear. One
    budget for the population: with budget tiers it runs at the smallest epsilon (the output says so).
    ``z`` is the smallest (bisection, rounded up) for which Flower's accountant itself admits the
    planned rounds; every other arm uses the same ``z`` unless ``--fedfilter-z`` gives (b)-(d) their own
    (each device's filter enforces its budget whatever the z; Flower's no-amplification accountant
    charges every device every round, fedfilter only the devices asked).
(b) ``fedfilter-distributed``: fedfilter's distributed placement (Skellam noise on SecAgg+'s integer
    grid, no trusted server) with each device's individual filter (rdp), through the vectorised engine
    studies use (``fedfilter.simulations.engine``; its agreement with the Flower path is
    ``tests/simulations/engine/test_engine_conformance.py`` and ``test_engine_conformance_distributed.py``).
    ``min_reports = max(2, clients_per_round // 2)`` unless ``--min-reports``: each report carries
    ``1/min_reports`` of the sum's noise, so with every asked device reporting the sum carries
    ``clients_per_round / min_reports`` times (a)'s variance. Each device's worst-case budget is the
    demo's rule (``fedfilter.deploy.devices.simulated_worst_case_epsilon``: ``min_reports`` times its budget,
    or ``--worst-case-factor`` times).
(c) ``fedfilter-worst-case``: (b) with every contribution charged a full round's worst case (the
    engine's ``accounting="worst-case"``): the uniform accounting of a system without individual
    accounting. (b) minus (c) is what individual accounting alone buys.
(d) ``fedfilter-local``: fedfilter's local placement (each report carries Gaussian noise ``z C``;
    the exact Gaussian-DP filter).
(e) ``no-privacy``: Flower's plain ``FedAvg`` on the same Grid and ClientApps.
(f) ``engine-central`` (a diagnostic, not in the default ``--arms``): (a)'s mechanism through
    fedfilter's engine: the engine's ``central`` placement (Feldman & Zrnic's trusted curator: the clipped
    updates summed in the clear, one Gaussian draw ``N(0, (z C)^2)`` added), at (a)'s ``z``, each
    device's Gaussian-DP filter. A TRUSTED server. (f) against (a) is the engine against Flower's
    strategy code on one mechanism; (b) against (f) is what the distributed mechanism costs.
(g) ``trusted-amplified`` (not in the default ``--arms``): the strongest trusted baseline, DP-FedAvg
    with Poisson sampling. The engine's central placement with ``participation="poisson"``: each round
    the TRUSTED server asks every device independently with probability ``clients_per_round /
    num_clients``, sums the clipped updates, adds one Gaussian draw ``N(0, (z C)^2)`` and divides by the
    expected count. Its ``z`` is the smallest at which dp_accounting's ``RdpAccountant`` certifies the
    run (``PoissonSampledDpEvent(q, GaussianDpEvent(z))``, ``rounds`` times) within the budget: the
    amplification by sampling a server that is trusted to sample may claim. The devices' own filters
    are given budgets that never bind; the guarantee is the server's account.
(h) ``fedfilter-sampled`` (not in the default ``--arms``): (b) with devices that sample themselves, no
    trusted server: ``--sampled-per-round`` devices asked (default all, balanced passes), each putting
    its update in its reply with the rate its own budget buys over the plan's asks, a Poisson-subsampled
    mechanism on its own coin, accounted by its own filter (``client/mechanisms/sampled.py``). The plan:
    ``fl_vs_flower_dp_plan.sampling_plan``.

Every arm averages uniformly (Flower's accountant requires equal weights; fedfilter's coordinator takes
the plain mean) and steps with ``server_lr = 1``. Budget tiers (``--budgets tiers``): the shares of
Jorgensen et al. (ICDE 2015), used for individualized DP-SGD by Boenisch et al. (PETS 2023): 34 % of
the devices at ``epsilon``, 43 % at ``2 epsilon``, 23 % at ``3 epsilon`` (assigned by a permutation
drawn from ``--seed``).

Run (CPU, 2 cores; the extra ``app``):

    python benchmarks/fl_vs_flower_dp.py --smoke --json                 # seconds; what CI runs
    python benchmarks/fl_vs_flower_dp.py --task femnist --epsilon 2,8 --rounds 30 \\
        --clients-per-round 20 --out out/fl_vs_flower_dp/femnist        # resumable: finished arms are kept

``--json`` prints the results as one JSON document on stdout (the table goes to stderr); ``--out DIR``
writes ``DIR/results.json`` after every arm and, rerun with the same settings, skips the arms it holds
(so rerunning a finished command with ``--markdown`` only reprints its table, as docs/results.md has it).
Inside an arm, ``DIR/checkpoints/`` holds its state every ``--checkpoint-every`` rounds, and a rerun
continues it (``fl_vs_flower_dp_checkpoint.py``). ``--preset NAME`` fills the settings a study shares
(``fl_vs_flower_dp_presets.py``); ``fl_vs_flower_dp_long.py`` runs the long study's queue.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # tests/harness: drivers not shipped

import numpy as np  # noqa: E402
from fl_vs_flower_dp_checkpoint import arm_checkpoint, checkpointed_round, discard, run_engine_rounds
from fl_vs_flower_dp_plan import (
    adaptive_clipping,
    amplified_epsilon,
    amplified_noise_multiplier,
    budgets,
    fedfilter_noise_multipliers,
    min_reports,
    sampled_engine_settings,
    sampling_plan,
)
from fl_vs_flower_dp_presets import PRESETS, apply_preset

ARMS = {
    "a": "flower-central",
    "b": "fedfilter-distributed",
    "c": "fedfilter-worst-case",
    "d": "fedfilter-local",
    "e": "no-privacy",
    "f": "engine-central",
    "g": "trusted-amplified",
    "h": "fedfilter-sampled",
}
TASKS = {
    "femnist": ("femnist", "iid"),
    "shakespeare": ("shakespeare", "iid"),
    "mnist-dirichlet": ("mnist", "dirichlet"),
    "mnist-iid": ("mnist", "iid"),
}
SCHEMA = "fedfilter.bench.fl_vs_flower_dp.v1"
UNBOUNDED_EPSILON = 1e4  # (g): device filters that never bind (the trusted server accounts)

SMOKE = dict(
    task="femnist",
    num_clients=10,
    clients_per_round=5,
    rounds=3,
    epsilon=[4.0],
    budgets="tiers",
    max_examples=40,
    max_test=300,
    local_epochs=1,
)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--smoke", action="store_true", help=f"a CI-sized run: {SMOKE} unless given")
    p.add_argument(
        "--preset",
        choices=sorted(PRESETS),
        default=None,
        help="named settings every arm shares (benchmarks/fl_vs_flower_dp_presets.py); options given win",
    )
    p.add_argument("--json", action="store_true", help="print the results as JSON on stdout (table on stderr)")
    p.add_argument("--task", choices=sorted(TASKS), default=None, help="default femnist")
    p.add_argument(
        "--epsilon", default=None, help="comma-separated per-device budgets (the smallest tier); default 2,8"
    )
    p.add_argument("--budgets", choices=("equal", "tiers"), default=None, help="default equal")
    p.add_argument("--delta", type=float, default=1e-5)
    p.add_argument("--rounds", type=int, default=None, help="default 30")
    p.add_argument("--clients-per-round", type=int, default=None, help="default 20")
    p.add_argument("--num-clients", type=int, default=None, help="default 105 (FEMNIST's offline writers)")
    p.add_argument("--alpha", type=float, default=0.3, help="mnist-dirichlet's label skew")
    p.add_argument("--max-examples", type=int, default=None, help="cap each client's training data (random subset)")
    p.add_argument("--max-test", type=int, default=None, help="cap the test set (random subset)")
    p.add_argument(
        "--min-reports",
        type=int,
        default=None,
        help="(b), (c): SecAgg+'s threshold m; a report carries 1/m of the sum's noise (default: per round // 2)",
    )
    p.add_argument(
        "--fedfilter-z",
        default=None,
        help="(b)-(d): this noise multiplier instead of (a)'s (fedfilter charges a device only when asked), or "
        "'plan': each placement's own planner (the smallest z whose filter pays for the rounds a device is "
        "expected to be asked, full clip every time; fedfilter.planning.federation)",
    )
    p.add_argument(
        "--plan-quantile",
        type=float,
        default=None,
        help="with --fedfilter-z plan: pay for this quantile of the number of times a device is asked "
        "(Binomial(rounds, asked / devices)) instead of the expected number; more noise, fewer devices "
        "whose filter shrinks their last updates",
    )
    p.add_argument(
        "--worst-case-factor",
        type=int,
        default=None,
        help="(b), (c): each device's worst-case budget is this times its epsilon (default min-reports, the "
        "demo's rule); a large factor shows what the account against a coordinator that breaks SecAgg+ costs",
    )
    p.add_argument("--sampled-per-round", type=int, default=None, help="(h): devices asked per round (default all)")
    p.add_argument("--sampled-min-reports", type=int, help="(h): SecAgg+'s threshold (default: plan's, 10%% drop-out)")
    p.add_argument("--clip", type=float, default=0.5)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--local-epochs", type=int, default=None, help="default 1")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--eval-every", type=int, default=1)
    p.add_argument(
        "--model",
        choices=("task", "dp-cnn", "quickstart-cnn"),
        default="task",
        help="the task's model (default), or for FEMNIST/MNIST the small CNN of the DP-SGD literature "
        "(Opacus' SampleConvNet layout, fedfilter.simulations.tasks.models.MnistCNN: 27,726 parameters at "
        "62 classes against FemnistCNN's 222,078; DP noise grows with the dimension), or Flower's "
        "quickstart-pytorch CNN for 28x28 images (QuickstartCNN: 44,426 parameters)",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--adaptive-clip", type=float, help="engine arms: adapt the clip from --clip to this quantile")
    p.add_argument("--clip-norm-lr", type=float, help="with --adaptive-clip: the clip's step (default 0.2)")
    p.add_argument("--clipped-count-stddev", type=float, help="with --adaptive-clip (default: per round / 20)")
    p.add_argument("--participation", choices=("uniform", "balanced"), help="engine arms (default uniform)")
    p.add_argument("--arms", default="abcde", help="which of a-h to run (default a-e; f is a diagnostic)")
    p.add_argument("--out", default=None, help="directory for results.json (checkpoint after every arm)")
    p.add_argument(
        "--checkpoint-every",
        type=int,
        default=5,
        help="with --out: save the running arm every this many rounds (DIR/checkpoints/; a rerun resumes it)",
    )
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("--markdown", action="store_true", help="print the table as markdown (rerun with --out: no rerun)")
    args = p.parse_args(argv)
    apply_preset(p, args, sys.argv[1:] if argv is None else argv)
    defaults = dict(
        task="femnist",
        num_clients=105,
        clients_per_round=20,
        rounds=30,
        epsilon=[2.0, 8.0],
        budgets="equal",
        max_examples=None,
        max_test=None,
        local_epochs=1,
    )
    if args.smoke:
        defaults.update(SMOKE)
    if isinstance(args.epsilon, str):
        try:
            args.epsilon = [float(e) for e in args.epsilon.split(",") if e.strip()]
        except ValueError:
            p.error(f"--epsilon must be comma-separated numbers. Found {args.epsilon!r}.")
    for name, value in defaults.items():
        if getattr(args, name, None) is None:
            setattr(args, name, value)
    problems = []
    if not args.epsilon or not all(math.isfinite(e) and e > 0 for e in args.epsilon):
        problems.append(f"--epsilon must be finite and > 0. Found {args.epsilon!r}.")
    if not 0 < args.delta < 1:
        problems.append(f"--delta must be in (0, 1). Found {args.delta!r}.")
    for name in (
        "rounds",
        "clients_per_round",
        "num_clients",
        "local_epochs",
        "batch_size",
        "eval_every",
        "checkpoint_every",
    ):
        if getattr(args, name) < 1:
            problems.append(f"--{name.replace('_', '-')} must be >= 1. Found {getattr(args, name)!r}.")
    if args.clients_per_round < 3:
        problems.append(
            f"--clients-per-round must be >= 3 (SecAgg+ needs a third node). Found {args.clients_per_round}."
        )
    if args.min_reports is not None and not 2 <= args.min_reports <= args.clients_per_round:
        problems.append(f"--min-reports must be in [2, clients-per-round]. Found {args.min_reports!r}.")
    if args.worst_case_factor is not None and args.worst_case_factor < 1:
        problems.append(f"--worst-case-factor must be >= 1. Found {args.worst_case_factor!r}.")
    if args.fedfilter_z is not None and args.fedfilter_z != "plan":
        given = args.fedfilter_z
        try:
            args.fedfilter_z = float(given)
        except ValueError:
            args.fedfilter_z = math.nan
        if not (math.isfinite(args.fedfilter_z) and args.fedfilter_z > 0):
            problems.append(f"--fedfilter-z must be 'plan' or a finite number > 0. Found {given!r}.")
    if args.plan_quantile is not None and not (0 < args.plan_quantile < 1 and args.fedfilter_z == "plan"):
        problems.append(f"--plan-quantile must lie in (0, 1), with --fedfilter-z plan. Found {args.plan_quantile!r}.")
    if not (math.isfinite(args.clip) and args.clip > 0):
        problems.append(f"--clip must be finite and > 0. Found {args.clip!r}.")
    problems += adaptive_clipping(args).problems() if args.adaptive_clip is not None else []
    if not args.arms or set(args.arms) - set(ARMS):
        problems.append(f"--arms must be letters among {''.join(ARMS)}. Found {args.arms!r}.")
    if problems:
        p.error(" ".join(problems))
    return args


# --- the federation ---------------------------------------------------------------------------


def load(args: argparse.Namespace):
    """The task, capped as asked (one random subset per client, drawn from ``--seed``)."""
    from fedfilter.simulations.tasks.registry import load_task

    name, partition = TASKS[args.task]
    task = load_task(name, num_clients=args.num_clients, partition=partition, alpha=args.alpha, seed=args.seed)
    rng = np.random.default_rng([args.seed, 27])
    train = task.train_data
    if args.max_examples:
        train = []
        for x, y in task.train_data:
            if len(y) > args.max_examples:
                idx = np.sort(rng.choice(len(y), size=args.max_examples, replace=False))
                x, y = np.ascontiguousarray(x[idx]), np.ascontiguousarray(y[idx])
            train.append((x, y))
    test = task.test_data
    if args.max_test and len(test[1]) > args.max_test:
        idx = np.sort(rng.choice(len(test[1]), size=args.max_test, replace=False))
        test = (np.ascontiguousarray(test[0][idx]), np.ascontiguousarray(test[1][idx]))
    model_fn = task.model_fn
    if args.model in ("dp-cnn", "quickstart-cnn"):
        if task.name not in ("femnist", "mnist"):
            raise SystemExit(f"--model {args.model} is for 28x28 images (femnist, mnist-*); not {args.task}.")
        from fedfilter.simulations.tasks.models import MnistCNN, QuickstartCNN

        model_fn = partial(MnistCNN if args.model == "dp-cnn" else QuickstartCNN, num_classes=task.num_classes)
    return replace(task, train_data=train, test_data=test, model_fn=model_fn)


def label_entropy(labels: np.ndarray) -> float:
    """The entropy (nats) of a device's label distribution: its label skew (0: one label)."""
    if len(labels) == 0:
        return 0.0
    p = np.unique(labels, return_counts=True)[1] / len(labels)
    return float(-(p * np.log(p)).sum())


def flower_arm(
    task,
    args,
    *,
    z: float | None,
    epsilon: float | None,
    progress=lambda: None,
    noise_seed: int | None = None,
    checkpoint: Path | None = None,
) -> dict[str, Any]:
    """(a) with ``z`` and Flower's accountant at ``epsilon``, or (e) with ``z=None``: Flower's own
    strategy code at the run's settings (``flower_central_dp.run_flower``), resumable from ``checkpoint``."""
    from harness.flower_central_dp import run_flower

    return run_flower(
        task,
        clients_per_round=args.clients_per_round,
        rounds=args.rounds,
        clip=args.clip,
        delta=args.delta,
        z=z,
        epsilon=epsilon,
        local_epochs=args.local_epochs,
        lr=args.lr,
        batch_size=args.batch_size,
        seed=args.seed,
        eval_every=args.eval_every,
        progress=progress,
        noise_seed=noise_seed,
        checkpoint=checkpoint,
        checkpoint_every=args.checkpoint_every,
    )


def engine_arm(
    task,
    args,
    *,
    arm: str,
    z: float,
    eps: np.ndarray,
    bar,
    run_id: str = "fl-vs-flower",
    checkpoint: Path | None = None,
    sampling: dict | None = None,
) -> dict[str, Any]:
    from fedfilter.deploy.devices import simulated_worst_case_epsilon
    from fedfilter.privacy.filters import rdp_order
    from fedfilter.protocol.secagg.grid import grid_step
    from fedfilter.simulations.engine import Engine, EngineConfig

    n, k = task.num_clients, args.clients_per_round
    distributed = arm in ("b", "c", "h")
    central = arm in ("f", "g")
    amplified = arm == "g"
    m = min_reports(args)
    sampled = sampled_engine_settings(sampling) if arm == "h" else {}
    if arm == "h":  # devices that sample themselves: the plan's devices per round and threshold
        k, m = sampling["per_round"], sampling["min_reports"]
    cfg = EngineConfig(
        task=task.name,
        num_clients=n,
        epsilon=np.full(n, UNBOUNDED_EPSILON) if amplified else eps,
        delta=args.delta,
        filter_kind="rdp" if distributed else "gdp",
        noise_multiplier=z,
        clip=args.clip,
        placement="distributed" if distributed else "central" if central else "local",
        min_reports=m if distributed else 1,
        worst_case_epsilon=[simulated_worst_case_epsilon(e, args.worst_case_factor or m) for e in eps]
        if distributed
        else None,
        accounting="worst-case" if arm == "c" else "individual",
        adaptive_clipping=adaptive_clipping(args),
        participation="poisson" if amplified else "balanced" if arm == "h" else args.participation or "uniform",
        rounds=args.rounds,
        fraction=k / n,
        local_epochs=args.local_epochs,
        lr=args.lr,
        batch_size=args.batch_size,
        seed=args.seed,
        run_id=run_id,  # the same noise streams (and sampling) in (b), (c) and (d): paired comparisons
        eval_every=args.eval_every,
        group_by="none",
        noise_draw="aggregate",
        norms="vectorised",
        torch_threads=1,
        **sampled,
    )
    engine = Engine(cfg, task=task)
    if engine.n_sampled != k:
        raise RuntimeError(f"internal error: the engine asks {engine.n_sampled} clients per round, not {k}")
    meta = {"arm": arm, "z": z, "epsilon": float(eps.min()), "run_id": run_id}
    run_engine_rounds(engine, args.rounds, checkpoint, meta, args.checkpoint_every, bar)
    res = engine.result()
    accuracy = [r.accuracy for r in res.rounds]
    extra: dict[str, Any] = {}
    if engine.full_allowance is not None:  # (c): the norm a full round is charged at (distributed: grid units)
        full = engine.full_allowance * (grid_step(args.clip) if distributed else 1.0)
        extra["full_round_norm"] = [float(full.min()), float(full.max())]
    devices = []
    for c in range(n):
        filt = engine.filters[engine.group[c]]
        devices.append(
            {
                "id": res.client_ids[c],
                "examples": int(len(task.train_data[c][1])),
                "label_entropy": label_entropy(task.train_data[c][1]),
                "epsilon": float(eps[c]),
                "spent_epsilon": float(res.spent_epsilon[c]),
                "filter": filt.kind,
                "alpha": float(rdp_order(filt)) if filt.kind == "rdp" else None,
                "state": [float(v) for v in res.state[c]],
                "exhausted_round": int(res.exhausted_round[c]),
            }
        )
    return {
        "accuracy_per_round": accuracy,
        "loss_per_round": [r.loss for r in res.rounds],
        "accuracy": next((a for a in reversed(accuracy) if a is not None), None),
        "contributing_per_round": [r.contributing for r in res.rounds],
        "clip_per_round": [r.clip for r in res.rounds],
        "rounds_run": int(sum(r.released for r in res.rounds)),
        "trusted_server": central,
        "noise_multiplier": z,
        "min_reports": cfg.min_reports,
        "placement": cfg.placement,
        "accounting": cfg.accounting,
        "exhausted": int((res.exhausted_round >= 0).sum()),
        "devices": devices,
        **extra,
        **({"accountant_epsilon": amplified_epsilon(z, args.delta, args.rounds, k / n)} if amplified else {}),
        **({"kept_per_round": [r.kept for r in res.rounds], "sampling_plan": sampling} if arm == "h" else {}),
    }


# --- the run ----------------------------------------------------------------------------------


def settings(args: argparse.Namespace, task) -> dict[str, Any]:
    keys = ("task", "budgets", "delta", "rounds", "clients_per_round", "clip", "lr", "local_epochs", "batch_size")
    out = {key: getattr(args, key) for key in keys}
    for key in (
        "min_reports",
        "fedfilter_z",
        "plan_quantile",
        "worst_case_factor",
        *("adaptive_clip", "clip_norm_lr", "clipped_count_stddev", "participation"),
        *("sampled_per_round", "sampled_min_reports"),
    ):  # absent: the default (keeps earlier results.json resumable)
        if getattr(args, key) is not None:
            out[key] = getattr(args, key)
    if args.model != "task":
        out["model"] = args.model
    out.update(
        num_clients=task.num_clients,
        max_examples=args.max_examples,
        max_test=args.max_test,
        alpha=args.alpha if args.task == "mnist-dirichlet" else None,
        eval_every=args.eval_every,
        seed=args.seed,
        test_examples=int(len(task.test_data[1])),
    )
    return out


def run(args: argparse.Namespace, log=print) -> dict[str, Any]:
    from harness.flower_central_dp import flower_noise_multiplier
    from tqdm import tqdm

    task = load(args)
    config = settings(args, task)
    path = Path(args.out) / "results.json" if args.out else None
    doc: dict[str, Any] = {"schema": SCHEMA, "settings": config, "results": []}
    if path is not None and path.exists():
        old = json.loads(path.read_text())
        if old.get("schema") == SCHEMA and old.get("settings") == config:
            doc = old  # resume: finished arms are kept
        else:
            raise SystemExit(f"{path} holds a run with other settings; choose another --out or move it away.")
    n, k = task.num_clients, args.clients_per_round
    if k > n:
        raise SystemExit(f"--clients-per-round={k} exceeds the {n} clients of {args.task}.")
    for epsilon in args.epsilon:
        entry = next((r for r in doc["results"] if r["epsilon"] == epsilon), None)
        if entry is None:
            eps = budgets(n, epsilon, args.budgets, args.seed)
            z = flower_noise_multiplier(float(eps.min()), args.delta, args.rounds, n, k)
            entry = {"epsilon": epsilon, "smallest_epsilon": float(eps.min()), "noise_multiplier": z, "arms": {}}
            doc["results"].append(entry)
        eps = budgets(n, epsilon, args.budgets, args.seed)
        z = entry["noise_multiplier"]
        if args.budgets == "tiers":
            log(
                f"epsilon {epsilon:g}: budget tiers {sorted(set(eps.tolist()))}; (a) Flower's central DP holds one "
                f"budget for the population, so it runs at the smallest, {eps.min():g}, for every device."
            )
        log(f"epsilon {epsilon:g}: z = {z:.4f} (Flower's accountant admits {args.rounds} rounds at {eps.min():g})")
        arm_z = fedfilter_noise_multipliers(task, args, float(eps.min()), z)
        if args.fedfilter_z is not None:
            chosen = ", ".join(f"({arm}) {arm_z[arm]:g}" for arm in "bcd")
            how = "planned by each placement's own accountant" if args.fedfilter_z == "plan" else "given"
            log(f"epsilon {epsilon:g}: fedfilter's z {how}: {chosen}; each device's filter enforces its budget")
        for arm in args.arms:
            if arm in entry["arms"]:
                continue
            done = next((r["arms"]["e"] for r in doc["results"] if "e" in r["arms"]), None)
            if arm == "e" and done is not None:  # no privacy: the same run at every epsilon (same seed)
                entry["arms"]["e"] = done
                _checkpoint(path, doc)
                continue
            started = time.perf_counter()
            checkpoint = arm_checkpoint(args, epsilon, arm)
            resumed = checkpointed_round(checkpoint)
            if resumed:
                log(f"epsilon {epsilon:g} ({arm}): resuming from the checkpoint after round {resumed} ({checkpoint})")
            with tqdm(
                total=args.rounds,
                desc=f"eps {epsilon:g} ({arm}) {ARMS[arm]}",
                disable=args.no_progress,
                file=sys.stderr,
            ) as bar:
                if arm in ("a", "e"):
                    private = arm == "a"
                    result = flower_arm(
                        task,
                        args,
                        z=z if private else None,
                        epsilon=float(eps.min()) if private else None,
                        progress=lambda: bar.update(1),
                        checkpoint=checkpoint,
                    )
                else:
                    if arm == "g" and "g" not in arm_z:
                        arm_z["g"] = amplified_noise_multiplier(float(eps.min()), args.delta, args.rounds, k / n)
                        log(f"epsilon {epsilon:g} (g): z = {arm_z['g']:.4f} (dp_accounting, Poisson rate {k / n:g})")
                    plan = sampling_plan(task, args, eps) if arm == "h" else None
                    if plan is not None:
                        arm_z["h"] = plan["noise_multiplier"]
                        log(f"epsilon {epsilon:g} (h): {plan['summary']}")
                    arm_noise = z if arm == "f" else arm_z[arm]
                    result = engine_arm(
                        task, args, arm=arm, z=arm_noise, eps=eps, bar=bar, checkpoint=checkpoint, sampling=plan
                    )
            result["name"] = ARMS[arm]
            result["seconds"] = round(time.perf_counter() - started, 2)
            if resumed:
                result["resumed_after_round"] = resumed  # "seconds" counts from there
            entry["arms"][arm] = result
            _checkpoint(path, doc)
            discard(checkpoint)
    return doc


def _checkpoint(path: Path | None, doc: dict[str, Any]) -> None:
    """Write ``doc`` to ``path`` (atomically) after every arm, run or copied, so a rerun resumes.

    Two runs may share ``--out`` with other ``--arms`` (``fl_vs_flower_dp_long.py`` runs (a) and (b) side
    by side): under a lock, the arms the file holds and ``doc`` lacks are merged into ``doc`` first."""
    import fcntl

    if path is None:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if path.exists():
            _merge(doc, json.loads(path.read_text()))
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(doc, indent=1))
        tmp.replace(path)


def _merge(doc: dict[str, Any], disk: dict[str, Any]) -> None:
    """Add to ``doc`` the epsilons and arms ``disk`` (the same settings) holds and ``doc`` lacks."""
    if disk.get("schema") != doc["schema"] or disk.get("settings") != doc["settings"]:
        return
    for theirs in disk["results"]:
        ours = next((r for r in doc["results"] if r["epsilon"] == theirs["epsilon"]), None)
        if ours is None:
            doc["results"].append(theirs)
            continue
        for arm, result in theirs["arms"].items():
            ours["arms"].setdefault(arm, result)
    doc["results"].sort(key=lambda r: r["epsilon"])


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    say = (lambda text: print(text, file=sys.stderr)) if args.json else print
    doc = run(args, log=say)
    from fl_vs_flower_dp_report import markdown, table

    say(markdown(doc) if args.markdown else table(doc))
    if args.json:
        print(json.dumps(doc))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
