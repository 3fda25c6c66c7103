"""The options and output helpers ``fedfilter rounds`` and ``fedfilter epsilon`` share.

Both plan a client's budget before a run, for either placement: ``--placement distributed --dim D``
plans Skellam noise over SecAgg+, where only the rdp filter is valid, so ``--filter``
defaults to rdp there and gdp/zcdp are refused with a clear message. ``worst_case_plan`` and
``worst_case_rows`` are the worst-case account's side of a distributed plan, for ``fedfilter rounds``
and ``fedfilter plan``.
"""

from __future__ import annotations

import argparse

from fedfilter.client.ledger.worst_case import SETTING, check_worst_case_epsilon
from fedfilter.planning.rounds import check_distributed_filter, plan_distributed_epsilon, plan_distributed_rounds
from fedfilter.protocol.request import PLACEMENTS

FILTER_HELP = {
    "gdp": "exact Gaussian-DP filter (default; the most rounds any valid accountant admits)",
    "rdp": "Rényi filter at dp_accounting's best order, full delta (Feldman & Zrnic (2021) Thm 4.3, Remark 4.4)",
    "zcdp": "Feldman & Zrnic (2021) Theorem 4.9 (zCDP to (eps, delta))",
    "basic": "Rogers et al. (2016) Theorem 3.4 via Lemma 3.3 (baseline)",
    "advanced": "Rogers et al. (2016) Theorem 5.1 via Lemma 3.3 (baseline)",
}


def table(rows: list[tuple[str, str]]) -> str:
    """Two aligned columns, one row per line.

    Parameters
    ----------
    rows : list of (str, str)
        (label, text) pairs; the labels are padded to the widest.

    Returns
    -------
    str
        The rows joined by newlines (no trailing newline).

    Examples
    --------
    >>> print(table([("filter", "gdp"), ("rounds", "12")]))
    filter  gdp
    rounds  12
    """
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)


def distributed_kind(args: argparse.Namespace) -> str:
    """The filter for placement 'distributed' (rdp unless asked otherwise, then refused); needs --dim.

    Parameters
    ----------
    args : argparse.Namespace
        The parsed ``rounds`` or ``epsilon`` options (``filter``, ``dim``).

    Returns
    -------
    str
        The filter kind to plan with.

    Raises
    ------
    ValueError
        Naming every missing or refused option at once.

    Examples
    --------
    >>> distributed_kind(argparse.Namespace(filter=None, dim=10))
    'rdp'
    """
    kind = "rdp" if args.filter is None else args.filter
    problems = []
    if args.dim is None:
        problems.append("--placement distributed needs --dim (the model size, the number of coordinates).")
    try:
        check_distributed_filter(kind)
    except ValueError as err:
        problems.append(f"--filter {kind}: {err}")
    if problems:
        raise ValueError(" ".join(problems))
    return kind


def add_placement_options(p: argparse.ArgumentParser) -> None:
    """Add ``--placement``, ``--dim``, ``--clip`` and ``--min-reports`` to a planning sub-command.

    Parameters
    ----------
    p : argparse.ArgumentParser
        The sub-command's parser.

    Examples
    --------
    >>> p = argparse.ArgumentParser()
    >>> add_placement_options(p)
    >>> p.parse_args(["--placement", "distributed", "--dim", "10"]).min_reports
    1
    """
    p.add_argument(
        "--placement",
        choices=PLACEMENTS,
        default="local",
        help="local: Gaussian noise on the device; distributed: Skellam noise over SecAgg+ (needs --dim, rdp)",
    )
    p.add_argument("--dim", type=int, default=None, help="model size (coordinates); placement distributed")
    p.add_argument("--clip", type=float, default=1.0, help="clip norm C (sets the grid step); placement distributed")
    p.add_argument("--min-reports", type=int, default=1, help="fewest reports in a released sum (distributed)")


def worst_case_plan(
    *, rounds: int, main_rounds: int, worst_case_epsilon: float | None, epsilon: float, **setting
) -> dict:
    """The worst-case account's side of a distributed plan.

    That is: the worst-case-epsilon ``rounds`` full-norm rounds need, each report read alone (None
    for no rounds), the share's Skellam variance, and with ``worst_case_epsilon`` the rounds it admits
    and the device's: the fewer of those and ``main_rounds`` (what the main budget ``epsilon``
    admits; the device stops when either account is spent).

    The planner's ``alone=True`` counts with the charge and rounding of the device's worst-case
    account (``privacy.planner``); ``worst_case_epsilon`` is checked as at enrolment.

    Parameters
    ----------
    rounds : int
        The full-norm rounds wanted.
    main_rounds : int
        The rounds the main budget ``epsilon`` admits.
    worst_case_epsilon : float or None
        The device's worst-case budget, if it has one.
    epsilon : float
        The device's main budget.
    **setting
        ``plan_distributed_rounds``'s ``delta``, ``noise_multiplier``, ``clip``, ``min_reports``,
        ``dim`` and ``kind``.

    Returns
    -------
    dict
        ``worst_case_epsilon_needed``, ``worst_case_share_variance``, ``worst_case_epsilon``,
        ``worst_case_rounds`` and ``device_rounds`` (the last two None without ``worst_case_epsilon``).

    Examples
    --------
    >>> setting = dict(delta=1e-5, noise_multiplier=1.0, clip=1.0, min_reports=10, dim=1000, kind="rdp")
    >>> w = worst_case_plan(rounds=5, main_rounds=5, worst_case_epsilon=None, epsilon=4.0, **setting)
    >>> round(w["worst_case_epsilon_needed"], 2), w["device_rounds"]
    (67.42, None)
    """
    needed = plan_distributed_epsilon(rounds=rounds, alone=True, **setting)["epsilon"] if rounds >= 1 else None
    out = {
        "worst_case_epsilon_needed": needed,
        "worst_case_share_variance": plan_distributed_rounds(epsilon=epsilon, alone=True, **setting).mu,
        "worst_case_epsilon": worst_case_epsilon,
        "worst_case_rounds": None,
        "device_rounds": None,
    }
    if worst_case_epsilon is not None:
        check_worst_case_epsilon(worst_case_epsilon, epsilon)
        worst = plan_distributed_rounds(epsilon=worst_case_epsilon, alone=True, **setting).rounds
        out.update(worst_case_rounds=worst, device_rounds=min(main_rounds, worst))
    return out


def worst_case_rows(w: dict, rounds: int, min_reports: int) -> list[tuple[str, str]]:
    """The worst-case account's lines of ``fedfilter rounds`` and ``fedfilter plan``.

    Parameters
    ----------
    w : dict
        What ``worst_case_plan`` returned.
    rounds : int
        The full-norm rounds planned.
    min_reports : int
        The fewest reports in a released sum.

    Returns
    -------
    list of (str, str)
        Rows for ``table``.

    Examples
    --------
    >>> w = {"worst_case_epsilon_needed": 67.42, "worst_case_share_variance": 1.6e6, "worst_case_epsilon": None}
    >>> worst_case_rows(w, 5, 10)[0]
    ('worst case', 'worst-case-epsilon 67.42 admits these 5 rounds')
    """
    alone = (
        f"each report read alone by a coordinator that forges the other SecAgg+ peers: Skellam variance "
        f"{w['worst_case_share_variance']:.6g} per coordinate, 1/{min_reports} of the sum's"
    )
    needed = w["worst_case_epsilon_needed"]
    rows = [("worst case", f"{SETTING} {needed:.6g} admits these {rounds} rounds" if needed else "no rounds")]
    rows.append(("", f"({alone})"))
    if w["worst_case_epsilon"] is not None:
        rows += [
            ("", f"{SETTING} {w['worst_case_epsilon']:g} admits {w['worst_case_rounds']} full-norm rounds"),
            ("device", f"{w['device_rounds']} full-norm rounds   (it stops when either account is spent)"),
        ]
    return rows
