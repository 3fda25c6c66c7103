"""The round request the coordinator sends and every device checks: its fields and their allowed values.

Both sides import this (the coordinator builds a ``RoundSpec``, the device parses and checks one);
the wire encoding is ``fedfilter.protocol.wire``.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["AFTER_EXHAUSTION", "MAX_RUN_ID_CHARS", "PLACEMENTS", "RoundSpec", "RoundSpecError"]

PLACEMENTS = ("local", "distributed")
AFTER_EXHAUSTION = ("noise-only", "leave")
MAX_RUN_ID_CHARS = 256  # a run-id is stored with every spend: a huge one would fill the device's disk


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
