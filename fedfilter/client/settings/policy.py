"""The device owner's policy and the one check of a round request against it.

``ClientPolicy`` (and its ``SecAggGraphPolicy``) come from the node's own config, never from the
coordinator. ``check_request`` is the device's only check of a request: the Flower mod calls it once
at the entry of every path (local and distributed) before any training or spending.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from fedfilter.checks import finite, int_in, is_int, positive_finite, short_repr
from fedfilter.client.mechanisms.gaussian import NOISE_STD_RANGE
from fedfilter.privacy.bisection import MIN_RATE
from fedfilter.protocol.adaptive_clip import accounted_noise_multiplier, augmented_clip
from fedfilter.protocol.request import (
    AFTER_EXHAUSTION,
    INT64_MAX,
    RoundSpec,
    RoundSpecError,
    request_problems,
)
from fedfilter.protocol.rules import DEFAULT_MAX_MIN_REPORTS, accounted_noise_std, added_noise_std


@dataclass(frozen=True)
class SecAggGraphPolicy:
    """The device owner's limits on SecAgg+ graphs (never the coordinator's).

    ``colluders``: the most devices among any of its neighbourhoods that the owner allows to be the
    coordinator's own or to collude with it; the device then requires ``threshold - colluders >=
    min_reports`` and ``2 threshold > share_num + colluders`` (``protocol/secagg/rule.py``). 0: every
    device of its rounds is genuine. ``min_threshold``: the smallest threshold it accepts at all.

    Parameters
    ----------
    min_threshold : int, optional
        The smallest SecAgg+ threshold the device accepts (>= 2).
    colluders : int, optional
        The most colluding devices the owner allows among any neighbourhood (>= 0).

    Examples
    --------
    >>> SecAggGraphPolicy(colluders=1).min_threshold
    2
    >>> SecAggGraphPolicy(min_threshold=1)
    Traceback (most recent call last):
    ...
    ValueError: secagg min_threshold must be an integer >= 2. Found 1.
    """

    min_threshold: int = 2
    colluders: int = 0

    def __post_init__(self) -> None:
        problems = []
        t = self.min_threshold
        if not is_int(t) or t < 2:
            problems.append(f"secagg min_threshold must be an integer >= 2. Found {t!r}.")
        c = self.colluders
        if not is_int(c) or not 0 <= c <= INT64_MAX:
            problems.append(f"secagg colluders must be an integer >= 0. Found {c!r}.")
        if problems:
            raise ValueError(" ".join(problems))


@dataclass(frozen=True)
class ClientPolicy:
    """The device owner's rules; they come from the node's own config, never the coordinator.

    Parameters
    ----------
    min_noise_multiplier : float, optional
        The smallest noise multiplier ``z`` the device accepts.
    after_exhaustion : str, optional
        What the device does once its budget is spent (``"noise-only"`` or ``"leave"``).
    allow_distributed : bool, optional
        Whether distributed placement is served (set by the Flower mod from its mod order: only when
        secure aggregation masks the reply).
    exhausted_below : float, optional
        The share of the clip below which the remaining allowance counts as spent.
    max_min_reports : int, optional
        The largest ``min_reports`` the device believes.
    secagg_graph : SecAggGraphPolicy, optional
        The owner's limits on SecAgg+ neighbourhood graphs.
    max_sampling_rate : float, optional
        The largest rate at which the device puts its update in a reply when it samples itself.

    Examples
    --------
    >>> ClientPolicy(min_noise_multiplier=1.0).after_exhaustion
    'noise-only'
    """

    min_noise_multiplier: float = 0.5
    after_exhaustion: str = "noise-only"
    # Distributed noise is private only against observers of a sum of >= m reports (secure
    # aggregation). The Flower mod sets this from its own mod order (secure_aggregation_mod's mark),
    # never from a setting; direct callers of the core API (the simulation engine) set it themselves.
    allow_distributed: bool = False
    # Below this share of the clip the remaining allowance is treated as spent. A round clipped to
    # 1e-3 C costs 1e-6 of a full round: stopping there wastes nothing measurable, and it keeps the
    # float32 slack of the last clipped round (about 1e-9 of the budget) from buying a further
    # round of pure rounding noise.
    exhausted_below: float = 1e-3
    # Distributed mode trusts secure aggregation to release only sums of >= m reports, and each
    # report carries only 1/sqrt(m) of the accounted noise: the owner caps the m it will believe.
    max_min_reports: int = DEFAULT_MAX_MIN_REPORTS
    # The owner's limits on SecAgg+ neighbourhood graphs (failure probability per round, threshold).
    secagg_graph: SecAggGraphPolicy = field(default_factory=SecAggGraphPolicy)
    # A device that samples itself (the request carries a plan's asks) contributes with a rate it
    # derives from what it has left; the owner caps it (client/mechanisms/sampled.py).
    max_sampling_rate: float = 1.0

    def __post_init__(self):
        problems = []
        problem = positive_finite("min_noise_multiplier", self.min_noise_multiplier)
        if problem:
            problems.append(problem)
        if not int_in(self.max_min_reports, 1, INT64_MAX):
            problems.append(
                f"max_min_reports must be an integer in [1, 2**63-1]. Found {short_repr(self.max_min_reports)}."
            )
        if self.after_exhaustion not in AFTER_EXHAUSTION:
            problems.append(f"after_exhaustion must be one of {AFTER_EXHAUSTION}. Found {self.after_exhaustion!r}.")
        if not (0 <= self.exhausted_below < 1):
            problems.append(f"exhausted_below must be in [0, 1). Found {self.exhausted_below!r}.")
        rate = finite(self.max_sampling_rate)
        if rate is None or not MIN_RATE <= rate <= 1:
            problems.append(
                f"max_sampling_rate must be in [{MIN_RATE}, 1]. Found {short_repr(self.max_sampling_rate)}."
            )
        if problems:
            raise ValueError(" ".join(problems))


def check_request(spec: RoundSpec, policy: ClientPolicy) -> None:
    """Raise ``RoundSpecError`` listing every problem with the request at once.

    Everything the round will compute from the request is bounded here, before any training:
    integers fit SQLite's int64, the noise std ``z * C`` (and the distributed share
    ``z * C / sqrt(m)``) is a finite, normal float, and ``m`` is at most the owner's cap.
    The error's code: ``bad-request`` if any value is malformed or out of range, else the first
    policy the request breaks.

    Parameters
    ----------
    spec : RoundSpec
        The coordinator's request, as decoded from the wire (values not yet trusted).
    policy : ClientPolicy
        The device owner's rules (minimum noise, largest ``min_reports``, whether the reply is masked).

    Raises
    ------
    RoundSpecError
        With ``code`` ``"bad-request"``, ``"noise-below-minimum"`` or ``"needs-secure-aggregation"``.

    Examples
    --------
    >>> check_request(RoundSpec("run", 0, 1.0, 1.0), ClientPolicy())
    >>> try:
    ...     check_request(RoundSpec("run", 0, 0.1, 1.0), ClientPolicy())
    ... except RoundSpecError as err:
    ...     print(err.code)
    noise-below-minimum
    """
    problems = request_problems(spec, max_min_reports=policy.max_min_reports)
    policy_codes: list[str] = []  # the problems that are the device's policy, not a malformed request
    z = finite(spec.noise_multiplier) if positive_finite("noise_multiplier", spec.noise_multiplier) is None else None
    c = finite(spec.clip) if positive_finite("clip", spec.clip) is None else None
    m = spec.min_reports if int_in(spec.min_reports, 1, policy.max_min_reports) else None
    sigma_b = finite(spec.clipped_count_stddev)
    if z is not None and sigma_b is not None and sigma_b > 0:
        # Adaptive clipping: the report also carries the clip bit, so its accounted multiplier is z_eff < z.
        z_eff = accounted_noise_multiplier(z, sigma_b)
        if z_eff < policy.min_noise_multiplier:
            problems.append(
                f"the report's accounted noise multiplier {z_eff!r} (noise_multiplier={z!r} with the clip bit's "
                f"clipped_count_stddev={sigma_b!r}) is below this device's min-noise-multiplier "
                f"{policy.min_noise_multiplier!r} (its owner's setting)."
            )
            policy_codes.append("noise-below-minimum")
    elif z is not None and z < policy.min_noise_multiplier:
        problems.append(
            f"noise_multiplier={z!r} is below this device's min-noise-multiplier {policy.min_noise_multiplier!r} "
            "(its owner's setting)."
        )
        policy_codes.append("noise-below-minimum")
    if spec.placement == "distributed" and not policy.allow_distributed:
        policy_codes.append("needs-secure-aggregation")
        problems.append(
            "placement='distributed' needs secure aggregation: this device serves it only when SecAgg+ masks "
            "its reply (secure_aggregation_mod before individual_filter_mod)."
        )
    if z is not None and c is not None:
        # The accounted std and the share actually added must lie in the noise grid's range
        # (client.mechanisms.gaussian.noise_grid): an overflow to inf, or a std too small for float32 reports,
        # would otherwise fail after training.
        low, high = NOISE_STD_RANGE
        std = accounted_noise_std(z, c)
        if not (math.isfinite(std) and low <= std <= high):
            problems.append(
                f"noise_multiplier * clip (the noise std) must be a finite number in [2**-100, 2**100]. "
                f"Found {z!r} * {c!r} = {std!r}."
            )
        elif spec.placement == "distributed" and m is not None:
            share = added_noise_std(z, c, "distributed", int(m))
            if not low <= share <= high:
                problems.append(
                    f"noise_multiplier * clip / sqrt(min_reports) (each report's noise std) must be "
                    f"in [2**-100, 2**100]. Found {share!r}."
                )
        if sigma_b is not None and sigma_b > 0:
            # Adaptive clipping: the report's norm bound C_aug = sqrt(C^2 + (z C / sigma_b)^2 / 4) is the
            # clip the release works with; a tiny sigma_b would make it overflow (or the bit cost all).
            bound = augmented_clip(c, z, sigma_b)
            if not (math.isfinite(bound) and bound <= high):
                problems.append(
                    "clipped_count_stddev makes the report's norm bound sqrt(clip^2 + (noise_multiplier * clip / "
                    f"clipped_count_stddev)^2 / 4) exceed 2**100. Found clipped_count_stddev={sigma_b!r}."
                )
    if problems:
        code = policy_codes[0] if len(policy_codes) == len(problems) else "bad-request"
        raise RoundSpecError("round request refused: " + " ".join(problems), code=code)
