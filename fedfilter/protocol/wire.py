"""The wire format between a device and its coordinator: record names, statuses, the round request.

Both sides import these and nothing else describes the format (the device's mod,
``fedfilter.client.filter_mod``; the coordinator's strategy, ``fedfilter.coordinator.strategy``; the
public ledger's proto, ``protos/fedfilter.proto``):

* a train message carries the model as the ``ArrayRecord`` ``"arrays"`` and the round request as the
  ``ConfigRecord`` ``"fedfilter.request"`` (``REQUEST_KEYS``, read by ``round_spec_from_record``);
* a reply carries ``"fedfilter.status"`` (``"report"`` or ``"left"``) and, for a report, the noisy
  update as ``"arrays"``; nothing else.

Constants: ``REQUEST_RECORD``, ``STATUS_RECORD`` and ``ARRAYS_RECORD`` name the records above;
``STATUS_REPORT`` and ``STATUS_LEFT`` are the two statuses (a noise-only report is a report too, so
the coordinator cannot tell it from a contribution); ``REQUEST_FIELDS`` maps each wire key of the
request to its ``RoundSpec`` field and the types it may hold, ``REQUEST_KEYS`` lists those keys;
``REPLY_DTYPE`` is the dtype floating-point report arrays travel in; ``CONSISTENCY_RECORD`` and
``CONSISTENCY_STAGE`` name the record and stage fedfilter adds to Flower's SecAgg+ messages.

Examples
--------
>>> spec = RoundSpec("run-1", 3, noise_multiplier=1.0, clip=0.5)
>>> round_spec_from_record(request_record(spec)) == spec
True
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
    "OPTIONAL_REQUEST_FIELDS",
    "CLIP_BIT_KEY",
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
# Keys a request may leave out, with the value a missing one means (a coordinator that predates
# them sends none): key -> (RoundSpec field, allowed types, default).
OPTIONAL_REQUEST_FIELDS: dict[str, tuple[str, tuple[type, ...], Any]] = {
    "clipped-count-stddev": ("clipped_count_stddev", (int, float), 0.0),
    "planned-asks": ("planned_asks", (int,), 0),
}
# Adaptive clipping: the report's extra array, the device's centred "within the clip" bit
# (protocol/adaptive_clip.py), after the model's arrays; one float32 coordinate.
CLIP_BIT_KEY = "fedfilter.clip-bit"


def request_record(spec: RoundSpec) -> ConfigRecord:
    """The ``ConfigRecord`` a coordinator sends as ``"fedfilter.request"``.

    Parameters
    ----------
    spec : RoundSpec
        The round request.

    Returns
    -------
    flwr.app.ConfigRecord
        One entry per key of ``REQUEST_KEYS``, each as a plain Python value.

    Examples
    --------
    >>> record = request_record(RoundSpec("run-1", 3, noise_multiplier=1, clip=0.5))
    >>> record["run-id"], record["round-id"], record["noise-multiplier"]
    ('run-1', 3, 1.0)
    """
    # Each value as the record's own type (a numpy scalar is no ConfigRecord value); float where an int
    # is allowed too, as the coordinator sends a float noise multiplier and clip.
    values = {}
    for key, (field, kinds) in REQUEST_FIELDS.items():
        wire_type = float if float in kinds else kinds[0]
        values[key] = wire_type(getattr(spec, field))
    for key, (field, kinds, default) in OPTIONAL_REQUEST_FIELDS.items():
        if getattr(spec, field) != default:  # a request without the option reads as it always did
            values[key] = (float if float in kinds else kinds[0])(getattr(spec, field))
    return ConfigRecord(values)


def round_spec_from_record(record: ConfigRecord | None) -> RoundSpec:
    """Read a ``RoundSpec`` from the request record; ``RoundSpecError`` names every bad key.

    Only the keys and their types are checked here; the values' ranges are ``request_problems``'s.

    Parameters
    ----------
    record : flwr.app.ConfigRecord or None
        The message's ``"fedfilter.request"`` record (None when the message has none).

    Returns
    -------
    RoundSpec
        The request as sent.

    Raises
    ------
    RoundSpecError
        Code ``"no-request"`` without a record; ``"bad-request"`` naming every missing or ill-typed key.

    Examples
    --------
    >>> round_spec_from_record(request_record(RoundSpec("run-1", 3, noise_multiplier=1.0, clip=0.5)))
    ... # doctest: +NORMALIZE_WHITESPACE
    RoundSpec(run_id='run-1', round_id=3, noise_multiplier=1.0, clip=0.5, placement='local', min_reports=1,
              clipped_count_stddev=0.0, planned_asks=0)
    >>> try:
    ...     round_spec_from_record(ConfigRecord({"run-id": "run-1"}))
    ... except RoundSpecError as err:
    ...     print(err.code)
    bad-request
    """
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
    for key, (_, kinds, _) in OPTIONAL_REQUEST_FIELDS.items():
        if key in record and (isinstance(record[key], bool) or not isinstance(record[key], kinds)):
            problems.append(f"{REQUEST_RECORD}[{key!r}] has the wrong type. Found {short_repr(record[key])}.")
    if problems:
        raise RoundSpecError("round request refused: " + " ".join(problems), code="bad-request")
    # Values go through as sent (no float(): a huge int would overflow); check_request bounds them.
    # Any: the isinstance checks above established each field's type.
    fields: dict[str, Any] = {field: record[key] for key, (field, _) in REQUEST_FIELDS.items()}
    for key, (field, _, default) in OPTIONAL_REQUEST_FIELDS.items():
        fields[field] = record[key] if key in record else default
    return RoundSpec(**fields)


def request_proto(spec: RoundSpec, *, local_epochs: int = 0, learning_rate: float = 0.0):
    """The same request as the public ledger's ``RoundRequest`` proto (``protos/fedfilter.proto``).

    Parameters
    ----------
    spec : RoundSpec
        The round request.
    local_epochs : int, optional
        The local training epochs the run asks for (0: not recorded).
    learning_rate : float, optional
        The local learning rate the run asks for (0: not recorded).

    Returns
    -------
    fedfilter.protos.fedfilter_pb2.RoundRequest
        The proto message.

    Examples
    --------
    >>> proto = request_proto(RoundSpec("run-1", 3, noise_multiplier=1.0, clip=0.5), local_epochs=2)
    >>> proto.run_id, proto.round_id, proto.local_epochs
    ('run-1', 3, 2)
    """
    from fedfilter.protos import fedfilter_pb2

    placement = fedfilter_pb2.DISTRIBUTED if spec.placement == "distributed" else fedfilter_pb2.LOCAL
    fields = {field: getattr(spec, field) for field, _ in REQUEST_FIELDS.values()}
    fields.update(
        {
            field: (float if float in kinds else kinds[0])(getattr(spec, field))
            for field, kinds, _ in OPTIONAL_REQUEST_FIELDS.values()
        }
    )
    return fedfilter_pb2.RoundRequest(
        **{**fields, "placement": placement}, local_epochs=local_epochs, learning_rate=learning_rate
    )


# The reply format: every floating-point report array travels as float32.
REPLY_DTYPE = np.dtype(np.float32)


def reply_dtype(model_dtype) -> np.dtype:
    """The dtype a report's array travels in: ``REPLY_DTYPE`` for floating-point model arrays; other
    arrays (e.g. integer counters, which are never released) keep the model's dtype, as zeros.

    Parameters
    ----------
    model_dtype : numpy.dtype or str
        The dtype of a model array.

    Returns
    -------
    numpy.dtype
        The dtype its report array travels in.

    Examples
    --------
    >>> reply_dtype("float64"), reply_dtype("int64")
    (dtype('float32'), dtype('int64'))
    """
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
