"""The device's error replies: each carries a stable refusal code (``protocol/refusals.py``), and each
is a function of the request and the device's settings only, never of its data or budget state.

The attack: a coordinator that learns anything from *which* error a device sends, or from its words,
would learn it without noise. So every refusal the mod can send is produced here twice, by devices
that differ in their data (what training returns) and in their budget state (fresh, or spent in an
earlier run), and the two replies must be identical. A static check makes sure no error reply of the
mod escapes this list: every ``refusal(...)`` call names a code from the table, and every code has a
scenario below.
"""

from __future__ import annotations

import ast
from pathlib import Path

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, RecordDict
from flwr.common.secure_aggregation.secaggplus_constants import RECORD_KEY_CONFIGS
from helpers.mods import KEYS, SHAPES, spec, train_message

from fedfilter.client.filter_mod import individual_filter_mod
from fedfilter.client.flower.ledger_cache import forget_all
from fedfilter.client.ledger.schema import LEDGER_FILE
from fedfilter.client.settings.node_config import enrol_device
from fedfilter.protocol.refusals import REFUSALS, refusal_code
from fedfilter.protocol.wire import REQUEST_RECORD, request_record

CLIENT = Path(__file__).resolve().parents[2] / "fedfilter" / "client"
# The filter mod, the stages of its round and the SecAgg+ placement: every error reply they build.
MOD_SOURCES = [
    CLIENT / "filter_mod.py",
    *sorted((CLIENT / "round").glob("*.py")),
    CLIENT / "secagg" / "masked_round.py",
]


def _handler(shift: float):
    """Training that returns the model moved by ``shift`` (the device's "data")."""

    def handler(msg, ctx):
        record = next(iter(msg.content.array_records.values()))
        new = {k: Array((record[k].numpy() + shift).astype(np.float32)) for k in record.keys()}
        return Message(RecordDict({"arrays": ArrayRecord(new)}), reply_to=msg)

    return handler


def _device(root: Path, *, spent: bool, enrol: bool = True, **settings) -> Context:
    """A device; ``spent``: its budget was used up by an earlier run (budget state differs)."""
    config = {
        "ledger-dir": str(root / "ledger"),
        "client-id": "alice",
        "budget-epsilon": 0.3 if spent else 50.0,
        "budget-delta": 1e-5,
        "reply-hold-s": 0,
        "run-quota": 1.0,
        **settings,
    }
    if enrol:
        enrol_device(config)
    ctx = Context(run_id=7, node_id=42, node_config=config, state=RecordDict(), run_config={})
    if spent and enrol:
        for r in (1, 2):  # an earlier run spends the small budget (then pure noise)
            warm = Context(run_id=6, node_id=42, node_config=config, state=RecordDict(), run_config={})
            individual_filter_mod(train_message(spec(r, run_id="earlier")), warm, _handler(3.0))
    return ctx


def _secagg_message():
    msg = train_message(spec(1, placement="distributed", m=2))
    msg.content.config_records[RECORD_KEY_CONFIGS] = ConfigRecord({"stage": "setup"})
    return msg


def _two_arrays_message():
    msg = train_message(spec(1))
    msg.content["second"] = ArrayRecord({"x": Array(np.zeros(3, np.float32))})
    return msg


def _int_model_message():
    return train_message(spec(1), arrays=[np.zeros(shape, np.int64) for shape in SHAPES])


# code -> (device settings, messages sent in order; the last one's reply is the refusal)
SCENARIOS = {
    "evaluate-refused": ({}, lambda: [train_message(spec(1), message_type="evaluate")]),
    "device-settings": ({"min-noise-multiplier": -1.0}, lambda: [train_message(spec(1))]),
    "no-request": ({}, lambda: [train_message(None)]),
    "bad-request": ({}, lambda: [train_message(None, request=ConfigRecord({"run-id": "r"}))]),
    "noise-below-minimum": ({"min-noise-multiplier": 2.0}, lambda: [train_message(spec(1, z=1.0))]),
    "needs-secure-aggregation": ({}, lambda: [train_message(spec(1, placement="distributed", m=2))]),
    "secagg-mod-order": ({}, lambda: [_secagg_message()]),
    "bad-model": ({}, lambda: [_two_arrays_message()]),
    "no-float-model": ({}, lambda: [_int_model_message()]),
    "run-id-changed": ({}, lambda: [train_message(spec(1, run_id="a")), train_message(spec(2, run_id="b"))]),
    "not-enrolled": ({"_enrol": False}, lambda: [train_message(spec(1))]),
    "replay": ({}, lambda: [train_message(spec(1), message_id="m1"), train_message(spec(1), message_id="m2")]),
}
# Refusals whose cause is not reachable with the messages alone (the test says where they are covered):
COVERED_ELSEWHERE = {
    "ledger-failed": "a failing disk (test_ledger_fail_closed.py); depends on the disk, not the data",
    "ledger-refused": "a damaged ledger (below); a restored or older-format one: test_ledger_rollback.py",
    "filter-not-rdp": "a SecAgg+ masked stage (test_secagg_device_refusals.py); a setting",
    "request-refused": "request numbers without a usable SecAgg+ grid (test_secagg_device_refusals.py)",
    "left": "after-exhaustion='leave' under SecAgg+: the visible departure the privacy model declares",
    "app-not-approved": "the device runtime, before any app code (tests/client/runtime/test_device_runtime.py)",
    # Each family of SecAgg+ check, played in a SecAgg+ round with fresh and spent devices alike:
    **{
        code: "tests/client/secagg/test_secagg_refusal_codes.py"
        for code in REFUSALS
        if code.startswith("secagg-") and code not in SCENARIOS
    },
}


def _reply(root: Path, code: str, *, spent: bool, shift: float) -> Message:
    settings, messages = SCENARIOS[code]
    settings = dict(settings)
    enrol = settings.pop("_enrol", True)
    if code == "device-settings":
        enrol = False  # invalid settings cannot be enrolled; the budget state is then moot
    ctx = _device(root, spent=spent, enrol=enrol, **settings)
    reply = None
    for msg in messages():
        reply = individual_filter_mod(msg, ctx, _handler(shift))
    assert reply is not None
    return reply


@pytest.mark.parametrize("code", sorted(SCENARIOS))
def test_each_refusal_depends_only_on_the_request_and_the_settings(tmp_path, code):
    a = _reply(tmp_path / "a", code, spent=False, shift=0.0)
    b = _reply(tmp_path / "b", code, spent=True, shift=5.0)
    assert a.has_error() and b.has_error(), code
    assert refusal_code(a.error.reason) == code, a.error.reason
    assert (a.error.code, a.error.reason) == (b.error.code, b.error.reason)
    assert not a.has_content() and not b.has_content()


def test_every_error_reply_of_the_mod_names_a_known_code_and_is_enumerated():
    codes, dynamic = set(), 0
    nodes = [node for path in MOD_SOURCES for node in ast.walk(ast.parse(path.read_text()))]
    for node in nodes:
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "refusal":
            arg = node.args[1]
            if isinstance(arg, ast.Constant):
                codes.add(arg.value)
            else:  # err.code of a RoundSpecError (set where it is raised), or a ledger failure's kind
                assert ast.unparse(arg) in ("err.code", "_ledger_code(err)"), ast.unparse(arg)
                dynamic += 1
    assert dynamic >= 1
    assert codes <= set(REFUSALS), codes - set(REFUSALS)
    assert set(REFUSALS) == set(SCENARIOS) | set(COVERED_ELSEWHERE)
    assert not set(SCENARIOS) & set(COVERED_ELSEWHERE)


def test_a_damaged_ledger_is_refused_alike_whatever_the_data_and_the_budget_spent(tmp_path):
    replies = []
    for root, spent, shift in ((tmp_path / "a", False, 0.0), (tmp_path / "b", True, 5.0)):
        ctx = _device(root, spent=spent)
        forget_all()  # a restarted device: the next message opens the ledger from its files
        (root / "ledger" / LEDGER_FILE).write_bytes(b"not a database" * 100)
        replies.append(individual_filter_mod(train_message(spec(1)), ctx, _handler(shift)))
    a, b = replies
    assert a.has_error() and refusal_code(a.error.reason) == "ledger-refused", a.error.reason
    assert (a.error.code, a.error.reason) == (b.error.code, b.error.reason)


def test_a_request_with_a_policy_breach_and_a_malformed_field_is_bad_request(tmp_path):
    ctx = _device(tmp_path, spent=False, **{"min-noise-multiplier": 2.0})
    reply = individual_filter_mod(train_message(spec(1, z=1.0, clip=-1.0)), ctx, _handler(0.0))
    assert refusal_code(reply.error.reason) == "bad-request"
    assert "noise_multiplier=1.0 is below" in reply.error.reason and "clip" in reply.error.reason


def test_the_unwrapped_strategys_refusal_says_which_fix_to_make(tmp_path):
    ctx = _device(tmp_path, spent=False)
    reply = individual_filter_mod(train_message(None), ctx, _handler(0.0))
    assert "IndividualFilterStrategy" in reply.error.reason
    assert "IndividualFilterStrategy" in REFUSALS["no-request"]


def test_the_request_record_is_what_the_device_reads(tmp_path):
    # Guard for the scenarios above: a well-formed request with the default settings is served.
    ctx = _device(tmp_path, spent=False)
    msg = train_message(None, request=request_record(spec(1)))
    assert REQUEST_RECORD in msg.content.config_records
    assert not individual_filter_mod(msg, ctx, _handler(0.0)).has_error()
    assert KEYS and SHAPES
