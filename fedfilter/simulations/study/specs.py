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
    """Per-client budgets ``level * draw``; ``params`` are those of the shape at level 1."""

    name: str
    distribution: str
    params: dict[str, float]

    def draw(self, n: int, rng: np.random.Generator) -> np.ndarray:
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
        """The distribution in words, e.g. ``4 x lognormal(median 1, sigma 0.75)``."""
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
    """One run of the study: a point of the sweep and a seed."""

    label: str
    data: DataSpec
    budget_level: float
    heterogeneity: BudgetDistribution
    after_exhaustion: str
    noise: str  # local | distributed
    seed: int

    def settings(self) -> dict:
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
