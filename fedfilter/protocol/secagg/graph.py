"""The SecAgg+ neighbourhood a coordinator picks, and the probability that its round aborts (pure math).

The graph Flower builds (``SecAggPlusWorkflow.setup_stage``, flwr 1.42): the ``n`` sampled nodes are
shuffled onto a ring and node ``i`` shares its secrets with the ``k`` nodes at ring offsets
``-h..h`` (``h = k // 2``, itself included) and masks pairwise with the ``k - 1`` others: the Harary
graph ``H(n, k - 1)`` over a random permutation, the construction of Bell, Bonawitz, Gascón, Lepoint,
Raykova, "Secure Single-Server Aggregation with (Poly)Logarithmic Overhead" (CCS 2020, ePrint
2020/704), Section 3.

Privacy does not rest on the graph. Every graph a device accepts passes ``graph_problems``
(``fedfilter.protocol.secagg.rule``: ``t - c >= m`` and ``2 t > k + c``), and then every sum the
coordinator can unmask holds at least ``m`` honest reports, whatever the coordinator claims; there
is no failure probability to add to delta. What the graph decides is cost (each node does work in
``k``) and how often a round aborts: a round is unmasked only if every node keeps ``t`` answering
holders, so drop-outs can stop it (the spend is made, nothing is released: utility, not privacy).

``choose_graph`` therefore fixes ``t = max(2, m + c)`` and takes the smallest ``k`` the rule allows
whose abort probability is at most ``ABORT_TARGET`` under an assumed drop-out rate (at most
``ceil(dropout_rate * n)`` nodes drop, placed uniformly on the ring: the dropped holders of a node
are hypergeometric, and a union bound over the ``n`` nodes gives ``graph_abort_probability``).
Computed in exact rationals and rounded up to a float at the end.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from functools import lru_cache

from fedfilter.protocol.secagg.rule import graph_problems

#: Per-round bound on the probability that a round aborts (too few shares to unmask) that
#: ``choose_graph`` aims for: an aborted round releases nothing, so it costs utility (the spend is
#: made), never privacy.
ABORT_TARGET = 2.0**-20


@dataclass(frozen=True)
class SecAggGraph:
    """A SecAgg+ neighbourhood size ``num_shares`` (k: odd, or ``n`` for the full graph) and threshold
    (t), with ``abort_probability``, a per-round bound (rounded up) on the probability that the round
    cannot be unmasked under the drop-out rate it was chosen for.

    Parameters
    ----------
    num_shares : int
        ``k``, the holders of each node's shares, itself included.
    threshold : int
        ``t``, the shares that rebuild a secret.
    abort_probability : float
        The per-round bound on an abort.

    Examples
    --------
    >>> SecAggGraph(5, 3, 0.25).num_shares
    5
    """

    num_shares: int
    threshold: int
    abort_probability: float


def _rate_count(name: str, rate: float, n: int) -> int:
    """``ceil(rate * n)`` for the rate as written (``0.1`` means 1/10, not its binary neighbour)."""
    if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not math.isfinite(rate):
        raise ValueError(f"{name} must be a finite number in [0, 1). Found {rate!r}.")
    if not 0.0 <= rate < 1.0:
        raise ValueError(f"{name} must be in [0, 1). Found {rate!r}.")
    return min(n, math.ceil(Fraction(repr(float(rate))) * n))


def _check_graph(n: int, num_shares: int, threshold: int) -> None:
    problems = []
    if isinstance(n, bool) or not isinstance(n, int) or n < 2:
        problems.append(f"n must be an integer >= 2. Found {n!r}.")
    elif isinstance(num_shares, bool) or not isinstance(num_shares, int) or not 2 <= num_shares <= n:
        problems.append(f"num_shares must be an integer in [2, n={n}]. Found {num_shares!r}.")
    elif num_shares < n and num_shares % 2 == 0:
        problems.append(f"num_shares must be odd unless it equals n={n}. Found {num_shares}.")
    elif isinstance(threshold, bool) or not isinstance(threshold, int):
        problems.append(f"threshold must be an integer. Found {threshold!r}.")
    elif not 1 <= threshold <= num_shares:
        problems.append(f"threshold must be in [1, num_shares={num_shares}]. Found {threshold}.")
    if problems:
        raise ValueError(" ".join(problems))


def _hypergeom_tail(population: int, marked: int, draws: int, at_least: int) -> Fraction:
    """Exact ``P(X >= at_least)`` for ``X`` the marked items among ``draws`` drawn without replacement."""
    if at_least <= 0:
        return Fraction(1)
    top = min(marked, draws)
    if at_least > top:
        return Fraction(0)
    total = math.comb(population, draws)
    hits = sum(math.comb(marked, x) * math.comb(population - marked, draws - x) for x in range(at_least, top + 1))
    return Fraction(hits, total)


def _round_up(x: Fraction) -> float:
    """The smallest float >= x (x in [0, 1])."""
    f = float(x)
    if Fraction(f) < x:
        f = math.nextafter(f, math.inf)
    return f


def _abort_exact(n: int, k: int, t: int, dropped: int) -> Fraction:
    """The expected number of nodes left with fewer than ``t`` answering holders when ``dropped`` of the
    ``n`` nodes drop, placed uniformly (Flower's ``_check_threshold``: a node counts itself if it
    answers), capped at 1: an upper bound on the probability that the round aborts (union bound; the
    expectation grows with ``dropped``, so ``dropped`` may be an upper bound on the drop-outs).

    An answering node aborts when ``k - t + 1`` or more of its ``k - 1`` other holders dropped (each of
    the ``n - dropped`` answering nodes sees ``dropped`` dropped ones among the ``n - 1`` others); a
    dropped node when ``k - t`` or more did (``dropped - 1`` among the others).
    """
    if k >= n:
        k = n
    # Every node dropped (a rate above (n - 1) / n): no answering node, and the dropped ones abort it.
    answering = (n - dropped) * _hypergeom_tail(n - 1, dropped, k - 1, k - t + 1) if dropped < n else Fraction(0)
    gone = dropped * _hypergeom_tail(n - 1, max(dropped - 1, 0), k - 1, k - t) if dropped else Fraction(0)
    return min(Fraction(1), answering + gone)


def graph_abort_probability(n: int, num_shares: int, threshold: int, *, dropout_rate: float) -> float:
    """Per-round upper bound on P(some node keeps fewer than ``threshold`` answering holders) when at most
    ``ceil(dropout_rate * n)`` of the ``n`` nodes drop out, rounded up (``_abort_exact``).

    Parameters
    ----------
    n : int
        The sampled nodes.
    num_shares : int
        ``k``: odd, or ``n`` for the full graph.
    threshold : int
        ``t``, in ``[1, k]``.
    dropout_rate : float
        The assumed share of nodes that drop, in ``[0, 1)``.

    Examples
    --------
    >>> graph_abort_probability(10, 10, 6, dropout_rate=0.0)
    0.0
    >>> graph_abort_probability(10, 10, 6, dropout_rate=0.5)  # 5 of 10 drop: fewer than 6 answer
    1.0
    """
    _check_graph(n, num_shares, threshold)
    return _round_up(_abort_exact(n, num_shares, threshold, _rate_count("dropout_rate", dropout_rate, n)))


def _candidates(n: int, t: int, colluders: int) -> list[int]:
    """The neighbourhood sizes the rule allows with threshold ``t``: odd ``k`` (or ``n``) in
    ``[t, min(n, 2 t - 1 - c)]``."""
    top = min(n, 2 * t - 1 - colluders)
    return [k for k in range(t, top + 1) if k % 2 == 1 or k == n]


@lru_cache(maxsize=256)
def choose_graph(n: int, *, min_reports: int, colluders: int = 0, dropout_rate: float) -> SecAggGraph:
    """The graph for ``n`` sampled nodes: ``t = max(2, m + c)`` and the smallest ``k`` that
    ``graph_problems`` allows with an abort probability within ``ABORT_TARGET``; when none meets the
    target, the allowed ``k`` (raising ``t`` if no ``k`` is allowed at it) with the smallest abort
    probability. Raises ``ValueError`` when ``m + c`` exceeds ``n``: no round could be unmasked.

    Parameters
    ----------
    n : int
        The sampled nodes (>= 2).
    min_reports : int
        ``m`` of the round's request (>= 1).
    colluders : int, optional
        ``c``, the owners' assumption (>= 0).
    dropout_rate : float
        The assumed share of nodes that drop, in ``[0, 1)``.

    Examples
    --------
    >>> graph = choose_graph(200, min_reports=20, dropout_rate=0.05)
    >>> graph.threshold, graph.num_shares % 2, graph.abort_probability <= ABORT_TARGET
    (20, 1, True)
    """
    if isinstance(n, bool) or not isinstance(n, int) or n < 2:
        raise ValueError(f"n must be an integer >= 2. Found {n!r}.")
    for name, v in (("min_reports", min_reports), ("colluders", colluders)):
        if isinstance(v, bool) or not isinstance(v, int) or v < (1 if name == "min_reports" else 0):
            raise ValueError(f"{name} must be an integer >= {1 if name == 'min_reports' else 0}. Found {v!r}.")
    t = max(2, min_reports + colluders)
    if t > n:
        raise ValueError(
            f"min_reports {min_reports} plus {colluders} colluders exceeds the {n} sampled nodes: "
            "no SecAgg+ round among them can be unmasked."
        )
    while not _candidates(n, t, colluders):  # e.g. k = t even below n: the next threshold allows t + 1
        t += 1
        if t > n:
            raise ValueError(f"no SecAgg+ graph for n={n} passes the rule with {colluders} colluders.")
    candidates = _candidates(n, t, colluders)
    target = Fraction(ABORT_TARGET)
    dropped = _rate_count("dropout_rate", dropout_rate, n)

    def abort(k: int) -> Fraction:
        return _abort_exact(n, k, t, dropped)

    # The abort bound falls as k grows at a fixed t: bisect for the first candidate within target.
    lo, hi = 0, len(candidates) - 1
    if abort(candidates[hi]) > target:
        lo = hi  # none meets it: the largest k, the fewest aborts
    while lo < hi:
        mid = (lo + hi) // 2
        if abort(candidates[mid]) <= target:
            hi = mid
        else:
            lo = mid + 1
    k = candidates[lo]
    if problems := graph_problems(sample_num=n, share_num=k, threshold=t, min_reports=min_reports, colluders=colluders):
        raise RuntimeError(f"choose_graph picked a graph the devices refuse: {problems}")  # a bug here, not input
    return SecAggGraph(k, t, _round_up(abort(k)))
