"""The field checks of a study file: the known keys and values of each table, and a checker that
collects every problem (naming the key and the value found) instead of stopping at the first.

``simulations.study.config.parse_study`` runs them and raises one ``StudyConfigError`` listing them all.
"""

from __future__ import annotations

import math
from typing import Any, TypeGuard

from fedfilter.privacy.filters import FILTER_KINDS
from fedfilter.protocol.request import AFTER_EXHAUSTION, PLACEMENTS
from fedfilter.simulations.study.specs import BudgetDistribution, DataSpec

DISTRIBUTIONS = {
    # name: (required parameters, optional parameters with defaults)
    "fixed": ((), {}),
    "uniform": (("low", "high"), {}),
    "lognormal": (("sigma",), {"median": 1.0}),
    "two-level": (("low", "high", "share_high"), {}),
}
LABEL_TASKS = ("digits", "mnist", "adult")  # centralised data we split: iid or dirichlet
NATURAL_TASKS = ("femnist", "shakespeare")  # split by writer / speaking role
PARTITIONS = ("iid", "dirichlet", "natural")
GROUPINGS = ("label", "size")  # label: class of a client's majority label; size: quartile of data size

STUDY_KEYS = {"name", "description", "rounds", "seeds", "filter", "delta", "eval_every", "budget_grid"}
SWEEP_KEYS = ("budget_level", "heterogeneity", "after_exhaustion", "noise", "data")
DATA_KEYS = {
    "task",
    "partition",
    "alpha",
    "num_clients",
    "partition_seed",
    "groups",
    "max_examples_per_client",
    "max_test_examples",
    "fraction",
    "min_reports",
}
# [federation] keys and their checks; passed to simulations.engine.EngineConfig under the same names.
FEDERATION_KEYS: dict[str, tuple[type, str]] = {
    "noise_multiplier": (float, "positive"),
    "clip": (float, "positive"),
    "fraction": (float, "fraction"),
    "min_reports": (int, "positive"),
    "local_epochs": (int, "positive"),
    "lr": (float, "positive"),
    "batch_size": (int, "positive"),
    "server_lr": (float, "positive"),
    "run_quota": (float, "fraction"),
    "exhausted_below": (float, "unit"),
    "client_mode": (str, "auto|single-example|multi-example"),
    "noise_draw": (str, "per-client|aggregate"),
    "chunk_size": (int, "positive"),
    "secagg_graph": (str, "full|sparse"),
    "secagg_dropout_rate": (float, "unit"),
    "secagg_colluders": (int, "nonneg"),
    # Distributed runs: each client's worst-case-epsilon is this times its epsilon (client/ledger/worst_case.py);
    # required when sweep.noise includes 'distributed' (the runner passes worst_case_epsilon).
    "worst_case_factor": (float, "positive"),
    "participation": (str, "uniform|balanced"),
    # Adaptive clipping (Flower's names; EngineConfig.adaptive_clipping): on when target_clipped_quantile
    # is given; clip is then the first round's and noise_multiplier the accounted z_eff.
    "target_clipped_quantile": (float, "prob"),
    "clip_norm_lr": (float, "positive"),
    "clipped_count_stddev": (float, "positive"),
}
# The [federation] keys that make up EngineConfig.adaptive_clipping (the runner builds it).
ADAPTIVE_KEYS = ("target_clipped_quantile", "clip_norm_lr", "clipped_count_stddev")
FEDERATION_DEFAULTS: dict[str, Any] = {"noise_multiplier": 1.0, "clip": 1.0, "fraction": 1.0, "min_reports": 1}


def _is_int(v: object) -> TypeGuard[int]:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_num(v: object) -> TypeGuard[float]:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


class Checker:
    """Collects every problem of a file (key, value found, what was expected) instead of stopping.

    Examples
    --------
    >>> c = Checker()
    >>> c.number("study.rounds", 0, kind="positive", integer=True)
    >>> c.bad("study.filter", "xyz", "one of gdp, zcdp, rdp")
    >>> c.problems
    ['study.rounds must be an integer >= 1. Found 0.', "study.filter must be one of gdp, zcdp, rdp. Found 'xyz'."]
    """

    def __init__(self):
        self.problems: list[str] = []

    def bad(self, key: str, value, expected: str) -> None:
        """Record that ``key`` holds ``value`` where ``expected`` was due.

        Parameters
        ----------
        key : str
            The dotted key (``study.rounds``).
        value : object
            The value found.
        expected : str
            What the key must be, as a phrase after "must be".

        Examples
        --------
        >>> c = Checker()
        >>> c.bad("study.name", "", "a non-empty string")
        >>> c.problems
        ["study.name must be a non-empty string. Found ''."]
        """
        self.problems.append(f"{key} must be {expected}. Found {value!r}.")

    def unknown(self, table: str, got: dict, known) -> None:
        """Record every key of ``got`` that is not in ``known``.

        Parameters
        ----------
        table : str
            The table's name, for the message.
        got : dict
            The table as read.
        known : iterable of str
            Its known keys.

        Examples
        --------
        >>> c = Checker()
        >>> c.unknown("study", {"name": "s", "roundz": 3}, {"name", "rounds"})
        >>> c.problems
        ['study.roundz is not a known key (known: name, rounds). Found roundz = 3.']
        """
        for k in sorted(set(got) - set(known)):
            self.problems.append(
                f"{table}.{k} is not a known key (known: {', '.join(sorted(known))}). Found {k} = {got[k]!r}."
            )

    def table(self, doc: dict, key: str, required: bool = True) -> dict:
        """The table ``doc[key]``, or ``{}`` (with a problem when it is required and missing, or not a table).

        Parameters
        ----------
        doc : dict
            The parsed document (or an enclosing table).
        key : str
            The table's name.
        required : bool, optional
            Whether a missing table is a problem.

        Returns
        -------
        dict
            The table, or an empty one.

        Examples
        --------
        >>> c = Checker()
        >>> c.table({"study": {"rounds": 3}}, "study"), c.table({}, "sweep"), c.problems
        ({'rounds': 3}, {}, ['[sweep] is missing.'])
        """
        v = doc.get(key)
        if v is None:
            if required:
                self.problems.append(f"[{key}] is missing.")
            return {}
        if not isinstance(v, dict):
            self.bad(key, v, "a table")
            return {}
        return v

    def number(self, key, v, *, kind: str, integer: bool = False):
        """Record a problem unless ``v`` is a finite number (an integer with ``integer``) of ``kind``.

        Parameters
        ----------
        key : str
            The dotted key, for the message.
        v : object
            The value found.
        kind : str
            ``positive``, ``nonneg``, ``fraction`` (0, 1], ``open-unit`` (0, 1), ``unit`` [0, 1) or ``prob`` [0, 1].
        integer : bool, optional
            Require an integer (a bool is not one).

        Examples
        --------
        >>> c = Checker()
        >>> c.number("study.delta", 1e-5, kind="open-unit")
        >>> c.number("study.delta", 1.0, kind="open-unit")
        >>> c.problems
        ['study.delta must be a number in (0, 1). Found 1.0.']
        """
        if integer and not _is_int(v):
            self.bad(key, v, "an integer" + {"positive": " >= 1", "nonneg": " >= 0"}.get(kind, ""))
            return
        if not _is_num(v):
            self.bad(key, v, "a finite number")
            return
        ok, what = {
            "positive": (v > 0, "> 0" if not integer else ">= 1"),
            "nonneg": (v >= 0, ">= 0"),
            "fraction": (0 < v <= 1, "in (0, 1]"),
            "open-unit": (0 < v < 1, "in (0, 1)"),
            "unit": (0 <= v < 1, "in [0, 1)"),
            "prob": (0 <= v <= 1, "in [0, 1]"),
        }[kind]
        if not ok:
            self.bad(key, v, ("an integer " if integer else "a number ") + what)


def check_study(c: Checker, t: dict) -> dict:
    """Check ``[study]`` and fill in its defaults.

    Parameters
    ----------
    c : Checker
        Collects the problems.
    t : dict
        The ``[study]`` table.

    Returns
    -------
    dict
        ``name``, ``description``, ``rounds``, ``seeds``, ``filter``, ``delta``, ``eval_every``,
        ``budget_grid`` (unchecked values kept as found; ``c`` names the problems).

    Examples
    --------
    >>> c = Checker()
    >>> check_study(c, {"rounds": 20})["filter"], c.problems
    ('gdp', [])
    """
    c.unknown("study", t, STUDY_KEYS)
    out = {
        "name": t.get("name", "study"),
        "description": t.get("description", ""),
        "rounds": t.get("rounds"),
        "seeds": t.get("seeds", [0]),
        "filter": t.get("filter", "gdp"),
        "delta": t.get("delta", 1e-5),
        "eval_every": t.get("eval_every", 1),
        "budget_grid": t.get("budget_grid", 8),
    }
    if not (isinstance(out["name"], str) and out["name"]):
        c.bad("study.name", out["name"], "a non-empty string")
    if not isinstance(out["description"], str):
        c.bad("study.description", out["description"], "a string")
    if "rounds" not in t:
        c.problems.append("study.rounds is missing (the number of rounds every run lasts).")
    else:
        c.number("study.rounds", out["rounds"], kind="positive", integer=True)
    seeds = out["seeds"]
    if not (
        isinstance(seeds, list)
        and seeds
        and all(_is_int(s) and s >= 0 for s in seeds)
        and len(set(seeds)) == len(seeds)
    ):
        c.bad("study.seeds", seeds, "a non-empty list of distinct integers >= 0")
    if out["filter"] not in FILTER_KINDS:
        c.bad("study.filter", out["filter"], f"one of {', '.join(FILTER_KINDS)}")
    c.number("study.delta", out["delta"], kind="open-unit")
    c.number("study.eval_every", out["eval_every"], kind="positive", integer=True)
    c.number("study.budget_grid", out["budget_grid"], kind="nonneg", integer=True)
    return out


def check_federation(c: Checker, t: dict) -> dict:
    """Check ``[federation]`` (``FEDERATION_KEYS``) on top of ``FEDERATION_DEFAULTS``.

    Parameters
    ----------
    c : Checker
        Collects the problems.
    t : dict
        The ``[federation]`` table.

    Returns
    -------
    dict
        The settings every run shares, floats typed as floats.

    Examples
    --------
    >>> c = Checker()
    >>> check_federation(c, {"noise_multiplier": 2, "noise_draw": "exact"})["noise_multiplier"]
    2.0
    >>> c.problems
    ["federation.noise_draw must be one of per-client, aggregate. Found 'exact'."]
    """
    c.unknown("federation", t, FEDERATION_KEYS)
    out = dict(FEDERATION_DEFAULTS)
    for k, v in t.items():
        if k not in FEDERATION_KEYS:
            continue
        typ, rule = FEDERATION_KEYS[k]
        if typ is str:
            choices = rule.split("|")
            if v not in choices:
                c.bad(f"federation.{k}", v, f"one of {', '.join(choices)}")
        else:
            c.number(f"federation.{k}", v, kind=rule, integer=typ is int)
        out[k] = float(v) if typ is float and _is_num(v) else v
    if "target_clipped_quantile" not in t and any(k in t for k in ADAPTIVE_KEYS):
        given = [k for k in ADAPTIVE_KEYS if k in t]
        c.bad(f"federation.{given[0]}", t[given[0]], "set with federation.target_clipped_quantile (adaptive clipping)")
    return out


def check_distribution(c: Checker, name: str, t) -> BudgetDistribution | None:
    """Check ``[heterogeneity.<name>]`` (``DISTRIBUTIONS``).

    Parameters
    ----------
    c : Checker
        Collects the problems.
    name : str
        The distribution's name.
    t : object
        Its table as read.

    Returns
    -------
    BudgetDistribution or None
        None when the table or its distribution is unusable.

    Examples
    --------
    >>> check_distribution(Checker(), "ln", {"distribution": "lognormal", "sigma": 0.5})
    BudgetDistribution(name='ln', distribution='lognormal', params={'sigma': 0.5})
    """
    key = f"heterogeneity.{name}"
    if not isinstance(t, dict):
        c.bad(key, t, "a table")
        return None
    dist = t.get("distribution")
    if dist not in DISTRIBUTIONS:
        c.bad(f"{key}.distribution", dist, f"one of {', '.join(DISTRIBUTIONS)}")
        return None
    required, optional = DISTRIBUTIONS[dist]
    c.unknown(key, t, {"distribution", *required, *optional})
    params = {}
    for p in required:
        if p not in t:
            c.problems.append(f"{key}.{p} is missing (a {dist} distribution needs {', '.join(required)}).")
    for p in (*required, *optional):
        if p in t:
            kind = "prob" if p == "share_high" else "nonneg" if p == "sigma" else "positive"
            before = len(c.problems)
            c.number(f"{key}.{p}", t[p], kind=kind)
            if len(c.problems) == before:
                params[p] = float(t[p])
    if dist in ("uniform", "two-level") and "low" in params and "high" in params and params["low"] > params["high"]:
        c.problems.append(f"{key}.low must be <= {key}.high. Found low = {params['low']!r}, high = {params['high']!r}.")
    return BudgetDistribution(name, dist, params)


def check_data(c: Checker, name: str, t) -> DataSpec | None:
    """Check ``[data.<name>]``: task, partition, clients and caps.

    Parameters
    ----------
    c : Checker
        Collects the problems.
    name : str
        The data set's name.
    t : object
        Its table as read.

    Returns
    -------
    DataSpec or None
        None when the data set is unusable.

    Examples
    --------
    >>> c = Checker()
    >>> check_data(c, "d", {"task": "digits", "num_clients": 10}).partition
    'iid'
    >>> check_data(c, "f", {"task": "femnist", "partition": "iid", "num_clients": 10}) is None
    True
    >>> c.problems
    ["data.f.partition must be 'natural' for femnist (split by writer). Found 'iid'."]
    """
    key = f"data.{name}"
    if not isinstance(t, dict):
        c.bad(key, t, "a table")
        return None
    c.unknown(key, t, DATA_KEYS)
    task, part = t.get("task"), t.get("partition", "natural" if t.get("task") in NATURAL_TASKS else "iid")
    ok = True
    if task not in LABEL_TASKS + NATURAL_TASKS:
        c.bad(f"{key}.task", task, f"one of {', '.join(LABEL_TASKS + NATURAL_TASKS)}")
        ok = False
    if part not in PARTITIONS:
        c.bad(f"{key}.partition", part, f"one of {', '.join(PARTITIONS)}")
        ok = False
    elif task in NATURAL_TASKS and part != "natural":
        c.bad(
            f"{key}.partition",
            part,
            f"'natural' for {task} (split by {'writer' if task == 'femnist' else 'speaking role'})",
        )
        ok = False
    elif task in LABEL_TASKS and part == "natural":
        c.bad(f"{key}.partition", part, f"'iid' or 'dirichlet' for {task} (it has no natural per-user split)")
        ok = False
    n = t.get("num_clients")
    if n is None:
        c.problems.append(f"{key}.num_clients is missing.")
        ok = False
    else:
        before = len(c.problems)
        c.number(f"{key}.num_clients", n, kind="positive", integer=True)
        ok &= len(c.problems) == before
    alpha = t.get("alpha", 0.5)
    if "alpha" in t and part != "dirichlet":
        c.problems.append(
            f"{key}.alpha is only used with partition = 'dirichlet'. Found alpha = {alpha!r} with partition = {part!r}."
        )
    before = len(c.problems)
    c.number(f"{key}.alpha", alpha, kind="positive")
    c.number(f"{key}.partition_seed", t.get("partition_seed", 0), kind="nonneg", integer=True)
    ok &= len(c.problems) == before
    caps = {}
    for k in ("max_examples_per_client", "max_test_examples"):
        if k in t:
            before = len(c.problems)
            c.number(f"{key}.{k}", t[k], kind="positive", integer=True)
            ok &= len(c.problems) == before
            caps[k] = t[k]
    if "fraction" in t:
        before = len(c.problems)
        c.number(f"{key}.fraction", t["fraction"], kind="fraction")
        ok &= len(c.problems) == before
        caps["fraction"] = float(t["fraction"]) if _is_num(t["fraction"]) else t["fraction"]
    if "min_reports" in t:
        before = len(c.problems)
        c.number(f"{key}.min_reports", t["min_reports"], kind="positive", integer=True)
        ok &= len(c.problems) == before
        caps["min_reports"] = t["min_reports"]
    groups = t.get("groups", "label" if task in LABEL_TASKS else "size")
    if groups not in GROUPINGS:
        c.bad(f"{key}.groups", groups, f"one of {', '.join(GROUPINGS)}")
        ok = False
    # The checks above reject any other task or count; the isinstance tests restate that for the type checker.
    if not ok or not isinstance(task, str) or not _is_int(n):
        return None
    return DataSpec(name, task, part, n, float(alpha), int(t.get("partition_seed", 0)), groups, **caps)


def check_sweep(c: Checker, t: dict, hets: dict, datas: dict) -> dict:
    """Check ``[sweep]``: every list non-empty, without repeats, naming defined tables.

    Parameters
    ----------
    c : Checker
        Collects the problems.
    t : dict
        The ``[sweep]`` table.
    hets, datas : dict
        The ``[heterogeneity]`` and ``[data]`` tables as read (the names a sweep may use).

    Returns
    -------
    dict of str to list
        Each sweep key's list; the modes default to the system's defaults.

    Examples
    --------
    >>> c = Checker()
    >>> table = {"budget_level": [4], "heterogeneity": ["fixed"], "data": ["d"]}
    >>> sweep = check_sweep(c, table, {"fixed": {}}, {"d": {}})
    >>> sweep["after_exhaustion"], sweep["noise"], c.problems  # the modes default to the system's
    (['noise-only'], ['local'], [])
    """
    c.unknown("sweep", t, SWEEP_KEYS)
    out = {}
    choices = {"after_exhaustion": AFTER_EXHAUSTION, "noise": PLACEMENTS}
    for k in SWEEP_KEYS:
        v = t.get(k)
        if v is None:
            if k in choices:  # modes default to the system's defaults
                out[k] = [choices[k][0]]
                continue
            c.problems.append(f"sweep.{k} is missing (a list).")
            continue
        if not isinstance(v, list) or not v:
            c.bad(f"sweep.{k}", v, "a non-empty list")
            continue
        if len(set(map(repr, v))) != len(v):
            c.bad(f"sweep.{k}", v, "a list without repeats")
        if k == "budget_level":
            for i, x in enumerate(v):
                c.number(f"sweep.budget_level[{i}]", x, kind="positive")
        elif k in choices:
            for i, x in enumerate(v):
                if x not in choices[k]:
                    c.bad(f"sweep.{k}[{i}]", x, f"one of {', '.join(choices[k])}")
        else:
            tables = hets if k == "heterogeneity" else datas
            for i, x in enumerate(v):
                if not isinstance(x, str) or x not in tables:
                    defined = ", ".join(sorted(tables)) or "none"
                    c.problems.append(
                        f"sweep.{k}[{i}] names [{k}.{x}], which is not defined (defined: {defined}). Found {x!r}."
                    )
        out[k] = v
    return out


def check_min_reports(c: Checker, federation: dict, sweep: dict, datas: dict[str, DataSpec]) -> None:
    """Cross-checks between tables for distributed noise.

    Distributed noise needs ``min_reports >= 2`` to mean anything and a ``worst_case_factor``; a
    round with fewer than ``min_reports`` reports is dropped, so that many must be reachable with the
    clients asked per round.

    Parameters
    ----------
    c : Checker
        Collects the problems.
    federation : dict
        ``check_federation``'s result.
    sweep : dict
        ``check_sweep``'s result.
    datas : dict of str to DataSpec
        The checked data sets.

    Examples
    --------
    >>> c = Checker()
    >>> datas = {"d": DataSpec("d", "digits", "iid", 10, fraction=0.2)}
    >>> fed = {"min_reports": 5, "fraction": 1.0, "worst_case_factor": 2.0}
    >>> check_min_reports(c, fed, {"noise": ["distributed"], "data": ["d"]}, datas)
    >>> c.problems[0].split(":")[0]
    'federation.min_reports = 5 exceeds the 2 clients asked per round for [data.d] (fraction 0.2 of 10)'
    """
    shared = federation.get("min_reports")
    factor = federation.get("worst_case_factor")
    if "distributed" in sweep.get("noise", []) and not (_is_num(factor) and factor >= 1):
        c.problems.append(
            "federation.worst_case_factor must be a number >= 1 when sweep.noise includes 'distributed': each "
            "client's worst-case-epsilon (its budget against a coordinator that forges SecAgg+ peers and reads "
            f"one report alone) is that times its epsilon; a device without one refuses. Found {factor!r}."
        )
    if "distributed" in sweep.get("noise", []) and _is_int(shared) and shared < 2:
        c.problems.append(
            f"federation.min_reports must be >= 2 when sweep.noise includes 'distributed' "
            f"(each client adds 1/min_reports of the noise variance). Found {shared!r}."
        )
    if "distributed" in sweep.get("noise", []):
        for name in sweep.get("data", []):
            d = datas.get(name) if isinstance(name, str) else None
            m = shared if d is None or d.min_reports is None else d.min_reports
            where = "federation.min_reports" if d is None or d.min_reports is None else f"data.{name}.min_reports"
            if d is not None and d.min_reports is not None and d.min_reports < 2:
                c.problems.append(f"{where} must be >= 2 for distributed runs. Found {m!r}.")
            if not _is_int(m):
                continue
            frac = federation.get("fraction") if d is None or d.fraction is None else d.fraction
            if d is None or not (_is_num(frac) and 0 < frac <= 1):
                continue
            asked = max(1, math.ceil(frac * d.num_clients))  # the engine asks ceil(fraction * n)
            if m > asked:
                c.problems.append(
                    f"{where} = {m} exceeds the {asked} clients asked per round for "
                    f"[data.{name}] (fraction {frac:g} of {d.num_clients}): every distributed round would "
                    f"be dropped. Found min_reports = {m!r}."
                )


def check_placement_filter(c: Checker, study: dict, sweep: dict) -> None:
    """Distributed noise needs the study's filter to be rdp.

    Distributed noise is Skellam on the SecAgg+ grid, which only the rdp filter accounts (devices
    refuse it under gdp or zcdp); the study's one filter then serves its local runs too, so local
    and distributed runs spend the same kind of budget.

    Parameters
    ----------
    c : Checker
        Collects the problems.
    study : dict
        ``check_study``'s result.
    sweep : dict
        ``check_sweep``'s result.

    Examples
    --------
    >>> c = Checker()
    >>> check_placement_filter(c, {"filter": "gdp"}, {"noise": ["local", "distributed"]})
    >>> c.problems[0].split(" (")[0]
    "study.filter must be 'rdp' when sweep.noise includes 'distributed'"
    """
    if "distributed" in sweep.get("noise", []) and study.get("filter") in FILTER_KINDS and study["filter"] != "rdp":
        c.problems.append(
            "study.filter must be 'rdp' when sweep.noise includes 'distributed' (distributed noise is Skellam "
            f"on the SecAgg+ grid, accounted by the rdp filter only). Found filter = {study['filter']!r}."
        )
