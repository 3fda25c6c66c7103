"""The round request the coordinator sends and every device checks: its fields and their allowed values.

Both sides import this: the coordinator builds a ``RoundSpec`` and checks its shape before the first
round (``IndividualFilterStrategy``); the device parses one from the wire and checks the same shape
(``request_problems``) before its owner's own rules. The wire encoding is ``fedfilter.protocol.wire``.
"""

from __future__ import annotations

from dataclasses import dataclass

from fedfilter.checks import int_in, positive_finite, short_repr

__all__ = [
    "AFTER_EXHAUSTION",
    "INT64_MAX",
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


class RoundSpecError(ValueError):
    """The coordinator's round request breaks the client's policy; nothing was spent.

    ``code``: the refusal code the device's error reply starts with (``protocol/refusals.py``).
    """

    def __init__(self, message: str, *, code: str = "request-refused") -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class RoundSpec:
    """What the coordinator asks for in one round (public)."""

    run_id: str
    round_id: int
    noise_multiplier: float
    clip: float
    placement: str = "local"
    min_reports: int = 1  # distributed mode: the sum of at least this many reports is released


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
    return problems
