"""The sparse SecAgg+ graph's failure bound against independent computations (issue 23).

References: brute-force enumeration of every removed set on small rings (connectivity by search,
not by the run argument the module uses), Monte Carlo on Flower's own neighbour construction at
moderate n with a confidence bound, and scipy's hypergeometric distribution.
"""

from __future__ import annotations

import itertools
import math
import random
from fractions import Fraction

import pytest
from scipy.stats import hypergeom

from fedfilter.privacy.secagg_graph import (
    ABORT_TARGET,
    PRIVACY_FAILURE_TARGET,
    SecAggGraph,
    choose_graph,
    dropouts_accounted,
    graph_abort_probability,
    graph_failure_probability,
    honest_coordinator_delta,
    split_probability_bound,
)


def flower_neighbours(node_ids: list[int], num_shares: int) -> dict[int, set[int]]:
    """Flower 1.42 ``SecAggPlusWorkflow.setup_stage``: ring offsets ``-h..h`` over the given order."""
    half = num_shares >> 1
    m = len(node_ids)
    return {nid: {node_ids[(idx + off) % m] for off in range(-half, half + 1)} for idx, nid in enumerate(node_ids)}


def splits(neighbours: dict[int, set[int]], kept: set[int]) -> bool:
    """True when the graph on ``kept`` is disconnected (breadth-first search)."""
    if len(kept) <= 1:
        return False
    start = next(iter(kept))
    seen = {start}
    frontier = [start]
    while frontier:
        node = frontier.pop()
        for other in neighbours[node] & kept:
            if other not in seen:
                seen.add(other)
                frontier.append(other)
    return seen != kept


def runs_of_at_least(removed: set[int], n: int, half: int) -> int:
    """Maximal circular runs of removed positions of length >= half (counted by their starts)."""
    return sum(1 for i in range(n) if (i - 1) % n not in removed and all((i + j) % n in removed for j in range(half)))


@pytest.mark.parametrize("n", [6, 7, 9, 10, 12, 13])
def test_split_bound_against_enumeration_of_every_removed_set(n):
    for half in range(1, (n - 1) // 2 + 1):
        neighbours = flower_neighbours(list(range(n)), 2 * half + 1)
        worst = Fraction(0)
        worst_pairs = Fraction(0)
        for r in range(n + 1):
            split_count = 0
            pair_sum = 0
            total = 0
            for removed in itertools.combinations(range(n), r):
                removed_set = set(removed)
                kept = set(range(n)) - removed_set
                split = splits(neighbours, kept)
                runs = runs_of_at_least(removed_set, n, half) if kept else 0
                # the module's characterisation: a split is two or more long runs
                assert split == (runs >= 2), (n, half, removed)
                split_count += split
                pair_sum += runs * (runs - 1) // 2
                total += 1
            exact = Fraction(split_count, total)
            worst = max(worst, exact)
            worst_pairs = max(worst_pairs, Fraction(pair_sum, total))
            bound = split_probability_bound(n, half, r)
            assert bound >= worst, (n, half, r, bound, worst)
            # the shipped bound is the largest second moment over counts up to r, exactly
            assert bound == min(Fraction(1), worst_pairs), (n, half, r)
            # the closed form of E[N(N-1)]/2 is exact at a single count r
            if 2 * half <= r <= n - 2 and n >= 2 * half + 2:
                single = Fraction(n * (n - 2 * half - 1), 2) * Fraction(
                    math.perm(r, 2 * half) * math.perm(n - r, 2), math.perm(n, 2 * half + 2)
                )
                assert single == Fraction(pair_sum, total), (n, half, r)


def test_split_bound_against_monte_carlo_on_flowers_ring():
    """n = 200 sampled nodes shuffled as Flower does; a tight regime where splits are common."""
    rng = random.Random(20231125)
    n, num_shares, removed_count, trials = 200, 9, 60, 1500
    hits = 0
    for _ in range(trials):
        order = list(range(n))
        rng.shuffle(order)
        neighbours = flower_neighbours(order, num_shares)
        removed = set(rng.sample(range(n), removed_count))
        hits += splits(neighbours, set(range(n)) - removed)
    p_hat = hits / trials
    bound = float(split_probability_bound(n, num_shares // 2, removed_count))
    # the bound must not sit below the observed rate beyond 4 standard errors ...
    assert bound >= p_hat - 4 * math.sqrt(p_hat * (1 - p_hat) / trials + 1e-12)
    # ... and must be informative where it matters (a second-moment bound is tight when small)
    assert 0.02 < p_hat < 0.5 and bound < 3 * p_hat


def test_reveal_and_abort_tails_against_scipy():
    n, k, corrupt, dropped = 1000, 41, 50, 100
    for t in (9, 12, 21, 30):
        ours = graph_failure_probability(n, k, t, dropout_rate=0.0, corrupt_rate=corrupt / n) - float(
            split_probability_bound(n, k // 2, corrupt)
        )
        theirs = min(1.0, n * hypergeom.sf(t - 1, n - 1, corrupt, k - 1))
        assert ours == pytest.approx(theirs, rel=1e-6, abs=1e-300)
        abort = graph_abort_probability(n, k, t, dropout_rate=dropped / n)
        assert abort == pytest.approx(min(1.0, n * hypergeom.sf(k - t - 1, n - 1, dropped, k - 1)), rel=1e-9)


def test_full_failure_bound_against_enumeration_of_corrupt_and_dropped_sets():
    """Every placement of 2 corrupt and 2 dropped nodes on a ring of 11 with k = 5, t = 2."""
    n, k, t, corrupt, dropped = 11, 5, 2, 2, 2
    neighbours = flower_neighbours(list(range(n)), k)
    fails = total = 0
    for bad in itertools.combinations(range(n), corrupt):
        rest = [v for v in range(n) if v not in bad]
        for gone in itertools.combinations(rest, dropped):
            honest_alive = set(rest) - set(gone)
            reveal = any(len((neighbours[v] - {v}) & set(bad)) >= t for v in set(rest))
            fails += reveal or splits(neighbours, honest_alive)
            total += 1
    exact = fails / total
    bound = graph_failure_probability(n, k, t, dropout_rate=dropped / n, corrupt_rate=corrupt / n)
    assert exact > 0.1 and bound >= exact


def test_choose_graph_meets_targets_and_is_minimal():
    for n, dropout, corrupt in [(10, 0.1, 0.0), (100, 0.1, 0.05), (1000, 0.1, 0.05), (1000, 0.2, 0.1)]:
        graph = choose_graph(n, dropout_rate=dropout, corrupt_rate=corrupt)
        assert isinstance(graph, SecAggGraph)
        k, t = graph.num_shares, graph.threshold
        assert k == n or k % 2 == 1
        assert k // 2 < t < k
        assert graph.failure_probability <= PRIVACY_FAILURE_TARGET
        assert graph.abort_probability <= ABORT_TARGET
        assert graph.failure_probability == graph_failure_probability(
            n, k, t, dropout_rate=dropout, corrupt_rate=corrupt
        )
        if k > 3:  # the next smaller neighbourhood fails a target with every admissible threshold
            smaller = k - 2 if k < n or n % 2 else k - 1
            assert all(
                graph_failure_probability(n, smaller, s, dropout_rate=dropout, corrupt_rate=corrupt)
                > PRIVACY_FAILURE_TARGET
                or graph_abort_probability(n, smaller, s, dropout_rate=dropout) > ABORT_TARGET
                or n * hypergeom.sf(2 * s - smaller - 1, n - 1, math.ceil(corrupt * n), smaller - 1)
                > PRIVACY_FAILURE_TARGET
                for s in range(smaller // 2 + 1, smaller)
            )


def test_defaults_scale_to_a_thousand_devices():
    graph = choose_graph(1000, dropout_rate=0.1, corrupt_rate=0.05)
    assert graph.num_shares <= 101  # a tenth of the full graph's work per device or less
    assert choose_graph(10_000, dropout_rate=0.1, corrupt_rate=0.05).num_shares <= 151


def test_honest_coordinator_delta_adds_failures_rounded_up():
    rounded_down_somewhere = False
    for delta in (1e-5, 1e-6, 3e-7, 1e-9):
        for betas in ([PRIVACY_FAILURE_TARGET] * 1000, [1e-17], [3e-17, 1e-20], [0.1**20] * 7):
            got = honest_coordinator_delta(delta, betas)
            exact = Fraction(delta) + sum(Fraction(b) for b in betas)
            assert Fraction(got) >= exact
            assert got <= math.nextafter(float(exact), 1.0)  # and no looser than one step
            rounded_down_somewhere |= Fraction(float(exact)) < exact
    assert rounded_down_somewhere  # the cases exercise the upward step
    assert honest_coordinator_delta(1e-5, []) == 1e-5
    assert honest_coordinator_delta(0.5, [0.6]) == 1.0


@pytest.mark.parametrize(
    ("call", "field"),
    [
        (lambda: choose_graph(1000, dropout_rate=1.0, corrupt_rate=0.0), "dropout_rate"),
        (lambda: choose_graph(1000, dropout_rate=0.1, corrupt_rate=float("nan")), "corrupt_rate"),
        (lambda: choose_graph(2, dropout_rate=0.1, corrupt_rate=0.0), "n"),
        (lambda: graph_failure_probability(100, 10, 5, dropout_rate=0.1, corrupt_rate=0.0), "odd"),
        (lambda: graph_failure_probability(100, 11, 12, dropout_rate=0.1, corrupt_rate=0.0), "threshold"),
        (lambda: graph_failure_probability(100, 101, 5, dropout_rate=0.1, corrupt_rate=0.0), "num_shares"),
        (lambda: honest_coordinator_delta(1e-5, [float("inf")]), "failure_probabilities[0]"),
        (lambda: honest_coordinator_delta(-1.0, []), "delta"),
    ],
)
def test_bad_input_names_the_field(call, field):
    with pytest.raises(ValueError, match=field.replace("[", r"\[").replace("]", r"\]")):
        call()


def test_impossible_rates_are_refused_with_the_rates_named():
    with pytest.raises(ValueError, match="dropout_rate=0.6"):
        choose_graph(50, dropout_rate=0.6, corrupt_rate=0.3)


def test_dropouts_beyond_the_assumed_rate_are_not_accounted_on_a_sparse_graph():
    assert dropouts_accounted(1000, 79, 100, dropout_rate=0.1)
    assert not dropouts_accounted(1000, 79, 101, dropout_rate=0.1)
    assert dropouts_accounted(1000, 1000, 900, dropout_rate=0.1)  # a full graph cannot split
    with pytest.raises(ValueError, match="dropped"):
        dropouts_accounted(10, 5, 11, dropout_rate=0.1)
