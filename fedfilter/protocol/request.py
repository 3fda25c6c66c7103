"""The round request the coordinator sends and every device checks: its fields and their allowed values.

Both sides import this: the coordinator builds a ``RoundSpec`` and checks its shape before the first
round (``IndividualFilterStrategy``); the device parses one from the wire and checks the same shape
(``request_problems``) before its owner's own rules. The wire encoding is ``fedfilter.protocol.wire``.

Constants: ``PLACEMENTS``, where the noise is added (``"local"``: each device adds all of it;
``"distributed"``: Skellam shares summed under SecAgg+); ``AFTER_EXHAUSTION``, what a device whose
budget is spent may do (report noise only, or leave the run); ``MAX_RUN_ID_CHARS``, the longest run
id a device stores; ``INT64_MAX``, the largest round id or ``min_reports`` (devices store them as
SQLite integers); ``MAX_PLANNED_ASKS``, the most asks per device a plan may state.

Examples
--------
>>> spec = RoundSpec("run-1", 0, noise_multiplier=1.0, clip=0.5, placement="distributed", min_reports=3)
>>> request_problems(spec), spec.placement in PLACEMENTS
([], True)
"""

from __future__ import annotations

from dataclasses import dataclass

from fedfilter.checks import finite, int_in, positive_finite, short_repr

__all__ = [
    "AFTER_EXHAUSTION",
    "INT64_MAX",
    "MAX_PLANNED_ASKS",
    "MAX_RUN_ID_CHARS",
    "PLACEMENTS",
    "RoundSpec",
    "RoundSpecError",
    "request_problems",
]

PLACEMENTS = ("local", "distributed")
AFTER_EXHAUSTION = ("noise-only", "leave")
MAX_RUN_ID_CHARS = 256  # a run-id is stored with every spend: a huge one would fill the device's disk
INT64_MAX = 2**63 - 1  # devices store round ids as SQLite integers (int64): a larger one would overflow
MAX_PLANNED_ASKS = 10**6  # the most asks per device a plan may state (a device spreads its budget over them)


class RoundSpecError(ValueError):
    """The coordinator's round request breaks the client's policy; nothing was spent.

    ``code``: the refusal code the device's error reply starts with (``protocol/refusals.py``).

    Parameters
    ----------
    message : str
        What is wrong, naming the field and the value found.
    code : str, optional
        The refusal code (default ``"request-refused"``).

    Examples
    --------
    >>> err = RoundSpecError("round request refused: no request", code="no-request")
    >>> err.code, isinstance(err, ValueError)
    ('no-request', True)
    """

    def __init__(self, message: str, *, code: str = "request-refused") -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class RoundSpec:
    """What the coordinator asks for in one round (public).

    The constructor does not check the values: ``request_problems`` does, on both sides.

    Parameters
    ----------
    run_id : str
        The run the device accounts the round under.
    round_id : int
        The round's number within the run; a device spends at most once per (run, round).
    noise_multiplier : float
        ``z``: the released noise std is ``z * clip``.
    clip : float
        The clip norm ``C`` of an update.
    placement : {"local", "distributed"}, optional
        Where the noise is added (``PLACEMENTS``).
    min_reports : int, optional
        Distributed placement: the sum of at least this many reports is released.
    clipped_count_stddev : float, optional
        Adaptive clipping's ``sigma_b`` (``protocol/adaptive_clip.py``): each report carries one more
        coordinate, the device's "my update was within the clip" bit, whose sum has noise std
        ``sigma_b`` in bits. 0 (the default): a fixed clip, no bit.
    planned_asks : int, optional
        The asks per device the run's plan expects. A device whose filter can account it then samples
        itself: it spreads what it has left over the asks still expected and puts its update in the
        reply with the rate that buys (``client/mechanisms/sampled.py``). 0 (the default): no plan, the
        update is in every reply.

    Examples
    --------
    >>> RoundSpec("run-1", 0, noise_multiplier=1.0, clip=0.5)
    ... # doctest: +NORMALIZE_WHITESPACE
    RoundSpec(run_id='run-1', round_id=0, noise_multiplier=1.0, clip=0.5, placement='local', min_reports=1,
              clipped_count_stddev=0.0, planned_asks=0)
    """

    run_id: str
    round_id: int
    noise_multiplier: float
    clip: float
    placement: str = "local"
    min_reports: int = 1  # distributed mode: the sum of at least this many reports is released
    clipped_count_stddev: float = 0.0  # adaptive clipping's sigma_b; 0: a fixed clip
    planned_asks: int = 0  # the plan's asks per device, for devices that sample themselves; 0: none


def request_problems(spec: RoundSpec, *, max_min_reports: int | None = None) -> list[str]:
    """Every problem with the shape of a round request, each naming the field and the value.

    The checks both sides share; a device adds its owner's rules (minimum noise, secure aggregation,
    the noise std's range) after these. Pure: nothing is raised, nothing read.

    Parameters
    ----------
    spec : RoundSpec
        The request as sent or as parsed from the wire (fields may hold any type).
    max_min_reports : int, optional
        The device owner's cap on ``min_reports`` (``ClientPolicy.max_min_reports``), named in the
        message. ``None`` (the coordinator): any integer a device could store.

    Returns
    -------
    list of str
        One sentence per bad field, in field order; empty when the shape is valid.

    Examples
    --------
    >>> request_problems(RoundSpec("run-1", 0, noise_multiplier=1.0, clip=0.5))
    []
    >>> request_problems(RoundSpec("run-1", -1, noise_multiplier=1.0, clip=0.5, placement="central"))
    ... # doctest: +NORMALIZE_WHITESPACE
    ['round_id must be an integer in [0, 2**63-1]. Found -1.',
     "placement must be one of ('local', 'distributed'). Found 'central'."]
    """
    problems = []
    if not (isinstance(spec.run_id, str) and 0 < len(spec.run_id) <= MAX_RUN_ID_CHARS):
        problems.append(
            f"run_id must be a non-empty string of at most {MAX_RUN_ID_CHARS} characters. "
            f"Found {short_repr(spec.run_id)}."
        )
    if not int_in(spec.round_id, 0, INT64_MAX):
        problems.append(f"round_id must be an integer in [0, 2**63-1]. Found {short_repr(spec.round_id)}.")
    for name in ("noise_multiplier", "clip"):
        if (problem := positive_finite(name, getattr(spec, name))) is not None:
            problems.append(problem)
    if max_min_reports is None:
        if not int_in(spec.min_reports, 1, INT64_MAX):
            problems.append(f"min_reports must be an integer in [1, 2**63-1]. Found {short_repr(spec.min_reports)}.")
    elif not int_in(spec.min_reports, 1, max_min_reports):
        problems.append(
            f"min_reports must be an integer in [1, {max_min_reports}] (this device's "
            f"max-min-reports). Found {short_repr(spec.min_reports)}."
        )
    if spec.placement not in PLACEMENTS:
        problems.append(f"placement must be one of {PLACEMENTS}. Found {short_repr(spec.placement)}.")
    sigma_b = finite(spec.clipped_count_stddev)
    if sigma_b is None or sigma_b < 0:
        problems.append(
            "clipped_count_stddev must be a finite number >= 0 (0: a fixed clip). "
            f"Found {short_repr(spec.clipped_count_stddev)}."
        )
    if not int_in(spec.planned_asks, 0, MAX_PLANNED_ASKS):
        problems.append(
            f"planned_asks must be an integer in [0, {MAX_PLANNED_ASKS}] (0: no plan). "
            f"Found {short_repr(spec.planned_asks)}."
        )
    elif spec.planned_asks and sigma_b:
        # The clip bit would be dropped with the update by the device's coin, and the coordinator's
        # estimate of the unclipped fraction would then be biased by the devices' (private) rates.
        problems.append(
            "planned_asks (devices that sample themselves) cannot be combined with adaptive clipping "
            f"(clipped_count_stddev={spec.clipped_count_stddev!r}): use a fixed clip."
        )
    return problems
