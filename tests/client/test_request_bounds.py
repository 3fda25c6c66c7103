"""Every number in a round request is bounded before training, and a refusal
names the field and the value and spends nothing (core API and the real mod)."""

import math

import numpy as np
import pytest
from flwr.app import ConfigRecord
from helpers.mods import Handler, context, records, spec, train_message

from fedfilter.client.filter_mod import individual_filter_mod
from fedfilter.client.ledger.budget import BudgetLedger
from fedfilter.client.release import FilteredClient
from fedfilter.client.settings.policy import ClientPolicy, check_request
from fedfilter.protocol.request import RoundSpec, RoundSpecError

INT64_MAX = 2**63 - 1
DISTRIBUTED = ClientPolicy(allow_distributed=True, max_min_reports=50)


@pytest.mark.parametrize(
    "request_spec, words",
    [
        (RoundSpec("r", 0, 1.0, 1.0, placement="distributed", min_reports=10**9), ["min_reports", "1000000000", "50"]),
        (RoundSpec("r", 0, 1.0, 1.0, placement="distributed", min_reports=51), ["min_reports", "51"]),
        (RoundSpec("r", 0, 1.0, 1.0, min_reports=2**64), ["min_reports", "65 bits"]),
        (RoundSpec("r", INT64_MAX + 1, 1.0, 1.0), ["round_id", "9223372036854775808"]),
        (RoundSpec("r", 10**5000, 1.0, 1.0), ["round_id", "bits"]),  # repr() of it would raise
        (RoundSpec("r", 0, 10**400, 1.0), ["noise_multiplier", "bits"]),  # float() of it would raise
        (RoundSpec("r", 0, 1e200, 1e200), ["noise_multiplier * clip", "inf"]),
        (RoundSpec("r", 0, 1.0, 1e-320), ["noise_multiplier * clip", "2**-100"]),
        (RoundSpec("r", 0, 1.0, 2.0**-98, placement="distributed", min_reports=50), ["sqrt(min_reports)"]),
        (RoundSpec("x" * 10_000, 0, 1.0, 1.0), ["run_id", "256", "..."]),
    ],
)
def test_out_of_range_requests_are_refused_by_the_core_api(tmp_path, request_spec, words):
    ledger = BudgetLedger.enrol(tmp_path, client_id="d", epsilon=1.0, delta=1e-5)
    with pytest.raises(RoundSpecError) as err:
        FilteredClient(ledger, DISTRIBUTED).release(request_spec, [np.ones(3)])
    for w in words:
        assert w in str(err.value), (w, str(err.value))
    assert len(str(err.value)) < 1000
    assert ledger.records() == []


def test_the_bounds_themselves_are_accepted(tmp_path):
    ledger = BudgetLedger.enrol(tmp_path, client_id="d", epsilon=1.0, delta=1e-5, worst_case_epsilon=1000.0)
    client = FilteredClient(ledger, DISTRIBUTED)
    assert client.release(RoundSpec("r", INT64_MAX, 1.0, 1.0), [np.ones(3)]).status == "contributed"
    rel = client.release(RoundSpec("r" * 256, 0, 1.0, 1.0, placement="distributed", min_reports=50), [np.ones(3)])
    assert rel.noise_std == pytest.approx(1 / math.sqrt(50))
    # The noise grid's range (client.mechanism.noise_grid), both ends included.
    check_request(RoundSpec("r", 0, 1.0, 2.0**-100), ClientPolicy())
    check_request(RoundSpec("r", 0, 2.0, 2.0**99), ClientPolicy())
    with pytest.raises(RoundSpecError, match="2\\*\\*100"):
        check_request(RoundSpec("r", 0, 1.0, 2.0**100 * (1 + 2**-52)), ClientPolicy())


def test_policy_cap_must_be_sane():
    for bad in (0, -1, 2**63, 1.5, True):
        with pytest.raises(ValueError, match="max_min_reports"):
            ClientPolicy(max_min_reports=bad)


def _request(**over):
    base = {
        "run-id": "run-a",
        "round-id": 1,
        "noise-multiplier": 1.0,
        "clip": 1.0,
        "placement": "local",
        "min-reports": 1,
    }
    return ConfigRecord({**base, **over})


@pytest.mark.parametrize(
    "over, node, words",
    [
        # Without secure_aggregation_mod distributed placement is refused too; the bound is named anyway.
        ({"placement": "distributed", "min-reports": 10**9}, {}, ["min_reports", "100", "secure aggregation"]),
        (
            {"placement": "distributed", "min-reports": 20},
            {"max-min-reports": 10},
            ["min_reports", "20", "10"],
        ),
        ({"noise-multiplier": 1e200, "clip": 1e200}, {}, ["noise_multiplier * clip"]),
        ({"noise-multiplier": 10**400}, {}, ["noise_multiplier"]),
        ({"round-id": 2**63}, {}, ["round_id"]),
        ({"round-id": -1}, {}, ["round_id", "-1"]),
        ({"min-reports": 2**70}, {}, ["min_reports"]),
    ],
)
def test_out_of_range_requests_are_refused_by_the_mod_before_training(tmp_path, over, node, words):
    handler = Handler()
    reply = individual_filter_mod(train_message(None, request=_request(**over)), context(tmp_path, **node), handler)
    assert reply.has_error()
    for w in words:
        assert w in reply.error.reason, (w, reply.error.reason)
    assert handler.calls == 0
    assert not (tmp_path / "ledger").exists() or records(tmp_path)[0] == []


def test_a_bad_max_min_reports_setting_is_refused(tmp_path):
    reply = individual_filter_mod(train_message(spec()), context(tmp_path, **{"max-min-reports": 0}), Handler())
    assert reply.has_error() and "settings" in reply.error.reason
