"""What a checked study is made of: budget distributions, data sets, runs, and the ``StudyConfig``
that expands a sweep into runs and draws each run's per-client budgets.

``simulations.study.config`` parses and checks a study file into these; nothing here reads TOML.
"""

from __future__ import annotations

import itertools
import zlib
from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass(frozen=True)
class BudgetDistribution:
    """Per-client budgets ``level * draw``; ``params`` are those of the shape at level 1.

    Parameters
    ----------
    name : str
        The distribution's name in the study (``[heterogeneity.<name>]``).
    distribution : str
        ``fixed``, ``uniform`` (``low``, ``high``), ``lognormal`` (``sigma``, ``median``) or
        ``two-level`` (``low``, ``high``, ``share_high``).
    params : dict of str to float
        The shape's parameters at level 1.

    Examples
    --------
    >>> dist = BudgetDistribution("spread", "uniform", {"low": 0.5, "high": 1.5})
    >>> dist.describe(4)
    'epsilon_i = 4 x uniform[0.5, 1.5]'
    """

    name: str
    distribution: str
    params: dict[str, float]

    def draw(self, n: int, rng: np.random.Generator) -> np.ndarray:
        """Draw ``n`` per-client factors at level 1.

        Parameters
        ----------
        n : int
            The number of clients.
        rng : numpy.random.Generator
            The source of randomness (unused by ``fixed``).

        Returns
        -------
        numpy.ndarray
            ``n`` positive factors; a client's budget is the level times its factor.

        Examples
        --------
        >>> dist = BudgetDistribution("two", "two-level", {"low": 1.0, "high": 4.0, "share_high": 0.5})
        >>> sorted(set(dist.draw(100, np.random.default_rng(0)).tolist()))
        [1.0, 4.0]
        """
        p = self.params
        if self.distribution == "fixed":
            return np.ones(n)
        if self.distribution == "uniform":
            return rng.uniform(p["low"], p["high"], size=n)
        if self.distribution == "lognormal":
            return p.get("median", 1.0) * np.exp(p["sigma"] * rng.standard_normal(n))
        # two-level: a share_high minority at `high`, the rest at `low`
        return np.where(rng.random(n) < p["share_high"], p["high"], p["low"])

    def describe(self, level: float | None = None) -> str:
        """The distribution in words, e.g. ``4 x lognormal(median 1, sigma 0.75)``.

        Parameters
        ----------
        level : float, optional
            The budget level; without it, the shape alone.

        Returns
        -------
        str
            The description.

        Examples
        --------
        >>> BudgetDistribution("ln", "lognormal", {"sigma": 0.75}).describe()
        'lognormal(median 1, sigma 0.75)'
        >>> BudgetDistribution("fixed", "fixed", {}).describe(4)
        'epsilon_i = 4 for every client'
        """
        p = self.params
        body = {
            "fixed": "fixed",
            "uniform": f"uniform[{_g(p.get('low'))}, {_g(p.get('high'))}]",
            "lognormal": f"lognormal(median {_g(p.get('median', 1.0))}, sigma {_g(p.get('sigma'))})",
            "two-level": (
                f"two-level({_g(p.get('low'))} w.p. {_g(1 - p.get('share_high', 0))}, "
                f"{_g(p.get('high'))} w.p. {_g(p.get('share_high'))})"
            ),
        }[self.distribution]
        if level is None:
            return body
        if self.distribution == "fixed":
            return f"epsilon_i = {_g(level)} for every client"
        return f"epsilon_i = {_g(level)} x {body}"


@dataclass(frozen=True)
class DataSpec:
    """A data set of the study (``[data.<name>]``): the task, how it is split, and its caps.

    Parameters
    ----------
    name : str
        The data set's name in the study.
    task : str
        A built-in task (``fedfilter.simulations.tasks.registry.TASKS``).
    partition : str
        ``iid``, ``dirichlet`` or ``natural`` (the task's own per-user split).
    num_clients : int
        The number of clients.
    alpha : float, optional
        The Dirichlet concentration.
    partition_seed : int, optional
        The split's seed.
    groups : str, optional
        How clients are grouped in the report (see ``groups.GROUPINGS``).
    max_examples_per_client, max_test_examples : int, optional
        Random subsets of each client's training data and of the test set.
    fraction : float, optional
        Share of clients asked per round; None: ``[federation] fraction``.
    min_reports : int, optional
        Fewest reports a distributed round releases; None: ``[federation]``'s.

    Examples
    --------
    >>> DataSpec("d", "digits", "dirichlet", 50, alpha=0.3, fraction=0.2).describe()
    'digits, label-Dirichlet alpha=0.3, 50 clients (groups by label); 0.2 of them asked per round (random subsets)'
    """

    name: str
    task: str
    partition: str  # iid | dirichlet | natural
    num_clients: int
    alpha: float = 0.5
    partition_seed: int = 0
    groups: str = "label"  # see GROUPINGS
    max_examples_per_client: int | None = None  # random subset of each client's training data
    max_test_examples: int | None = None  # random subset of the test set
    fraction: float | None = None  # share of clients asked per round; None: [federation].fraction
    min_reports: int | None = None  # fewest reports a distributed round releases; None: [federation]

    def describe(self) -> str:
        """The data set in words, for the report.

        Returns
        -------
        str
            Task, split, clients and caps.

        Examples
        --------
        >>> DataSpec("digits-iid", "digits", "iid", 100).describe()
        'digits, IID, 100 clients (groups by label)'
        """
        split = {
            "iid": "IID",
            "dirichlet": f"label-Dirichlet alpha={_g(self.alpha)}",
            "natural": "natural per-user split",
        }[self.partition]
        caps = []
        if self.max_examples_per_client:
            caps.append(f"at most {self.max_examples_per_client} training examples per client")
        if self.max_test_examples:
            caps.append(f"{self.max_test_examples} test examples")
        if self.fraction is not None:
            caps.insert(0, f"{self.fraction:g} of them asked per round")
        if self.min_reports is not None:
            caps.append(f"min_reports {self.min_reports}")
        extra = f"; {', '.join(caps)} (random subsets)" if caps else ""
        return f"{self.task}, {split}, {self.num_clients} clients (groups by {self.groups}){extra}"


@dataclass(frozen=True)
class RunSpec:
    """One run of the study: a point of the sweep and a seed.

    Parameters
    ----------
    label : str
        The run's name in the report.
    data : DataSpec
        The data set.
    budget_level : float
        The level the budget draws are multiplied by.
    heterogeneity : BudgetDistribution
        How budgets differ between clients.
    after_exhaustion : str
        What an exhausted client sends (``noise-only`` or ``leave``).
    noise : str
        ``local`` or ``distributed``.
    seed : int
        The run's seed.

    Examples
    --------
    >>> run = RunSpec("r", DataSpec("d", "digits", "iid", 10), 4.0, BudgetDistribution("fixed", "fixed", {}),
    ...               "noise-only", "local", 0)
    >>> run.settings()["budget_level"]
    4.0
    """

    label: str
    data: DataSpec
    budget_level: float
    heterogeneity: BudgetDistribution
    after_exhaustion: str
    noise: str  # local | distributed
    seed: int

    def settings(self) -> dict:
        """The point of the sweep, by name (what ``results.json`` keeps of the run).

        Returns
        -------
        dict
            ``data``, ``budget_level``, ``heterogeneity``, ``after_exhaustion``, ``noise`` and ``seed``.

        Examples
        --------
        >>> run = RunSpec("r", DataSpec("d", "digits", "iid", 10), 4.0, BudgetDistribution("fixed", "fixed", {}),
        ...               "noise-only", "local", 0)
        >>> run.settings()  # doctest: +NORMALIZE_WHITESPACE
        {'data': 'd', 'budget_level': 4.0, 'heterogeneity': 'fixed',
         'after_exhaustion': 'noise-only', 'noise': 'local', 'seed': 0}
        """
        return {
            "data": self.data.name,
            "budget_level": self.budget_level,
            "heterogeneity": self.heterogeneity.name,
            "after_exhaustion": self.after_exhaustion,
            "noise": self.noise,
            "seed": self.seed,
        }


@dataclass(frozen=True)
class StudyConfig:
    """A checked study (``config.parse_study`` builds it): the sweep and what each of its points uses.

    Parameters
    ----------
    name : str
        The study's name.
    rounds : int
        Rounds per run.
    seeds : tuple of int
        Every point of the sweep runs once per seed.
    filter : str
        The clients' privacy filter.
    delta : float
        Every client's delta.
    eval_every : int
        Evaluate the global model every this many rounds.
    description : str
        Free text for the report.
    budget_grid : int
        0: budgets as drawn; k: draws rounded down to ``2^(j/k)``.
    federation : dict
        Settings every run shares.
    sweep : dict of str to list
        ``budget_level``, ``heterogeneity``, ``after_exhaustion``, ``noise``, ``data``.
    heterogeneity : dict of str to BudgetDistribution
        The swept distributions by name.
    data : dict of str to DataSpec
        The swept data sets by name.
    source_text : str, optional
        The TOML text it was parsed from.

    Examples
    --------
    >>> from importlib import resources
    >>> from fedfilter.simulations.study.config import load_study
    >>> study = load_study(resources.files("fedfilter.simulations") / "configs" / "smoke.toml")
    >>> study.runs()[0].label
    'digits-iid, eps 4 fixed, noise-only, local'
    """

    name: str
    rounds: int
    seeds: tuple[int, ...]
    filter: str
    delta: float
    eval_every: int
    description: str
    budget_grid: int  # 0: budgets as drawn; k: draws rounded down to 2^(j/k)
    federation: dict[str, Any]
    sweep: dict[str, list]
    heterogeneity: dict[str, BudgetDistribution]
    data: dict[str, DataSpec]
    source_text: str = field(default="", repr=False)

    def runs(self) -> list[RunSpec]:
        """Every combination of the sweep's lists, times every seed, as one run each.

        Returns
        -------
        list of RunSpec
            In the order data, level, heterogeneity, after-exhaustion, noise, seed.

        Examples
        --------
        >>> from importlib import resources
        >>> from fedfilter.simulations.study.config import load_study
        >>> study = load_study(resources.files("fedfilter.simulations") / "configs" / "smoke.toml")
        >>> len(study.runs()), study.runs()[1].noise
        (16, 'distributed')
        """
        out = []
        for d, level, h, after, noise, seed in itertools.product(
            self.sweep["data"],
            self.sweep["budget_level"],
            self.sweep["heterogeneity"],
            self.sweep["after_exhaustion"],
            self.sweep["noise"],
            self.seeds,
        ):
            label = f"{d}, eps {_g(level)} {h}, {after}, {noise}"
            if len(self.seeds) > 1:
                label += f", seed {seed}"
            out.append(RunSpec(label, self.data[d], float(level), self.heterogeneity[h], after, noise, seed))
        return out

    def budgets(self, run: RunSpec, n_clients: int) -> np.ndarray:
        """Per-client epsilons of ``run``: ``level * draw``, the draw seeded by (seed, data, distribution).

        With ``budget_grid = k > 0`` each draw is first rounded *down* to the grid ``2^(j/k)``
        (never above the draw; a fixed budget, draw 1, stays exactly the level): clients on the
        same grid point share one filter in the engine, which makes a round's bookkeeping one
        call per distinct budget instead of one per client.

        Parameters
        ----------
        run : RunSpec
            The run.
        n_clients : int
            The number of clients.

        Returns
        -------
        numpy.ndarray
            One epsilon per client.

        Examples
        --------
        >>> from importlib import resources
        >>> from fedfilter.simulations.study.config import load_study
        >>> study = load_study(resources.files("fedfilter.simulations") / "configs" / "smoke.toml")
        >>> study.budgets(study.runs()[0], 3)
        array([4., 4., 4.])
        """
        key = zlib.crc32(f"{run.data.name}\x00{run.heterogeneity.name}".encode())
        rng = np.random.default_rng([run.seed, key])
        draw = run.heterogeneity.draw(n_clients, rng)
        if self.budget_grid:
            k = self.budget_grid
            draw = np.minimum(draw, np.exp2(np.floor(np.log2(draw) * k) / k))
        return run.budget_level * draw


def _g(x) -> str:
    return "?" if x is None else f"{x:g}" if isinstance(x, (int, float)) else str(x)
