from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class NoisePlacement(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    NOISE_PLACEMENT_UNSPECIFIED: _ClassVar[NoisePlacement]
    LOCAL: _ClassVar[NoisePlacement]
    DISTRIBUTED: _ClassVar[NoisePlacement]
NOISE_PLACEMENT_UNSPECIFIED: NoisePlacement
LOCAL: NoisePlacement
DISTRIBUTED: NoisePlacement

class RoundRequest(_message.Message):
    __slots__ = ("run_id", "round_id", "noise_multiplier", "clip", "placement", "min_reports", "local_epochs", "learning_rate", "clipped_count_stddev", "planned_asks")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    ROUND_ID_FIELD_NUMBER: _ClassVar[int]
    NOISE_MULTIPLIER_FIELD_NUMBER: _ClassVar[int]
    CLIP_FIELD_NUMBER: _ClassVar[int]
    PLACEMENT_FIELD_NUMBER: _ClassVar[int]
    MIN_REPORTS_FIELD_NUMBER: _ClassVar[int]
    LOCAL_EPOCHS_FIELD_NUMBER: _ClassVar[int]
    LEARNING_RATE_FIELD_NUMBER: _ClassVar[int]
    CLIPPED_COUNT_STDDEV_FIELD_NUMBER: _ClassVar[int]
    PLANNED_ASKS_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    round_id: int
    noise_multiplier: float
    clip: float
    placement: NoisePlacement
    min_reports: int
    local_epochs: int
    learning_rate: float
    clipped_count_stddev: float
    planned_asks: int
    def __init__(self, run_id: _Optional[str] = ..., round_id: _Optional[int] = ..., noise_multiplier: _Optional[float] = ..., clip: _Optional[float] = ..., placement: _Optional[_Union[NoisePlacement, str]] = ..., min_reports: _Optional[int] = ..., local_epochs: _Optional[int] = ..., learning_rate: _Optional[float] = ..., clipped_count_stddev: _Optional[float] = ..., planned_asks: _Optional[int] = ...) -> None: ...

class PublicRoundRecord(_message.Message):
    __slots__ = ("run_id", "round_id", "request", "clients_sampled", "reports_received", "markers_received", "replies_dropped", "released", "aggregate_norm", "metrics", "started_at_unix", "finished_at_unix", "wall_time_s", "expected_noise_norm", "unclipped_fraction")
    class MetricsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    ROUND_ID_FIELD_NUMBER: _ClassVar[int]
    REQUEST_FIELD_NUMBER: _ClassVar[int]
    CLIENTS_SAMPLED_FIELD_NUMBER: _ClassVar[int]
    REPORTS_RECEIVED_FIELD_NUMBER: _ClassVar[int]
    MARKERS_RECEIVED_FIELD_NUMBER: _ClassVar[int]
    REPLIES_DROPPED_FIELD_NUMBER: _ClassVar[int]
    RELEASED_FIELD_NUMBER: _ClassVar[int]
    AGGREGATE_NORM_FIELD_NUMBER: _ClassVar[int]
    METRICS_FIELD_NUMBER: _ClassVar[int]
    STARTED_AT_UNIX_FIELD_NUMBER: _ClassVar[int]
    FINISHED_AT_UNIX_FIELD_NUMBER: _ClassVar[int]
    WALL_TIME_S_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_NOISE_NORM_FIELD_NUMBER: _ClassVar[int]
    UNCLIPPED_FRACTION_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    round_id: int
    request: RoundRequest
    clients_sampled: int
    reports_received: int
    markers_received: int
    replies_dropped: int
    released: bool
    aggregate_norm: float
    metrics: _containers.ScalarMap[str, float]
    started_at_unix: float
    finished_at_unix: float
    wall_time_s: float
    expected_noise_norm: float
    unclipped_fraction: float
    def __init__(self, run_id: _Optional[str] = ..., round_id: _Optional[int] = ..., request: _Optional[_Union[RoundRequest, _Mapping]] = ..., clients_sampled: _Optional[int] = ..., reports_received: _Optional[int] = ..., markers_received: _Optional[int] = ..., replies_dropped: _Optional[int] = ..., released: _Optional[bool] = ..., aggregate_norm: _Optional[float] = ..., metrics: _Optional[_Mapping[str, float]] = ..., started_at_unix: _Optional[float] = ..., finished_at_unix: _Optional[float] = ..., wall_time_s: _Optional[float] = ..., expected_noise_norm: _Optional[float] = ..., unclipped_fraction: _Optional[float] = ...) -> None: ...

class GetRecordsRequest(_message.Message):
    __slots__ = ("run_id",)
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    def __init__(self, run_id: _Optional[str] = ...) -> None: ...

class RecordList(_message.Message):
    __slots__ = ("records",)
    RECORDS_FIELD_NUMBER: _ClassVar[int]
    records: _containers.RepeatedCompositeFieldContainer[PublicRoundRecord]
    def __init__(self, records: _Optional[_Iterable[_Union[PublicRoundRecord, _Mapping]]] = ...) -> None: ...

class StreamRecordsRequest(_message.Message):
    __slots__ = ("run_id", "from_round")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    FROM_ROUND_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    from_round: int
    def __init__(self, run_id: _Optional[str] = ..., from_round: _Optional[int] = ...) -> None: ...

class ListRunsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class RunInfo(_message.Message):
    __slots__ = ("run_id", "created_at_unix", "config_json", "finished_at_unix")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_UNIX_FIELD_NUMBER: _ClassVar[int]
    CONFIG_JSON_FIELD_NUMBER: _ClassVar[int]
    FINISHED_AT_UNIX_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    created_at_unix: float
    config_json: str
    finished_at_unix: float
    def __init__(self, run_id: _Optional[str] = ..., created_at_unix: _Optional[float] = ..., config_json: _Optional[str] = ..., finished_at_unix: _Optional[float] = ...) -> None: ...

class RunList(_message.Message):
    __slots__ = ("runs",)
    RUNS_FIELD_NUMBER: _ClassVar[int]
    runs: _containers.RepeatedCompositeFieldContainer[RunInfo]
    def __init__(self, runs: _Optional[_Iterable[_Union[RunInfo, _Mapping]]] = ...) -> None: ...
