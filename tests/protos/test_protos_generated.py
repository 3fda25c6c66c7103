"""The committed generated code matches protos/fedfilter.proto, and the schema stays public."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from fedfilter.coordinator.public_ledger import looks_per_client
from fedfilter.protos import fedfilter_pb2, fedfilter_pb2_grpc

PROTOS = Path(__file__).resolve().parents[2] / "fedfilter" / "protos"

# Independent of coordinator.public_ledger's list, on purpose.
PER_CLIENT = re.compile(r"budget|epsilon|spent|example|client_?id|node_?id", re.IGNORECASE)


def test_regenerated_code_is_byte_identical(tmp_path: Path) -> None:
    pytest.importorskip("grpc_tools")
    from fedfilter.protos.generate import GENERATED, generate

    generate(tmp_path)
    for name in GENERATED:
        fresh = (tmp_path / name).read_bytes()
        committed = (PROTOS / name).read_bytes()
        assert fresh == committed, (
            f"protos/{name} is out of date with protos/fedfilter.proto (or was made with another "
            "grpcio-tools); run `python protos/generate.py` and commit the result"
        )


def test_generated_grpc_module_imports_as_package() -> None:
    source = (PROTOS / "fedfilter_pb2_grpc.py").read_text(encoding="utf-8")
    assert "from fedfilter.protos import fedfilter_pb2 as fedfilter__pb2" in source
    assert re.search(r"^import fedfilter_pb2", source, re.MULTILINE) is None
    assert fedfilter_pb2_grpc.fedfilter__pb2 is fedfilter_pb2


def _all_messages(descriptors):
    for message in descriptors:
        yield message
        yield from _all_messages(message.nested_types)


def test_schema_has_no_per_client_field() -> None:
    file = fedfilter_pb2.DESCRIPTOR
    messages = list(_all_messages(file.message_types_by_name.values()))
    assert {m.name for m in messages} >= {
        "RoundRequest",
        "PublicRoundRecord",
        "RunInfo",
        "StreamRecordsRequest",
    }
    names = [m.full_name for m in messages]
    names += [f.full_name for m in messages for f in m.fields]
    names += [v.name for e in file.enum_types_by_name.values() for v in e.values]
    offending = [n for n in names if PER_CLIENT.search(n) or looks_per_client(n.split(".")[-1])]
    assert offending == [], f"per-client names in the public schema: {offending}"


@pytest.mark.parametrize(
    "name",
    [
        "budget",
        "remaining_budget",
        "epsilon",
        "eps_spent",
        "num_examples",
        "n_examples",
        "client_id",
        "clientId",
        "node-id",
        "NodeID",
    ],
)
def test_per_client_detector_flags(name: str) -> None:
    assert looks_per_client(name)


def test_record_fields_as_specified() -> None:
    record = fedfilter_pb2.PublicRoundRecord.DESCRIPTOR
    assert [f.name for f in record.fields] == [
        "run_id",
        "round_id",
        "request",
        "clients_sampled",
        "reports_received",
        "markers_received",
        "replies_dropped",
        "released",
        "aggregate_norm",
        "metrics",
        "started_at_unix",
        "finished_at_unix",
        "wall_time_s",
        "expected_noise_norm",
        "unclipped_fraction",
    ]
    request = fedfilter_pb2.RoundRequest.DESCRIPTOR
    assert [f.name for f in request.fields] == [
        "run_id",
        "round_id",
        "noise_multiplier",
        "clip",
        "placement",
        "min_reports",
        "local_epochs",
        "learning_rate",
        "clipped_count_stddev",
        "planned_asks",
    ]
    assert list(fedfilter_pb2.NoisePlacement.keys()) == [
        "NOISE_PLACEMENT_UNSPECIFIED",
        "LOCAL",
        "DISTRIBUTED",
    ]
    methods = fedfilter_pb2.DESCRIPTOR.services_by_name["ReportService"].methods_by_name
    assert set(methods) == {"GetRecords", "StreamRecords", "ListRuns"}
    assert methods["StreamRecords"].server_streaming
