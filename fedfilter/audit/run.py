"""``run_audit``: the distinguishing game and the exhaustion distinguishers, as one result dict.

Two lower bounds per model dtype, each at confidence 1 - alpha (Clopper-Pearson on both rates):

* ``epsilon_lower_bound``: ``log((TPR_lo - delta) / FPR_hi)`` (or with the roles swapped);
* ``gdp_epsilon_lower_bound``: ``mu_lb = Phi^-1(TPR_lo) - Phi^-1(FPR_hi)`` converted to epsilon at the
  claimed delta on the exact Gaussian curve (Nasr et al. 2023, arXiv 2302.07956, Section 5). It
  assumes the mechanism's trade-off is Gaussian, as the claim itself does.

Thresholds are never chosen on the trials that evaluate them: ``planned`` (default) fixes them
before any trial from the claimed model (``bounds.planned_tests``), so every trial evaluates;
``split`` chooses them on a random ``select_fraction`` of the trials and evaluates on the rest.
The exhaustion distinguishers always split (they have no model to plan from). Their verdicts are
one family (every distinguisher on every dtype): each is tested at alpha / (family size)
(Bonferroni), so that a mechanism that hides exhaustion fails none of them with probability at
least 1 - alpha. A device that refuses a dtype (a model it will not train) is reported as such.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from fedfilter.audit import bounds
from fedfilter.audit.distinguishers import distinguish, single_reply_tv
from fedfilter.audit.game import DeviceRefused, GameConfig, GameRun, play, probe_table, reuse_budget_solves, scores
from fedfilter.privacy import gaussian_dp

THRESHOLDS = ("planned", "split")
DTYPES = ("float32", "float64")
# Distinguisher -> (features it may use, whether one reply's Gaussian TV is allowed, else 0).
DISTINGUISHERS = {
    "value": (lambda k: k == "value", True),
    "bits": (lambda k: k.startswith("bits:"), True),
    "time": (lambda k: k == "time", False),
    "metadata-time": (lambda k: k == "metadata-time", False),
    "bytes": (lambda k: k == "bytes", False),
}


def gdp_epsilon(mu_lb: float, delta: float) -> float:
    """Epsilon of mu_lb-GDP at delta, rounded down (a lower bound stays a lower bound).

    Parameters
    ----------
    mu_lb : float
        A lower bound on mu.
    delta : float
        The claimed delta.

    Returns
    -------
    float
        The lower bound on epsilon (0 for mu_lb <= 0, inf for an infinite one).

    Examples
    --------
    >>> round(gdp_epsilon(0.5, 1e-5), 4), gdp_epsilon(0.0, 1e-5)
    (1.9931, 0.0)
    """
    if mu_lb <= 0:
        return 0.0
    if not math.isfinite(mu_lb):
        return math.inf
    return bounds.round_down(gaussian_dp.epsilon_for_mu(mu_lb, delta))


def game_bounds(
    run: GameRun, *, alpha: float, threshold: str, select_fraction: float, rng: np.random.Generator
) -> dict:
    """The game's two lower bounds on epsilon, with the tests and rates behind them.

    Parameters
    ----------
    run : GameRun
        The game's trials.
    alpha : float
        1 - confidence.
    threshold : str
        ``planned`` (tests fixed from the claim) or ``split`` (chosen on ``select_fraction`` of the
        trials, evaluated on the rest).
    select_fraction : float
        The share of trials that choose the test (``split``).
    rng : numpy.random.Generator
        Draws the split.

    Returns
    -------
    dict
        ``epsilon_lower_bound``, ``gdp_mu_lower_bound``, ``gdp_epsilon_lower_bound``, the claim, the
        schedule and both tests.

    Raises
    ------
    ValueError
        An unknown ``threshold``.

    Examples
    --------
    >>> run = play(GameConfig(epsilon=2.0, reply_hold_s=0.0), 2, rng=np.random.default_rng(0), seeded=True)
    >>> g = game_bounds(run, alpha=0.05, threshold="planned", select_fraction=0.5, rng=np.random.default_rng(0))
    >>> g["rounds_to_exhaust"], g["epsilon_lower_bound"] <= 2.0
    (3, True)
    """
    cfg = run.cfg
    s0, s1 = scores(run)
    if threshold == "planned":
        tests = bounds.planned_tests(run.effective_mu, s0.size, s1.size, delta=cfg.delta, alpha=alpha)
        eps_test, eps_rates = tests["epsilon"], bounds.rates_at(tests["epsilon"], s0, s1, delta=cfg.delta, alpha=alpha)
        mu_test, mu_rates = tests["mu"], bounds.rates_at(tests["mu"], s0, s1, delta=cfg.delta, alpha=alpha)
    elif threshold == "split":
        select = bounds.split_mask(s0.size, select_fraction, rng)
        eps_test, eps_rates = bounds.audit_scores(s0, s1, select, objective="epsilon", delta=cfg.delta, alpha=alpha)
        mu_test, mu_rates = bounds.audit_scores(s0, s1, select, objective="mu", delta=cfg.delta, alpha=alpha)
    else:
        raise ValueError(f"threshold must be one of {THRESHOLDS}. Found {threshold!r}.")
    return {
        "epsilon_lower_bound": eps_rates.epsilon_lb,
        "gdp_mu_lower_bound": mu_rates.mu_lb,
        "gdp_epsilon_lower_bound": gdp_epsilon(mu_rates.mu_lb, cfg.delta),
        "claimed_mu": cfg.claimed_mu,
        "attack_mu": run.effective_mu,
        "noise_multiplier": cfg.noise_multiplier,
        "rounds_to_exhaust": int(run.weights.size),
        "clipped_norms": [float(c) for c in run.weights],
        "epsilon_test": {**eps_test.__dict__, **eps_rates.as_dict()},
        "gdp_test": {**mu_test.__dict__, **mu_rates.as_dict()},
        "ledgers_verified": run.verified,
    }


def exhaustion_findings(run: GameRun, *, alpha: float, rng: np.random.Generator) -> dict:
    """Every exhaustion distinguisher's finding on one game's probe replies (half the trials select).

    Parameters
    ----------
    run : GameRun
        The game's trials.
    alpha : float
        1 - confidence of each verdict.
    rng : numpy.random.Generator
        Draws the split.

    Returns
    -------
    dict of str to dict
        Distinguisher -> ``Finding.as_dict()``.

    Examples
    --------
    >>> run = play(GameConfig(epsilon=2.0, reply_hold_s=0.0), 2, rng=np.random.default_rng(0), seeded=True)
    >>> sorted(exhaustion_findings(run, alpha=0.05, rng=np.random.default_rng(0)))
    ['bits', 'bytes', 'metadata-time', 'time', 'value']
    """
    noise_only, contributing = probe_table(run)
    select = bounds.split_mask(len(run.trials), 0.5, rng)
    tv = single_reply_tv(run.cfg.noise_multiplier)
    out = {}
    for name, (wanted, gaussian) in DISTINGUISHERS.items():
        keys = [k for k in noise_only if wanted(k)]
        finding = distinguish(
            name,
            {k: noise_only[k] for k in keys},
            {k: contributing[k] for k in keys},
            select,
            theory=tv if gaussian else 0.0,
            alpha=alpha,
        )
        out[name] = finding.as_dict()
    return out


def run_audit(
    *,
    epsilon: float,
    delta: float,
    trials: int,
    dtypes: Sequence[str] = DTYPES,
    rounds: int = 3,
    filter_kind: str = "gdp",
    clip: float = 1.0,
    alpha: float = 0.05,
    threshold: str = "planned",
    select_fraction: float = 0.5,
    seed: int | None = None,
    tmp_dir: str | None = None,
    device_epsilon: float | None = None,
    reply_hold_s: float = 0.02,
    progress: Callable[[int], None] | None = None,
    keep_runs: bool = False,
) -> dict:
    """Audit the claimed (epsilon, delta) through canary devices; see the module docstring.

    Parameters
    ----------
    epsilon, delta : float
        The claim.
    trials : int
        Pairs of canary devices per dtype (>= 2).
    dtypes : sequence of str, optional
        The model dtypes the coordinator sends.
    rounds : int, optional
        Full-norm rounds that exhaust the budget (sets the noise multiplier).
    filter_kind : str, optional
        The canaries' filter.
    clip : float, optional
        The clip norm C.
    alpha : float, optional
        1 - confidence of every bound.
    threshold : str, optional
        ``planned`` or ``split``.
    select_fraction : float, optional
        With ``split``: the share of trials that choose the test.
    seed : int, optional
        Makes the audit reproducible, device noise included (each canary device gets a
        ``noise-seed``); without it the devices draw their noise from the OS, as deployed.
    tmp_dir : str, optional
        Where the throw-away ledgers go.
    device_epsilon : float, optional
        The budget the devices really have (tests of the audit only).
    reply_hold_s : float, optional
        The devices' reply hold in the probe round.
    progress : callable, optional
        Called with the number of trials done.
    keep_runs : bool, optional
        Keep the raw trials under ``_runs`` (not JSON), for the plot.

    Returns
    -------
    dict
        The result: the bounds, every game and finding, and ``passed``.

    Raises
    ------
    ValueError
        Bad settings, or every dtype refused.

    Examples
    --------
    >>> result = run_audit(epsilon=2.0, delta=1e-5, trials=2, dtypes=["float32"], seed=0, reply_hold_s=0.0)
    >>> result["games"]["float32"]["rounds_to_exhaust"], result["epsilon_lower_bound"] <= 2.0
    (3, True)
    """
    problems = []
    if not (isinstance(trials, int) and trials >= 2):
        problems.append(f"trials must be an integer >= 2. Found {trials!r}.")
    if not (0 < alpha < 1):
        problems.append(f"alpha must be in (0, 1). Found {alpha!r}.")
    if threshold not in THRESHOLDS:
        problems.append(f"threshold must be one of {THRESHOLDS}. Found {threshold!r}.")
    bad = [d for d in dtypes if d not in DTYPES]
    if bad or not dtypes:
        problems.append(f"dtypes must be among {DTYPES}. Found {list(dtypes)!r}.")
    if problems:
        raise ValueError(" ".join(problems))
    rng = np.random.default_rng(seed)
    started = time.perf_counter()
    # Per dtype: the game's bounds, or {"refused": why} when the canary devices refused it.
    games: dict[str, dict[str, Any]] = {}
    exhaustion: dict[str, dict] = {}
    runs: dict[str, GameRun] = {}
    with reuse_budget_solves():
        for dtype in dtypes:
            cfg = GameConfig(
                epsilon=epsilon,
                delta=delta,
                filter_kind=filter_kind,
                rounds=rounds,
                clip=clip,
                dtype=dtype,
                device_epsilon=device_epsilon,
                reply_hold_s=reply_hold_s,
            )
            try:
                run = play(cfg, trials, rng=rng, seeded=seed is not None, tmp_dir=tmp_dir, progress=progress)
            except DeviceRefused as err:
                games[dtype] = {"refused": str(err)}
                if progress is not None:
                    progress(trials)
                continue
            games[dtype] = game_bounds(run, alpha=alpha, threshold=threshold, select_fraction=select_fraction, rng=rng)
            exhaustion[dtype] = exhaustion_findings(run, alpha=alpha / (len(DISTINGUISHERS) * len(dtypes)), rng=rng)
            runs[dtype] = run
    played = [g for g in games.values() if "refused" not in g]
    if not played:
        raise ValueError(
            "the canary devices refused every model dtype: "
            + "; ".join(f"{d}: {g['refused']}" for d, g in games.items())
        )
    eps_lb = max(g["epsilon_lower_bound"] for g in played)
    gdp_lb = max(g["gdp_epsilon_lower_bound"] for g in played)
    within_claim = eps_lb <= epsilon and gdp_lb <= epsilon
    exhaustion_ok = all(f["within_bound"] for d in exhaustion.values() for f in d.values())
    result = {
        "claimed_epsilon": float(epsilon),
        "delta": float(delta),
        "placement": "local",
        "filter": filter_kind,
        "reply_hold_s": float(reply_hold_s),
        "trials": trials,
        "dtypes": list(dtypes),
        "alpha": alpha,
        "exhaustion_alpha_each": alpha / (len(DISTINGUISHERS) * len(dtypes)),
        "threshold": threshold,
        "epsilon_lower_bound": eps_lb,
        "gdp_epsilon_lower_bound": gdp_lb,
        "gdp_share_of_claim": gdp_lb / epsilon,
        "games": games,
        "exhaustion": exhaustion,
        "within_claim": within_claim,
        "exhaustion_within_bounds": exhaustion_ok,
        "passed": within_claim and exhaustion_ok,
        "seed": seed,
        "seconds": time.perf_counter() - started,
    }
    if device_epsilon is not None:
        result["device_epsilon"] = float(device_epsilon)
    if keep_runs:
        result["_runs"] = runs  # not JSON: the raw trials, for the plot and the tests
    return result
