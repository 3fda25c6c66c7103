"""SecAgg+ setups as the device checks them before it trains: Flower's grid exact, and a graph on
which every unmasked sum holding this device's report carries the noise its main account charges.

Every check reads only what the device itself enforces (``protocol/secagg/rule.py``): the threshold
it splits its own secrets with, the most holders it shares them with (``share_num``; the mod refuses
more neighbours' keys than that), ``min_reports`` of the request it accepted and its owner's
``secagg-colluders``. The population the coordinator claims (``sample_num``) enters only Flower's
grid (``sample_num * target_range < mod_range``), never the bound. ``assess_secagg_state`` is the
device's check, called before any training; it evaluates the graph rule once and keeps the setup's
problems apart from the graph's. Pure: no Flower, no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, cast

from fedfilter.checks import is_int, is_number
from fedfilter.client.settings.policy import SecAggGraphPolicy
from fedfilter.protocol.secagg.grid import MAX_QUANTIZATION_RANGE, MAX_WEIGHT, MODULUS_RANGE, power_of_two
from fedfilter.protocol.secagg.rule import graph_problems

__all__ = [
    "DEFAULT_GRAPH_POLICY",
    "SecAggStateCheck",
    "assess_secagg_state",
    "check_secagg_graph",
    "check_secagg_state",
]


def check_secagg_graph(state: Mapping[str, Any], min_reports: int, policy: SecAggGraphPolicy) -> list[str]:
    """Problems with the neighbourhood graph in ``secaggplus_mod``'s saved state for a release needing
    ``min_reports``, under the owner's ``policy``: the rule's (``graph_problems``), then the owner's own
    smallest threshold.

    Parameters
    ----------
    state : Mapping
        ``sample_num``, ``share_num`` and ``threshold`` as the coordinator set them (any type).
    min_reports : int
        ``m`` of the request the device accepted.
    policy : SecAggGraphPolicy
        The owner's limits: its assumed ``colluders`` and ``min_threshold``.

    Returns
    -------
    list of str
        One sentence per problem; empty when the device accepts the graph.

    Examples
    --------
    >>> graph = {"sample_num": 100, "share_num": 29, "threshold": 18}
    >>> check_secagg_graph(graph, 18, SecAggGraphPolicy())
    []
    >>> check_secagg_graph(graph, 18, SecAggGraphPolicy(min_threshold=20))
    ["threshold 18 is below this device's secagg-min-threshold 20."]
    """
    n, k, t = (state.get(key) for key in ("sample_num", "share_num", "threshold"))
    problems = graph_problems(
        sample_num=n, share_num=k, threshold=t, min_reports=min_reports, colluders=policy.colluders
    )
    if is_int(t) and 2 <= cast(int, t) < policy.min_threshold:  # below 2: graph_problems names it
        problems.append(f"threshold {t} is below this device's secagg-min-threshold {policy.min_threshold}.")
    return problems


DEFAULT_GRAPH_POLICY = SecAggGraphPolicy()


@dataclass(frozen=True)
class SecAggStateCheck:
    """The device's verdict on a SecAgg+ setup, its two kinds of problem apart.

    Parameters
    ----------
    setup : list of str
        Problems with Flower's grid and the fields' types (the mod could not run the round as set).
    graph : list of str
        Problems with the graph (``check_secagg_graph``), checked once the fields are integers.

    Examples
    --------
    >>> SecAggStateCheck(setup=[], graph=["too few"]).problems
    ['too few']
    """

    setup: list[str]
    graph: list[str]

    @property
    def problems(self) -> list[str]:
        """Every problem, the setup's first; empty when the device accepts the setup.

        Returns
        -------
        list of str
            ``setup`` then ``graph``.

        Examples
        --------
        >>> SecAggStateCheck(setup=["no grid."], graph=["too few."]).problems
        ['no grid.', 'too few.']
        >>> SecAggStateCheck(setup=[], graph=[]).problems
        []
        """
        return [*self.setup, *self.graph]


def assess_secagg_state(
    state: Mapping[str, Any], min_reports: int, graph_policy: SecAggGraphPolicy = DEFAULT_GRAPH_POLICY
) -> SecAggStateCheck:
    """The device's check of the SecAgg+ parameters the coordinator set up (``secaggplus_mod``'s saved
    state, ``context.state.config_records["secaggplus_state"]``) for a release needing ``min_reports``,
    under the owner's limits on the neighbourhood graph: the graph rule is evaluated once, and the
    verdict says whether the graph alone is at fault.

    Parameters
    ----------
    state : Mapping
        The saved state (``target_range``, ``clipping_range``, ``mod_range``, ``max_weight``,
        ``sample_num``, ``threshold``, ``share_num``; any type: checked here).
    min_reports : int
        ``m`` of the request the device accepted.
    graph_policy : SecAggGraphPolicy, optional
        The owner's limits on the graph (its defaults when not given).

    Returns
    -------
    SecAggStateCheck
        The setup's problems and the graph's.

    Examples
    --------
    >>> setup = {"target_range": 2**24, "clipping_range": 2.0**23, "mod_range": 2**32, "max_weight": 1.0}
    >>> verdict = assess_secagg_state({**setup, "sample_num": 10, "share_num": 10, "threshold": 5}, 1)
    >>> verdict.setup, len(verdict.graph)
    ([], 1)
    """
    problems = []

    def get(key: str) -> Any:
        return state.get(key) if hasattr(state, "get") else None

    q, c, m, w = get("target_range"), get("clipping_range"), get("mod_range"), get("max_weight")
    n, t, k = get("sample_num"), get("threshold"), get("share_num")
    if not (power_of_two(q) and 2 <= q <= MAX_QUANTIZATION_RANGE):
        problems.append(f"target_range (quantization range) must be a power of two in [2, 2**30]. Found {q!r}.")
    if not (power_of_two(m) and m <= MODULUS_RANGE):
        # Flower documents 2**32 as its largest modulus (SecAggPlusWorkflow: "must be less than" or equal,
        # its default); above 2**63 the mask generator raises, after the device trained and paid.
        problems.append(f"mod_range must be a power of two <= 2**32. Found {m!r}.")
    if not is_number(w) or float(w) != MAX_WEIGHT:
        problems.append(f"max_weight must be {MAX_WEIGHT!r} (reports carry weight 1). Found {w!r}.")
    if power_of_two(q) and (not is_number(c) or float(c) != q / 2):
        problems.append(f"clipping_range must be target_range / 2 = {q / 2!r}. Found {c!r}.")
    for name, v in (("sample_num", n), ("threshold", t), ("share_num", k)):
        if not is_int(v) or v < 1:  # the types Flower's grid needs; the graph's bounds are the rule's
            problems.append(f"{name} must be an integer >= 1. Found {v!r}.")
    if problems:
        return SecAggStateCheck(setup=problems, graph=[])
    if m % q:
        problems.append(f"mod_range {m} must be a multiple of target_range {q}.")
    if n * q >= m:
        problems.append(f"sample_num * target_range must stay below mod_range. Found {n} * {q} >= {m}.")
    # The fewest honest reports an unmasking can hold (>= min_reports) and the owner's graph limits.
    return SecAggStateCheck(setup=problems, graph=check_secagg_graph(state, min_reports, graph_policy))


def check_secagg_state(
    state: Mapping[str, Any], min_reports: int, graph_policy: SecAggGraphPolicy = DEFAULT_GRAPH_POLICY
) -> list[str]:
    """Every problem ``assess_secagg_state`` finds, the setup's first; empty when the device accepts.

    Parameters
    ----------
    state : Mapping
        ``secaggplus_mod``'s saved state.
    min_reports : int
        ``m`` of the request the device accepted.
    graph_policy : SecAggGraphPolicy, optional
        The owner's limits on the graph (its defaults when not given).

    Examples
    --------
    >>> setup = {"target_range": 2**24, "clipping_range": 2.0**23, "mod_range": 2**32, "max_weight": 1.0}
    >>> check_secagg_state({**setup, "sample_num": 10, "share_num": 10, "threshold": 6}, 6)
    []
    """
    return assess_secagg_state(state, min_reports, graph_policy).problems
