"""The SecAgg+ graph rule, written once: the coordinator picks a graph that passes it, the device refuses
one that does not.

A device in distributed placement adds ``1 / m`` of the accounted noise variance (``m = min_reports``),
so its main account is right only if every sum the coordinator can unmask that contains its report
holds at least ``m`` reports of devices the coordinator does not control. The population the
coordinator claims (``sample_num``) cannot be checked by a device, so the bound rests only on what
each device enforces itself:

* ``threshold`` (t): the device splits its own secrets with it (Shamir, ``protocol/secagg/shamir.py``),
  so fewer than ``t`` shares reveal nothing of them;
* ``share_num`` (k): it sends shares to at most ``k`` neighbours, itself included;
* the consistency round (``client/secagg/consistency.py``): it reveals a mask-seed share of a node
  only after that node's own tag on the survivor set and the round's parameters (request and SecAgg+
  settings) was shown to it, never a key share of a survivor it authenticated, and one kind of share
  per node;
* ``colluders`` (c): the owner's assumption, the most devices in any neighbourhood that are the
  coordinator's own or share their secrets with it (0 by default: every device is genuine).

With ``t - c >= m`` and ``2 t > k + c`` (``graph_problems``), every unmasked sum that contains a
device's report holds at least ``t - c`` reports of honest devices that received the same request,
whatever population, graph, drop-out lists or survivor sets the coordinator claims
(``fewest_honest_reports``; the argument is in docs/secure-aggregation.md). The bound is
deterministic: no probability of a bad graph is added to any delta.
"""

from __future__ import annotations

from typing import cast

from fedfilter.checks import is_int

__all__ = ["fewest_honest_reports", "graph_problems", "smallest_threshold"]


def fewest_honest_reports(threshold: int, colluders: int) -> int:
    """The fewest reports of honest devices in any unmasked sum that holds an honest device's report.

    Parameters
    ----------
    threshold : int
        ``t``, the Shamir threshold each device splits its secrets with.
    colluders : int
        ``c``, the most devices of a neighbourhood the coordinator controls.

    Examples
    --------
    >>> fewest_honest_reports(12, 2)
    10
    """
    return int(threshold) - int(colluders)


def smallest_threshold(share_num: int, *, min_reports: int, colluders: int = 0) -> int:
    """The smallest ``t`` that passes ``graph_problems`` for ``share_num`` (it may exceed ``share_num``,
    in which case no ``t`` does).

    Parameters
    ----------
    share_num : int
        ``k``, the most holders of each device's shares.
    min_reports : int
        ``m`` of the round's request.
    colluders : int, optional
        ``c``, the owner's assumption.

    Examples
    --------
    >>> smallest_threshold(21, min_reports=10)  # 2 t > 21
    11
    >>> smallest_threshold(21, min_reports=30)  # more than k: no threshold works with 21 holders
    30
    """
    return max(2, int(min_reports) + int(colluders), (int(share_num) + int(colluders)) // 2 + 1)


def graph_problems(
    *, sample_num: object, share_num: object, threshold: object, min_reports: int, colluders: int = 0
) -> list[str]:
    """Every problem with a SecAgg+ graph for a release that needs ``min_reports`` honest reports when up
    to ``colluders`` of a neighbourhood are the coordinator's; empty when the bound above holds.

    Parameters
    ----------
    sample_num, share_num, threshold : int
        The SecAgg+ setup as the coordinator sent it (``n``, ``k``, ``t``; any type: checked here).
    min_reports : int
        ``m`` of the round's request: each report carries ``1 / m`` of the accounted noise variance.
    colluders : int, optional
        ``c``, the most devices of any neighbourhood the coordinator controls (the owner's assumption).

    Returns
    -------
    list of str
        One sentence per problem, naming the values; empty when the graph is accepted.

    Examples
    --------
    >>> graph_problems(sample_num=200, share_num=19, threshold=11, min_reports=100)
    ... # doctest: +NORMALIZE_WHITESPACE
    ['threshold 11 with 0 colluders leaves 11 honest reports in the smallest sum the coordinator can
      unmask, below min-reports 100.']
    >>> graph_problems(sample_num=200, share_num=119, threshold=100, min_reports=100)
    []
    """
    values = {"sample_num": sample_num, "share_num": share_num, "threshold": threshold}
    if not all(is_int(v) for v in values.values()):
        return [f"sample_num, share_num and threshold must be integers. Found {list(values.values())}."]
    n, k, t = (int(cast(int, v)) for v in values.values())  # is_int checked them
    m, c = int(min_reports), int(colluders)
    if n < 2 or k < 2:
        return [f"sample_num and share_num must be >= 2. Found {n}, {k}."]
    problems = []
    if t < 2:
        problems.append(f"threshold must be >= 2 (Flower reads 1 as 'every share'). Found {t}.")
    if k > n:
        problems.append(f"share_num {k} exceeds sample_num {n}.")
    if t > k:
        problems.append(f"threshold {t} exceeds share_num {k}: no secret could be rebuilt.")
    if fewest_honest_reports(t, c) < m:
        problems.append(
            f"threshold {t} with {c} colluders leaves {fewest_honest_reports(t, c)} honest reports in the "
            f"smallest sum the coordinator can unmask, below min-reports {m}."
        )
    if 2 * t <= k + c:
        # Two disjoint groups of honest holders, each reaching t with the colluders' shares, could give a
        # coordinator both kinds of share of one node (client/secagg/consistency.py).
        problems.append(
            f"threshold {t} must exceed half of share_num {k} plus {c} colluders: below that a coordinator "
            "that tells two groups of neighbours different survivor sets could unmask one report."
        )
    return problems
