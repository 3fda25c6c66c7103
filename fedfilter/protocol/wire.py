"""The wire format between a device and its coordinator: record names, statuses, the round request.

Both sides import these and nothing else describes the format (the device's mod,
``fedfilter.client.filter_mod``; the coordinator's strategy, ``fedfilter.coordinator.strategy``; the
public ledger's proto, ``protos/fedfilter.proto``):

* a train message carries the model as the ``ArrayRecord`` ``"arrays"`` and the round request as the
  ``ConfigRecord`` ``"fedfilter.request"`` (``REQUEST_KEYS``, read by ``round_spec_from_record``);
* a reply carries ``"fedfilter.status"`` (``"report"`` or ``"left"``) and, for a report, the noisy
  update as ``"arrays"``; nothing else.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from flwr.app import ConfigRecord

from fedfilter.checks import short_repr
from fedfilter.protocol.request import RoundSpec, RoundSpecError

__all__ = [
    "ARRAYS_RECORD",
    "REQUEST_RECORD",
    "STATUS_RECORD",
    "STATUS_REPORT",
    "STATUS_LEFT",
    "REQUEST_FIELDS",
    "REQUEST_KEYS",
    "request_record",
    "round_spec_from_record",
    "request_proto",
]

REQUEST_RECORD = "fedfilter.request"
STATUS_RECORD = "fedfilter.status"
ARRAYS_RECORD = "arrays"
STATUS_REPORT = "report"  # contributed and noise-only alike: the coordinator cannot tell them apart
STATUS_LEFT = "left"
# The request's wire keys, once: key -> (RoundSpec field, the types the record may hold there).
# request_record, round_spec_from_record and request_proto all loop over this table.
REQUEST_FIELDS: dict[str, tuple[str, tuple[type, ...]]] = {
    "run-id": ("run_id", (str,)),
    "round-id": ("round_id", (int,)),
    "noise-multiplier": ("noise_multiplier", (int, float)),
    "clip": ("clip", (int, float)),
    "placement": ("placement", (str,)),
    "min-reports": ("min_reports", (int,)),
}
REQUEST_KEYS = tuple(REQUEST_FIELDS)


def request_record(spec: RoundSpec) -> ConfigRecord:
    """The ``ConfigRecord`` a coordinator sends as ``"fedfilter.request"``."""
    # Each value as the record's own type (a numpy scalar is no ConfigRecord value); float where an int
    # is allowed too, as the coordinator sends a float noise multiplier and clip.
    values = {}
    for key, (field, kinds) in REQUEST_FIELDS.items():
        wire_type = float if float in kinds else kinds[0]
        values[key] = wire_type(getattr(spec, field))
    return ConfigRecord(values)


def round_spec_from_record(record: ConfigRecord | None) -> RoundSpec:
    """Read a ``RoundSpec`` from the request record; ``RoundSpecError`` names every bad key."""
    if record is None:
        raise RoundSpecError(
            f"round request refused: the message has no ConfigRecord {REQUEST_RECORD!r}; is the server's "
            "strategy wrapped in fedfilter's IndividualFilterStrategy?",
            code="no-request",
        )
    problems = [f"{REQUEST_RECORD}[{k!r}] is missing." for k in REQUEST_KEYS if k not in record]
    for key, (_, kinds) in REQUEST_FIELDS.items():
        if key in record and (isinstance(record[key], bool) or not isinstance(record[key], kinds)):
            problems.append(f"{REQUEST_RECORD}[{key!r}] has the wrong type. Found {short_repr(record[key])}.")
    if problems:
        raise RoundSpecError("round request refused: " + " ".join(problems), code="bad-request")
    # Values go through as sent (no float(): a huge int would overflow); check_request bounds them.
    # Any: the isinstance checks above established each field's type.
    fields: dict[str, Any] = {field: record[key] for key, (field, _) in REQUEST_FIELDS.items()}
    return RoundSpec(**fields)


def request_proto(spec: RoundSpec, *, local_epochs: int = 0, learning_rate: float = 0.0):
    """The same request as the public ledger's ``RoundRequest`` proto (``protos/fedfilter.proto``)."""
    from fedfilter.protos import fedfilter_pb2

    placement = fedfilter_pb2.DISTRIBUTED if spec.placement == "distributed" else fedfilter_pb2.LOCAL
    fields = {field: getattr(spec, field) for field, _ in REQUEST_FIELDS.values()}
    return fedfilter_pb2.RoundRequest(
        **{**fields, "placement": placement}, local_epochs=local_epochs, learning_rate=learning_rate
    )


# The reply format: every floating-point report array travels as float32.
REPLY_DTYPE = np.dtype(np.float32)


def reply_dtype(model_dtype) -> np.dtype:
    """The dtype a report's array travels in: ``REPLY_DTYPE`` for floating-point model arrays; other
    arrays (e.g. integer counters, which are never released) keep the model's dtype, as zeros."""
    dtype = np.dtype(model_dtype)
    return REPLY_DTYPE if np.issubdtype(dtype, np.floating) else dtype  # the noise std is 2**16 to 2**17 grid steps


# SecAgg+ consistency round (client/secagg/consistency.py): the record fedfilter adds to Flower's
# SecAgg+ messages, and the stage name sent between collect-masked-vectors and unmask.
CONSISTENCY_RECORD = "fedfilter.secagg"
CONSISTENCY_STAGE = "fedfilter_consistency_check"

# Flower's legacy-context records (flwr.server.workflow.constant, 1.41.0), which its SecAgg+ workflow
# reads: the coordinator's secure round writes them and its consistency round reads the round number.
LEGACY_CONFIGS_RECORD = "config"
LEGACY_PARAMS_RECORD = "parameters"
LEGACY_CURRENT_ROUND = "current_round"
