"""Sparse SecAgg+ neighbourhoods and the probability that their guarantee fails (issue 23, pure math).

The graph Flower builds (``SecAggPlusWorkflow.setup_stage``, flwr 1.42): the ``n`` sampled nodes are
shuffled onto a ring and node ``i`` shares its secrets with the ``k`` nodes at ring offsets
``-h..h`` (``h = k // 2``, itself included) and masks pairwise with the ``k - 1`` others. This is the
Harary graph ``H(n, k - 1)`` over a uniformly random permutation, the construction of Bell,
Bonawitz, Gascón, Lepoint, Raykova, "Secure Single-Server Aggregation with (Poly)Logarithmic
Overhead" (CCS 2020, ePrint 2020/704), Section 3. Their analysis names three conditions on the graph
(Section 3, the semi-honest protocol; Section 4 for a malicious server):

1. *no split*: the subgraph on the honest nodes whose masked input arrived stays connected, else
   the server unmasks the sum of each component on its own (pairwise masks cancel inside every
   component; masks with corrupt or dropped nodes are known to the server);
2. *no reveal*: every honest node has fewer than ``t`` corrupt share holders, else the server and
   its allies rebuild both its self-mask seed and its mask key and read its input; against a server
   that shows honest holders different drop-out lists, honest devices answer for each node with one
   kind of share only and Section 4 needs ``2t > k + (corrupt holders)``;
3. *correctness*: every node keeps at least ``t`` responding holders, else the round aborts.

The bounds below are derived here for exactly this ring (this module's own derivation, using
the conditions above; no copy of the paper is on this machine, so its printed table of ``k`` and
``t`` is not reproduced). Model, stated as the device assumes it:

- at most ``ceil(corrupt_rate * n)`` sampled devices are corrupt (collude with the coordinator) and
  at most ``ceil(dropout_rate * n)`` drop out before their masked input arrives;
- the coordinator follows the protocol (the *honest-coordinator* guarantee): it draws the ring
  permutation uniformly and independently of who is corrupt or drops out. Drop-outs that someone
  who knows the ring chooses (a coordinator that declares live neighbours "dropped") are outside
  this bound: against them the device's worst-case account holds (DESIGN section 5, invariant 8).

Under that model the removed set ``R`` (corrupt or dropped) is a uniformly random subset of the
ring given its size ``r <= r_max``, and:

- *split* ⟺ at least two maximal circular runs of removed positions of length ``>= h`` (an edge
  spans at most ``h`` ring steps, so it cannot cross a run of ``h`` removed nodes; with at most one
  such run the survivors form one path). With ``N`` the number of such runs, ``P(N >= 2) <=
  E[N (N - 1)] / 2`` (Markov on the binomial moment) and, counting ordered pairs of run starts
  (a kept node followed by ``h`` removed ones; two starts are compatible iff they are more than
  ``h`` apart, ``n - 2h - 1`` choices), sampling without replacement gives exactly::

      E[N (N - 1)] = n (n - 2h - 1) [r]_{2h} [n - r]_2 / [n]_{2h + 2}      ([x]_j falling factorial)

  maximised over ``r <= r_max`` (the event is not monotone in ``r``).
- *reveal*: the corrupt holders of one honest node are hypergeometric (``k - 1`` draws from
  ``n - 1`` with ``c`` corrupt); a union bound over the ``n`` nodes.
- *abort*: the dropped holders of one node are hypergeometric likewise; it aborts if fewer than
  ``t`` of its ``k - 1`` other holders answer (its own share not counted: conservative).

Everything is computed in exact rationals and rounded up to a float at the end.

Folding into delta: the failure events are functions of what the coordinator sees (the ring, who
is corrupt, who dropped), and their probability is at most ``beta_j`` in round ``j`` whatever the
data. On their complement the real view is a simulation of the released sums alone, so for any
output set ``S``: ``P_x(S) <= P_x(S and no failure) + sum beta_j <= e^eps P_x'(S) + delta + sum
beta_j`` (the ideal sums are (eps, delta)-DP by the filter; intersecting ``S`` with "no failure"
keeps the real and ideal views equal on the x' side). Hence ``honest_coordinator_delta``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from fractions import Fraction

#: Per-round bound on the probability that the honest-coordinator guarantee fails, which
#: ``choose_graph`` meets. It is added to delta per round a device joins: 1,000 rounds add < 1e-9.
PRIVACY_FAILURE_TARGET = 2.0**-40
#: Per-round bound on the probability that a round aborts (too few shares to unmask): an aborted
#: round releases nothing, so it costs utility (the spend is made), never privacy.
ABORT_TARGET = 2.0**-20


@dataclass(frozen=True)
class SecAggGraph:
    """A SecAgg+ neighbourhood size and threshold with its accounted failure probabilities.

    ``num_shares`` (k) is odd, or equal to ``n`` for the full graph; ``threshold`` (t) satisfies
    ``k // 2 < t < k`` when ``choose_graph`` picked it. ``failure_probability``
    bounds, per round, the probability that the coordinator learns more than the sum of all honest
    surviving reports (split or reveal), rounded up; ``abort_probability`` bounds the probability
    that the round cannot be unmasked.
    """

    num_shares: int
    threshold: int
    failure_probability: float
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
    elif isinstance(num_shares, bool) or not isinstance(num_shares, int) or not 3 <= num_shares <= n:
        problems.append(f"num_shares must be an integer in [3, n={n}]. Found {num_shares!r}.")
    elif num_shares < n and num_shares % 2 == 0:
        problems.append(f"num_shares must be odd unless it equals n={n}. Found {num_shares}.")
    elif isinstance(threshold, bool) or not isinstance(threshold, int):
        problems.append(f"threshold must be an integer. Found {threshold!r}.")
    elif not 1 <= threshold <= num_shares:
        problems.append(f"threshold must be in [1, num_shares={num_shares}]. Found {threshold}.")
    if problems:
        raise ValueError(" ".join(problems))


def _falling(x: int, j: int) -> int:
    """The falling factorial ``x (x - 1) ... (x - j + 1)`` (0 when ``x < j``)."""
    if x < j:
        return 0
    return math.perm(x, j)


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


def split_probability_bound(n: int, half: int, removed: int) -> Fraction:
    """Upper bound on P(the honest survivors of the ring with reach ``half`` split), exact rational.

    ``removed`` is the largest number of corrupt-or-dropped nodes; the bound is the maximum over
    every count up to it of ``E[N (N - 1)] / 2`` (see the module docstring), capped at 1.
    """
    if n < 2 * half + 2 or removed < 2 * half:
        return Fraction(0)  # two runs of `half` removed plus two kept nodes do not fit
    pairs = n * (n - 2 * half - 1)
    denominator = 2 * _falling(n, 2 * half + 2)
    # f(r) = [r]_{2h} [n - r]_2 is log-concave in r, so f(r + 1) >= f(r) holds on a prefix of r:
    # walk that prefix with the exact integer test of the ratio, then evaluate f once.
    r = 2 * half
    last = min(removed, n - 2)
    while r < last and (r + 1) * (n - r - 2) >= (r + 1 - 2 * half) * (n - r):
        r += 1
    best = _falling(r, 2 * half) * _falling(n - r, 2)
    return min(Fraction(1), Fraction(pairs * best, denominator))


def _round_up(x: Fraction) -> float:
    """The smallest float >= x (x in [0, 1])."""
    f = float(x)
    if Fraction(f) < x:
        f = math.nextafter(f, math.inf)
    return f


def _failure_exact(n: int, k: int, t: int, corrupt: int, removed: int) -> Fraction:
    split = Fraction(0) if k >= n else split_probability_bound(n, k // 2, removed)
    reveal = n * _hypergeom_tail(n - 1, corrupt, k - 1, t)
    return min(Fraction(1), split + reveal)


def graph_failure_probability(
    n: int, num_shares: int, threshold: int, *, dropout_rate: float, corrupt_rate: float
) -> float:
    """Per-round upper bound on P(the honest-coordinator guarantee fails), rounded up.

    The failure events are a split of the honest survivors' graph and an honest node with
    ``threshold`` or more corrupt share holders, on Flower's ring of ``n`` nodes with
    ``num_shares`` holders each (see the module docstring for the model and the derivation).
    """
    _check_graph(n, num_shares, threshold)
    corrupt = _rate_count("corrupt_rate", corrupt_rate, n)
    dropped = _rate_count("dropout_rate", dropout_rate, n)
    return _round_up(_failure_exact(n, num_shares, threshold, corrupt, corrupt + dropped))


def graph_abort_probability(n: int, num_shares: int, threshold: int, *, dropout_rate: float) -> float:
    """Per-round upper bound on P(some node has fewer than ``threshold`` answering holders), rounded up."""
    _check_graph(n, num_shares, threshold)
    dropped = _rate_count("dropout_rate", dropout_rate, n)
    k = num_shares
    return _round_up(min(Fraction(1), n * _hypergeom_tail(n - 1, dropped, k - 1, k - threshold)))


def _tails(population: int, marked: int, draws: int) -> list[Fraction]:
    """``tails[x] = P(X >= x)`` for ``x = 0 .. draws + 1`` (hypergeometric, exact)."""
    total = math.comb(population, draws)
    weights = [math.comb(marked, x) * math.comb(population - marked, draws - x) for x in range(draws + 1)]
    tails = [Fraction(0)] * (draws + 2)
    running = 0
    for x in range(draws, -1, -1):
        running += weights[x]
        tails[x] = Fraction(running, total)
    return tails


def dropouts_accounted(n: int, num_shares: int, dropped: int, *, dropout_rate: float) -> bool:
    """Whether the failure bound covers a round in which ``dropped`` of the ``n`` nodes set up sent
    no masked input. The bound assumes at most ``ceil(dropout_rate * n)`` such nodes on a sparse
    graph (a full graph cannot split), so an honest coordinator unmasks nothing beyond that: the
    one rule the coordinator and the engine both apply."""
    _check_graph(n, num_shares, 1)
    if isinstance(dropped, bool) or not isinstance(dropped, int) or not 0 <= dropped <= n:
        raise ValueError(f"dropped must be an integer in [0, n={n}]. Found {dropped!r}.")
    return num_shares >= n or dropped <= _rate_count("dropout_rate", dropout_rate, n)


def _threshold_for(n: int, k: int, corrupt_tails: list[Fraction]) -> int | None:
    """The smallest ``t`` with ``k // 2 < t < k`` and ``P(some node has >= 2t - k corrupt holders)``
    within target (Bell et al. Section 4: a forked drop-out view then cannot yield both shares)."""
    target = Fraction(PRIVACY_FAILURE_TARGET)
    for t in range(k // 2 + 1, k):
        if n * corrupt_tails[min(2 * t - k, k)] <= target:
            return t
    return None


def choose_graph(n: int, *, dropout_rate: float, corrupt_rate: float) -> SecAggGraph:
    """The smallest neighbourhood (odd ``k``, or the full graph) that meets both targets.

    For each candidate ``k`` the threshold is the smallest that blocks a forked drop-out view
    (``_threshold_for``); the graph is accepted when its failure probability is at most
    ``PRIVACY_FAILURE_TARGET`` and its abort probability at most ``ABORT_TARGET``. Raises
    ``ValueError`` (naming the rates) when even the full graph cannot meet them.
    """
    if isinstance(n, bool) or not isinstance(n, int) or n < 3:
        raise ValueError(f"n must be an integer >= 3 (SecAgg+ needs 3 shares). Found {n!r}.")
    corrupt = _rate_count("corrupt_rate", corrupt_rate, n)
    dropped = _rate_count("dropout_rate", dropout_rate, n)
    privacy_target = Fraction(PRIVACY_FAILURE_TARGET)
    abort_target = Fraction(ABORT_TARGET)
    candidates = list(range(3, n, 2)) + [n]
    for k in candidates:
        if k < n and split_probability_bound(n, k // 2, corrupt + dropped) > privacy_target:
            continue
        corrupt_tails = _tails(n - 1, corrupt, k - 1)
        t = _threshold_for(n, k, corrupt_tails)
        if t is None:
            continue
        split = Fraction(0) if k >= n else split_probability_bound(n, k // 2, corrupt + dropped)
        failure = min(Fraction(1), split + n * corrupt_tails[t])
        abort = min(Fraction(1), n * _tails(n - 1, dropped, k - 1)[k - t])
        if failure <= privacy_target and abort <= abort_target:
            return SecAggGraph(k, t, _round_up(failure), _round_up(abort))
    raise ValueError(
        f"no SecAgg+ graph for n={n} meets a failure probability of {PRIVACY_FAILURE_TARGET:.3g} "
        f"and an abort probability of {ABORT_TARGET:.3g} with dropout_rate={dropout_rate!r} and "
        f"corrupt_rate={corrupt_rate!r}: lower the assumed rates or sample more devices."
    )


def honest_coordinator_delta(delta: float, failure_probabilities: Iterable[float]) -> float:
    """A device's delta against an honest coordinator: its filter's ``delta`` plus the per-round
    failure probabilities of the distributed rounds it joined, summed and rounded up.

    The device passes ``[cap] * rounds_joined`` (a per-round cap it enforces), the engine and the
    planner the probabilities of the graphs they run. See the module docstring for the proof.
    """
    if isinstance(delta, bool) or not math.isfinite(delta) or not 0.0 <= delta < 1.0:
        raise ValueError(f"delta must be in [0, 1). Found {delta!r}.")
    total = Fraction(delta)
    for j, beta in enumerate(failure_probabilities):
        if isinstance(beta, bool) or not math.isfinite(beta) or not 0.0 <= beta <= 1.0:
            raise ValueError(f"failure_probabilities[{j}] must be in [0, 1]. Found {beta!r}.")
        total += Fraction(beta)
    return _round_up(min(Fraction(1), total))
