"""The TOML file of a dropout study: what it sweeps, checked all at once, expanded into runs.

A study file has five kinds of tables (see ``simulations/configs/smoke.toml`` for a commented one)::

    [study]            name, rounds, seeds, filter, delta, eval_every, budget_grid, description
    [federation]       settings every run shares (noise multiplier, clip, fraction asked per round,
                       participation, adaptive clipping's target_clipped_quantile, ...)
    [sweep]            lists: budget_level, heterogeneity, after_exhaustion, noise, data
    [heterogeneity.X]  a budget distribution named X (fixed, uniform, lognormal, two-level)
    [data.X]           a data set named X (task, partition iid / dirichlet / natural, clients)

Every combination of the ``[sweep]`` lists (times every seed) is one run. A client's budget is
``epsilon_i = budget_level * draw_i``, where ``draw_i`` comes from the named distribution written for
level 1 (so ``budget_level`` is the median budget for fixed, lognormal and symmetric uniform shapes).
The draws of a data set and distribution are the same at every level and mode, so runs differ only
in what the sweep changed.

``load_study`` reports every problem of a file in one ``StudyConfigError``, each naming the key and
the value found. The per-table checks are in ``config_checks``; the checked pieces (``StudyConfig``,
``RunSpec``, ``DataSpec``, ``BudgetDistribution``) in ``specs``.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

from fedfilter.simulations.study.config_checks import (
    Checker,
    check_data,
    check_distribution,
    check_federation,
    check_min_reports,
    check_placement_filter,
    check_study,
    check_sweep,
)
from fedfilter.simulations.study.specs import StudyConfig


class StudyConfigError(ValueError):
    """A study file with problems; ``problems`` lists each one (key, value, what was expected).

    Parameters
    ----------
    source : str
        The file (or ``<config>``) the problems are in.
    problems : list of str
        One line per problem.

    Examples
    --------
    >>> err = StudyConfigError("study.toml", ["[study] rounds must be >= 1. Found 0."])
    >>> print(err)
    study.toml: 1 problem(s) in the study config:
      - [study] rounds must be >= 1. Found 0.
    >>> isinstance(err, ValueError), err.problems
    (True, ['[study] rounds must be >= 1. Found 0.'])
    """

    def __init__(self, source: str, problems: list[str]):
        self.problems = list(problems)
        super().__init__(f"{source}: {len(problems)} problem(s) in the study config:\n  - " + "\n  - ".join(problems))


def parse_study(text: str, source: str = "<config>") -> StudyConfig:
    r"""Parse and check a study's TOML text; raises ``StudyConfigError`` listing every problem.

    Parameters
    ----------
    text : str
        The study file's text (see the module docstring).
    source : str, optional
        How the error names the text.

    Returns
    -------
    StudyConfig
        The checked study.

    Raises
    ------
    StudyConfigError
        Every problem of the text at once.

    Examples
    --------
    >>> from importlib import resources
    >>> text = (resources.files("fedfilter.simulations") / "configs" / "smoke.toml").read_text()
    >>> study = parse_study(text)
    >>> study.name, study.rounds, len(study.runs())
    ('smoke', 20, 16)
    >>> parse_study("[study]\nrounds = 0\n")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
        ...
    fedfilter.simulations.study.config.StudyConfigError: <config>: ... problem(s) in the study config:
    ...
    """
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as err:
        raise StudyConfigError(source, [f"not valid TOML: {err}"]) from None
    c = Checker()
    c.unknown("(top level)", doc, {"study", "federation", "sweep", "heterogeneity", "data"})
    study = check_study(c, c.table(doc, "study"))
    federation = check_federation(c, c.table(doc, "federation", required=False))
    hets = {k: h for k, v in c.table(doc, "heterogeneity").items() if (h := check_distribution(c, k, v))}
    datas = {k: ds for k, v in c.table(doc, "data").items() if (ds := check_data(c, k, v))}
    raw_hets = doc.get("heterogeneity", {}) if isinstance(doc.get("heterogeneity"), dict) else {}
    raw_datas = doc.get("data", {}) if isinstance(doc.get("data"), dict) else {}
    sweep = check_sweep(c, c.table(doc, "sweep"), raw_hets, raw_datas)

    # Cross-checks between tables (see check_min_reports).
    check_min_reports(c, federation, sweep, datas)
    check_placement_filter(c, study, sweep)
    if c.problems:
        raise StudyConfigError(source, c.problems)
    return StudyConfig(
        name=study["name"],
        rounds=study["rounds"],
        seeds=tuple(study["seeds"]),
        filter=study["filter"],
        delta=float(study["delta"]),
        eval_every=study["eval_every"],
        description=study["description"],
        budget_grid=study["budget_grid"],
        federation=federation,
        sweep=sweep,
        heterogeneity={k: hets[k] for k in sweep["heterogeneity"]},
        data={k: datas[k] for k in sweep["data"]},
        source_text=text,
    )


def load_study(path: str | Path) -> StudyConfig:
    """Read and check a study file (see the module docstring).

    Parameters
    ----------
    path : str or Path
        The study TOML file.

    Returns
    -------
    StudyConfig
        The checked study.

    Raises
    ------
    StudyConfigError
        The file is missing, or every problem it has.

    Examples
    --------
    >>> from importlib import resources
    >>> study = load_study(resources.files("fedfilter.simulations") / "configs" / "smoke.toml")
    >>> study.filter, study.seeds
    ('rdp', (0,))
    """
    path = Path(path)
    if not path.is_file():
        raise StudyConfigError(str(path), [f"--config {str(path)!r} is not a file."])
    return parse_study(path.read_text(encoding="utf-8"), str(path))
