"""The options and output helpers ``fedfilter rounds`` and ``fedfilter epsilon`` share.

Both plan a client's budget before a run, for either placement: ``--placement distributed --dim D``
plans Skellam noise over SecAgg+ (issue 15), where only the rdp filter is valid, so ``--filter``
defaults to rdp there and gdp/zcdp are refused with a clear message.
"""

from __future__ import annotations

import argparse

from fedfilter.privacy.planner import check_distributed_filter
from fedfilter.protocol.request import PLACEMENTS

FILTER_HELP = {
    "gdp": "exact Gaussian-DP filter (default; the most rounds any valid accountant admits)",
    "rdp": "Rényi filter at dp_accounting's best order, full delta (papers/004 Thm 4.3, Remark 4.4)",
    "zcdp": "papers/004 Theorem 4.9 (zCDP to (eps, delta))",
    "basic": "papers/003 Theorem 3.4 via Lemma 3.3 (baseline)",
    "advanced": "papers/003 Theorem 5.1 via Lemma 3.3 (baseline)",
}


def table(rows: list[tuple[str, str]]) -> str:
    """Two aligned columns, one row per line.

    Parameters
    ----------
    rows : list of (str, str)
        (label, text) pairs; the labels are padded to the widest.

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
