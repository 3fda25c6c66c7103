"""The round request both sides share (fedfilter.protocol): its shape checks, wire encoding and rules."""

from __future__ import annotations

import pytest
from flwr.app import ConfigRecord
from flwr.serverapp.strategy import FedAvg

from fedfilter.coordinator.strategy import IndividualFilterStrategy
from fedfilter.protocol.request import MAX_RUN_ID_CHARS, RoundSpec, RoundSpecError, request_problems
from fedfilter.protocol.rules import check_message_ttl, run_id_for
from fedfilter.protocol.wire import REQUEST_KEYS, request_proto, request_record, round_spec_from_record

SPEC = RoundSpec("run-1", 3, noise_multiplier=1.5, clip=0.25, placement="distributed", min_reports=4)


def test_a_valid_request_has_no_problem_and_survives_the_wire():
    assert request_problems(SPEC) == [] and request_problems(SPEC, max_min_reports=4) == []
    record = request_record(SPEC)
    assert tuple(record.keys()) == REQUEST_KEYS
    assert round_spec_from_record(record) == SPEC
    proto = request_proto(SPEC, local_epochs=2, learning_rate=0.1)
    assert (proto.run_id, proto.round_id, proto.noise_multiplier, proto.clip, proto.min_reports) == (
        "run-1",
        3,
        1.5,
        0.25,
        4,
    )


def test_every_bad_field_is_named_with_its_value_at_once():
    bad = RoundSpec("", -1, noise_multiplier=float("nan"), clip=True, placement="central", min_reports=0)
    problems = request_problems(bad)
    assert [p.split(" ")[0] for p in problems] == [
        "run_id",
        "round_id",
        "noise_multiplier",
        "clip",
        "min_reports",
        "placement",
    ]
    assert "Found -1." in problems[1] and "Found nan." in problems[2] and "Found 'central'." in problems[5]


def test_the_device_cap_on_min_reports_is_named():
    (problem,) = request_problems(SPEC, max_min_reports=3)
    assert problem == "min_reports must be an integer in [1, 3] (this device's max-min-reports). Found 4."
    assert request_problems(RoundSpec("r", 0, 1.0, 1.0, min_reports=10**30)) == [
        "min_reports must be an integer in [1, 2**63-1]. Found an integer of 100 bits."
    ]


def test_a_record_with_a_missing_or_mistyped_key_is_refused_by_key():
    record = request_record(SPEC)
    del record["clip"]
    record["round-id"] = 3.0
    with pytest.raises(RoundSpecError, match=r"\['clip'\] is missing.*\['round-id'\] has the wrong type") as err:
        round_spec_from_record(record)
    assert err.value.code == "bad-request"
    with pytest.raises(RoundSpecError) as err:
        round_spec_from_record(ConfigRecord({**dict(request_record(SPEC)), "min-reports": True}))
    assert err.value.code == "bad-request"


def test_the_coordinator_refuses_what_every_device_would_refuse():
    long_name = "r" * (MAX_RUN_ID_CHARS + 1)
    with pytest.raises(ValueError, match=f"run_id must be a non-empty string of at most {MAX_RUN_ID_CHARS}"):
        IndividualFilterStrategy(FedAvg(), noise_multiplier=1.0, clip=1.0, run_name=long_name)
    with pytest.raises(ValueError, match=r"placement must be one of \('local', 'distributed'\)"):
        IndividualFilterStrategy(FedAvg(), noise_multiplier=1.0, clip=1.0, placement="central")


def test_the_round_rules_shared_by_the_strategy_and_the_server_app():
    assert run_id_for(7) == "flwr-7"
    check_message_ttl(301.0, 300.0)
    with pytest.raises(ValueError, match="message TTL 300.0 s must exceed the round timeout 300.0 s"):
        check_message_ttl(300.0, 300.0)
