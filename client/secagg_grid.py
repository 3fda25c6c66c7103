"""The integer grid of distributed noise over Flower's SecAgg+, written once for both sides.

A device in ``distributed`` placement releases, per coordinate, the integer ``y = k + S`` where ``k``
is its clipped update snapped toward zero onto the grid of step ``grid_step(clip)`` and ``S`` its
Skellam share (``fedfilter.client.privacy.skellam``). SecAgg+ must add these integers exactly, and
the released sum must be a function of ``sum_i y_i`` alone (then the sum's noise is Skellam with the
sum of the shares' variances, and every device's loss is that of ``k + Sk(mu_total)``):

* Flower's client mod multiplies each value by ``num_examples / max_weight`` and maps
  ``x -> (clip(x, -c, c) + c) * q / (2 c)`` before a stochastic rounding to ``[0, q]``
  (``flwr.common.secure_aggregation.quantization``). With ``max_weight == 1`` and ``num_examples ==
  1`` the factor is exactly 1.0, and with ``c == q / 2`` the map is ``x -> x + q/2``: for an
  integer ``x`` in ``[-q/2, q/2)`` it is exact and the rounding is a no-op.
* A device sends ``x = (y mod q) - q/2`` (``encode_report``): a modular wrap, not a clip. A clip
  would make the sum depend on each ``y_i`` separately (and break the Skellam sum); the wrap keeps
  ``(sum_i x_i + n q/2) mod q == (sum_i y_i) mod q``, since ``q`` divides the modulus ``M``
  (Kairouz, Liu, Steinke, ICML 2021, section 4: modular clipping is post-processing of the sum).
* The server sums modulo ``M``; with ``n q < M`` its weight factor ``n q`` does not wrap, and its
  float result ``(recon - n q/2) / n`` is inverted exactly (``decode_sum``); the centred residue
  ``(recon mod q)`` in ``[-q/2, q/2)`` is ``sum_i y_i`` whenever ``|sum_i y_i| < q/2``, and
  otherwise a wrapped (useless, equally private) value.

``check_secagg_state`` is the device's side of this contract: the coordinator chooses every SecAgg+
parameter in the setup stage, so the device refuses, before it trains, any that would make Flower's
map inexact, its masking or unmasking fail, the released sum smaller than ``min_reports`` reports,
one node's two kinds of key share reachable by two disjoint groups of neighbours, or a neighbourhood
graph outside the owner's limits (``fedfilter.client.secagg_neighbourhood``). It returns a list of
named problems (one string each, all at once); a new check appends to it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from fedfilter.client.secagg_neighbourhood import SecAggGraphPolicy, check_secagg_graph

__all__ = [
    "GRID_BITS",
    "MODULUS_RANGE",
    "MAX_WEIGHT",
    "grid_step",
    "quantization_range",
    "secaggplus_settings",
    "check_secagg_state",
    "encode_report",
    "decode_sum",
]

GRID_BITS = 12  # clip / grid_step lies in [2**12, 2**13): snapping moves a coordinate < 2**-12 C
MODULUS_RANGE = 2**32  # Flower's default and largest SecAgg+ modulus
MAX_WEIGHT = 1.0  # with num_examples = 1, Flower's weight factor is exactly 1.0
MAX_QUANTIZATION_RANGE = 2**30  # Flower casts quantized values to int32
DEFAULT_GRAPH_POLICY = SecAggGraphPolicy()


def _power_of_two(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v > 0 and v & (v - 1) == 0


def grid_step(clip: float) -> float:
    """The grid step, a power of two with ``clip / step`` in ``[2**GRID_BITS, 2**(GRID_BITS+1))``."""
    if not (isinstance(clip, (int, float)) and math.isfinite(clip) and clip > 0):
        raise ValueError(f"clip must be a finite number > 0. Found {clip!r}.")
    _, exp = math.frexp(float(clip))  # clip = frac * 2**exp, frac in [0.5, 1)
    return math.ldexp(1.0, exp - 1 - GRID_BITS)


def quantization_range(n_sampled: int, modulus_range: int = MODULUS_RANGE) -> int:
    """The largest power of two ``q <= 2**30`` with ``n_sampled * q < modulus_range``."""
    if isinstance(n_sampled, bool) or not isinstance(n_sampled, int) or n_sampled < 1:
        raise ValueError(f"n_sampled must be an integer >= 1. Found {n_sampled!r}.")
    q = MAX_QUANTIZATION_RANGE
    while q > 1 and n_sampled * q >= modulus_range:
        q //= 2
    if n_sampled * q >= modulus_range or q < 2:
        raise ValueError(f"no quantization range fits {n_sampled} reports in modulus {modulus_range}.")
    return q


def secaggplus_settings(n_sampled: int) -> dict[str, Any]:
    """The ``SecAggPlusWorkflow`` keyword arguments that make Flower's quantization exact here."""
    q = quantization_range(n_sampled)
    return {
        "max_weight": MAX_WEIGHT,
        "clipping_range": float(q // 2),
        "quantization_range": q,
        "modulus_range": MODULUS_RANGE,
    }


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
    if not (_power_of_two(q) and 2 <= q <= MAX_QUANTIZATION_RANGE):
        problems.append(f"target_range (quantization range) must be a power of two in [2, 2**30]. Found {q!r}.")
    if not (_power_of_two(m) and m <= MODULUS_RANGE):
        # Flower documents 2**32 as its largest modulus (SecAggPlusWorkflow: "must be less than" or equal,
        # its default); above 2**63 the mask generator raises, after the device trained and paid.
        problems.append(f"mod_range must be a power of two <= 2**32. Found {m!r}.")
    if isinstance(w, bool) or not isinstance(w, (int, float)) or float(w) != MAX_WEIGHT:
        problems.append(f"max_weight must be {MAX_WEIGHT!r} (reports carry weight 1). Found {w!r}.")
    if _power_of_two(q) and (isinstance(c, bool) or not isinstance(c, (int, float)) or float(c) != q / 2):
        problems.append(f"clipping_range must be target_range / 2 = {q / 2!r}. Found {c!r}.")
    for name, v in (("sample_num", n), ("threshold", t), ("share_num", k)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
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


def encode_report(y: Sequence[np.ndarray], q: int) -> list[np.ndarray]:
    """``(y mod q) - q/2`` per array, as float64 (exact: every value is an integer below 2**30)."""
    half = q // 2
    return [(np.mod(np.asarray(a, dtype=np.int64), q) - half).astype(np.float64) for a in y]


def decode_sum(aggregated: Sequence[np.ndarray], n_reports: int, q: int) -> list[np.ndarray]:
    """The integer ``sum_i y_i`` per coordinate, centred in ``[-q/2, q/2)``, from the float arrays
    Flower's ``SecAggPlusWorkflow`` hands its strategy after unmasking ``n_reports`` reports.

    Flower computes ``v = (recon - n q/2) * (q / (n q))`` in float64 (``recon`` the unmasked sum mod
    ``M``); ``T = recon - n q/2`` is an integer below ``2**33`` and ``v / inv`` is within
    ``|T| 2**-51 < 1/2`` of it, so ``rint`` recovers ``T`` exactly.
    """
    inv = q / (n_reports * q)
    half = q // 2
    out = []
    for v in aggregated:
        t = np.rint(np.asarray(v, dtype=np.float64) / inv).astype(np.int64)
        recon = t + n_reports * half
        out.append(np.mod(recon + half, q) - half)
    return out
