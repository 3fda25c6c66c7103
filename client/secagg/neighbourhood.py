"""SecAgg+ neighbourhoods as the device checks them: the smallest sum an unmasking can hold, and the owner's
limits on the graph the coordinator chose (issue 23).

Flower's ``SecAggPlusWorkflow`` (flwr 1.42, ``setup_stage``) puts the ``n`` sampled nodes on a ring and
gives node ``v`` the ``k`` holders ``N(v)`` at ring offsets ``-k//2 .. k//2`` (itself included; all ``n``
when ``k >= n``). It goes on after each stage only if every sampled node keeps at least ``t`` surviving
holders (``_check_threshold``): ``|N(v) & A| >= t`` for every ``v``, ``A`` the nodes whose masked input is
in the sum. Every node lies in exactly ``k`` of the sets ``N(v)`` (``n`` for the full graph, ``k = n``),
so summing over ``v`` gives ``k |A| >= n t``: a sum SecAgg+ unmasks holds at least ``ceil(n t / k)``
reports (``fewest_released_reports``; ``t`` for the full graph). The device's noise share is calibrated
to ``min_reports`` (each report carries ``mu_total / min_reports``), so it requires
``ceil(n t / k) >= min_reports``; on the full graph this is the former rule ``t >= min_reports``.
This holds for a coordinator that follows the protocol (it runs Flower's ring and sends the true ``n``);
against one that does not, the device's worst-case account holds (DESIGN.md section 5, invariant 8).

The owner's limits (``SecAggGraphPolicy``, node config ``secagg-*``): the probability that the graph's
guarantee fails in a round (``graph_failure_probability`` of ``fedfilter.privacy.secagg_graph``,
under the owner's assumed drop-out and corruption rates) at most ``max_failure_probability``, and a
threshold at least ``min_threshold``. ``check_secagg_graph`` is the device's check, called from
``check_secagg_state``. Pure: no Flower, no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, cast

from fedfilter.checks import is_int, is_number
from fedfilter.client.settings.policy import SecAggGraphPolicy
from fedfilter.privacy.secagg_graph import graph_failure_probability
from fedfilter.protocol.secagg_grid import (
    MAX_QUANTIZATION_RANGE,
    MAX_WEIGHT,
    MODULUS_RANGE,
    fewest_released_reports,
    power_of_two,
)

__all__ = ["DEFAULT_GRAPH_POLICY", "check_secagg_graph", "check_secagg_state"]


def check_secagg_graph(state: Mapping[str, Any], min_reports: int, policy: SecAggGraphPolicy) -> list[str]:
    """Problems with the neighbourhood graph in ``secaggplus_mod``'s saved state (``sample_num``,
    ``share_num``, ``threshold``) for a release needing ``min_reports``, under the owner's ``policy``."""
    values = [state.get(key) for key in ("sample_num", "share_num", "threshold")]
    if not all(is_int(v) for v in values):
        return [f"sample_num, share_num and threshold must be integers. Found {values}."]
    n, k, t = (cast(int, v) for v in values)
    if n < 2 or k < 2 or t < 1:
        return [f"sample_num and share_num must be >= 2 and threshold >= 1. Found {n}, {k}, {t}."]
    problems = []
    fewest = fewest_released_reports(n, k, t)
    if fewest < min_reports:
        problems.append(
            f"SecAgg+ could unmask a sum of {fewest} reports (sample_num {n}, share_num {k}, threshold {t}), "
            f"below min-reports {min_reports}: a released sum could carry less than the accounted noise."
        )
    if t < policy.min_threshold:
        problems.append(f"threshold {t} is below this device's secagg-min-threshold {policy.min_threshold}.")
    if k > n:
        problems.append(f"share_num {k} exceeds sample_num {n}.")
    elif n == 2:
        failure = 1.0  # two nodes: each learns the other's report from the sum; no neighbourhood bound
        if failure > policy.max_failure_probability:
            problems.append("a SecAgg+ round of 2 nodes has no neighbourhood guarantee (failure probability 1).")
    else:
        try:
            failure = graph_failure_probability(
                n, k, t, dropout_rate=policy.dropout_rate, corrupt_rate=policy.corrupt_rate
            )
        except ValueError as err:
            problems.append(f"the SecAgg+ graph is not one Flower builds: {err}")
        else:
            if failure > policy.max_failure_probability:
                problems.append(
                    f"the SecAgg+ graph (sample_num {n}, share_num {k}, threshold {t}) fails with probability "
                    f"up to {failure:.3g} per round, above this device's secagg-max-failure-probability "
                    f"{policy.max_failure_probability:.3g} (assumed drop-out rate {policy.dropout_rate}, "
                    f"corrupt rate {policy.corrupt_rate})."
                )
    return problems


DEFAULT_GRAPH_POLICY = SecAggGraphPolicy()


def check_secagg_state(
    state: Mapping[str, Any], min_reports: int, graph_policy: SecAggGraphPolicy = DEFAULT_GRAPH_POLICY
) -> list[str]:
    """Problems with the SecAgg+ parameters the coordinator set up (``secaggplus_mod``'s saved state,
    ``context.state.config_records["secaggplus_state"]``), for a release needing ``min_reports``, under
    the owner's limits on the neighbourhood graph (``graph_policy``; its defaults when not given)."""
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
        if not is_int(v) or v < 1:
            problems.append(f"{name} must be an integer >= 1. Found {v!r}.")
    if not problems:
        if m % q:
            problems.append(f"mod_range {m} must be a multiple of target_range {q}.")
        if n * q >= m:
            problems.append(f"sample_num * target_range must stay below mod_range. Found {n} * {q} >= {m}.")
        if n < t:
            problems.append(f"sample_num {n} is below threshold {t}.")
        if k > n:
            problems.append(f"share_num {k} exceeds sample_num {n}.")
        if 2 * t <= k:
            # Each device reveals one kind of share per node (secagg_consistency); two disjoint groups of
            # `threshold` holders of a node's `share_num` shares would give a lying coordinator both kinds.
            problems.append(
                f"threshold {t} must exceed half of share_num {k}: below that a coordinator that tells two "
                "groups of neighbours different survivor sets could unmask one report."
            )
        # The fewest reports an unmasking can hold (>= min_reports) and the owner's graph limits.
        problems += check_secagg_graph(state, min_reports, graph_policy)
    return problems
