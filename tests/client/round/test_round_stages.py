"""The device's round as stages under one placement, chosen once, that only ``secure_aggregation_mod`` installs.

``individual_filter_mod`` reads the placement once at its entry (``client/round/placement.py``) and hands
that one object to every stage: admit, train, release, reply (``client/round/run.py``). A local round and
a masked SecAgg+ round go through the same sequence; only the object differs. The SecAgg+ placement lives
in a process-local ContextVar that ``secure_aggregation_mod`` alone sets: whatever records a coordinator
adds to a train message, a device without that mod in front refuses it or serves it as a local round,
exactly as it would a message without them.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from flwr.app import ConfigRecord, Context
from flwr.common.secure_aggregation.secaggplus_constants import RECORD_KEY_CONFIGS, RECORD_KEY_STATE, Key, Stage
from helpers.mods import Handler, context, records, spec, train_message
from helpers.secagg import run_round

import fedfilter.client.filter_mod as filter_mod
import fedfilter.client.round.run as run
from fedfilter.client.filter_mod import individual_filter_mod
from fedfilter.client.round.placement import LocalPlacement
from fedfilter.client.secagg.masked_round import SecAggPlacement, reply_masked
from fedfilter.protocol.refusals import refusal_code
from fedfilter.protocol.wire import ARRAYS_RECORD, CONSISTENCY_RECORD, STATUS_RECORD

FEDFILTER = Path(__file__).resolve().parents[3] / "fedfilter"
STAGES = ["admit", "train", "release", "reply"]


@pytest.fixture
def stage_log(monkeypatch) -> list[tuple]:
    """(stage, the placement object it was handed) for every stage call, and ("entry", placement) for
    every read of the installed placement by the filter mod."""
    log: list[tuple] = []

    def chosen():
        placement = real_installed()
        log.append(("entry", placement))
        return placement

    real_installed = filter_mod.installed_placement
    monkeypatch.setattr(filter_mod, "installed_placement", chosen)
    real_admit, real_train, real_release = run.admit, run.train, run.release_update

    def admit(msg, ctx, placement):
        log.append(("admit", placement))
        return real_admit(msg, ctx, placement)

    def train(call_next, msg, ctx, admitted):
        log.append(("train", None))
        return real_train(call_next, msg, ctx, admitted)

    def release_update(ledger, admitted, placement, update):
        log.append(("release", placement))
        return real_release(ledger, admitted, placement, update)

    monkeypatch.setattr(run, "admit", admit)
    monkeypatch.setattr(run, "train", train)
    monkeypatch.setattr(run, "release_update", release_update)
    for cls in (LocalPlacement, SecAggPlacement):
        real_reply = cls.reply

        def reply(self, msg, admitted, release, __real=real_reply):
            log.append(("reply", self))
            return __real(self, msg, admitted, release)

        monkeypatch.setattr(cls, "reply", reply)
    return log


def rounds(log: list[tuple]) -> list[list[tuple]]:
    """The log cut at each entry of the filter mod."""
    out: list[list[tuple]] = []
    for item in log:
        if item[0] == "entry":
            out.append([])
        out[-1].append(item)
    return out


def assert_stages(one_round: list[tuple], kind: type) -> None:
    (_, chosen), *stages = one_round
    assert isinstance(chosen, kind)
    assert [name for name, _ in stages] == STAGES
    assert all(placement is chosen for name, placement in stages if name != "train")  # the one object


def test_a_local_and_a_masked_round_go_through_the_same_stages_with_the_placement_chosen_once(
    tmp_path, monkeypatch, stage_log
):
    reply = individual_filter_mod(train_message(spec(1)), context(tmp_path / "local"), Handler())
    assert not reply.has_error() and set(reply.content.keys()) == {ARRAYS_RECORD, STATUS_RECORD}
    (local,) = rounds(stage_log)
    assert_stages(local, LocalPlacement)

    stage_log.clear()
    n = 4
    result = run_round(tmp_path / "masked", monkeypatch, n, threshold=3)
    assert result.strategy.aggregated and len(result.strategy.results) == n
    masked = rounds(stage_log)
    assert len(masked) == n  # the filter ran once per device, in the masked stage only
    for one_round in masked:
        assert_stages(one_round, SecAggPlacement)
    assert len({id(r[0][1]) for r in masked}) == n  # each masked stage built its own placement
    assert not reply_masked()  # and it is gone once the stage is over


def test_a_refused_round_stops_after_admission_under_either_placement(tmp_path, stage_log):
    reply = individual_filter_mod(
        train_message(spec(1, z=0.1)), context(tmp_path, **{"min-noise-multiplier": 0.5}), Handler()
    )
    assert refusal_code(reply.error.reason) == "noise-below-minimum"
    (one,) = rounds(stage_log)
    assert [name for name, _ in one] == ["entry", "admit"]


# --- a message that merely claims SecAgg+ ----------------------------------------------------------------


def _secagg_state() -> ConfigRecord:
    """A SecAgg+ setup as secaggplus_mod would save it, sound by the device's rule."""
    return ConfigRecord(
        {
            "current_stage": Stage.SHARE_KEYS,
            "nid": 42,
            "sample_num": 4,
            "share_num": 4,
            "threshold": 3,
            "clipping_range": 2.0**28,
            "target_range": 2**29,
            "mod_range": 2**32,
            "max_weight": 1.0,
        }
    )


def _claims(msg):
    """Every record a coordinator could add to say "this round is masked" (SecAgg+'s own configs aside)."""
    msg.content[RECORD_KEY_STATE] = _secagg_state()
    msg.content[CONSISTENCY_RECORD] = ConfigRecord({"dst": [1, 2], "sealed": [b"x", b"y"]})
    msg.content["fedfilter.placement"] = ConfigRecord({"placement": "secagg", "masked": True})
    return msg


def _ctx_after_a_secagg_round(tmp_path, **node) -> Context:
    """A device whose context holds SecAgg+ state, as a masked round earlier in the run would leave it."""
    ctx = context(tmp_path, **node)
    ctx.state[RECORD_KEY_STATE] = _secagg_state()
    return ctx


@pytest.mark.parametrize("with_state", [False, True])
def test_secaggs_configs_without_the_secagg_mod_in_front_are_refused_as_today(tmp_path, with_state):
    msg = _claims(train_message(spec(1, placement="distributed", m=3)))
    msg.content[RECORD_KEY_CONFIGS] = ConfigRecord({Key.STAGE: Stage.COLLECT_MASKED_VECTORS})
    ctx = _ctx_after_a_secagg_round(tmp_path) if with_state else context(tmp_path)
    handler = Handler()
    reply = individual_filter_mod(msg, ctx, handler)
    assert reply.has_error() and refusal_code(reply.error.reason) == "secagg-mod-order", reply.error.reason
    assert handler.calls == 0 and records(tmp_path)[0] == []


@pytest.mark.parametrize("with_state", [False, True])
def test_a_distributed_request_claiming_secagg_without_the_mod_is_refused_as_today(tmp_path, with_state):
    plain = individual_filter_mod(
        train_message(spec(1, placement="distributed", m=3)), context(tmp_path / "plain"), Handler()
    )
    msg = _claims(train_message(spec(1, placement="distributed", m=3)))
    ctx = _ctx_after_a_secagg_round(tmp_path) if with_state else context(tmp_path)
    handler = Handler()
    reply = individual_filter_mod(msg, ctx, handler)
    assert reply.has_error() and refusal_code(reply.error.reason) == "needs-secure-aggregation"
    assert reply.error.reason == plain.error.reason  # word for word what a message without the claims gets
    assert handler.calls == 0 and records(tmp_path)[0] == []


def test_a_local_request_claiming_secagg_without_the_mod_is_served_as_a_local_round(tmp_path):
    seen = []

    def handler(msg, ctx):
        seen.append(reply_masked())
        return Handler()(msg, ctx)

    seeded = {"noise-seed": 11}
    msg = _claims(train_message(spec(1)))
    reply = individual_filter_mod(msg, _ctx_after_a_secagg_round(tmp_path / "claims", **seeded), handler)
    plain = individual_filter_mod(train_message(spec(1)), context(tmp_path / "plain", **seeded), Handler())
    assert seen == [False]
    assert not reply.has_error() and set(reply.content.keys()) == {ARRAYS_RECORD, STATUS_RECORD}
    for key in plain.content[ARRAYS_RECORD].keys():  # bit for bit the plain local round's reply
        assert (
            reply.content[ARRAYS_RECORD][key].numpy().tobytes() == plain.content[ARRAYS_RECORD][key].numpy().tobytes()
        )
    assert [r.placement for r in records(tmp_path / "claims")[0]] == ["local"]


# --- who may install a placement -----------------------------------------------------------------------


def _calls_and_names(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names = {node.id for node in ast.walk(tree) if isinstance(node, ast.Name)}
    names |= {node.attr for node in ast.walk(tree) if isinstance(node, ast.Attribute)}
    return names


def test_only_secure_aggregation_mod_installs_a_placement():
    users = {
        path.relative_to(FEDFILTER).as_posix()
        for path in FEDFILTER.rglob("*.py")
        if "install_placement" in _calls_and_names(path)
    }
    assert users == {"client/secagg/mod.py"}  # its definition (placement.py) names it only as a def
    holders = {p.relative_to(FEDFILTER).as_posix() for p in FEDFILTER.rglob("*.py") if "_INSTALLED" in p.read_text()}
    assert holders == {"client/round/placement.py"}


def test_the_two_mods_call_nothing_of_each_other():
    def imports(path: Path) -> set[str]:
        tree = ast.parse(path.read_text(encoding="utf-8"))
        out = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
        return out | {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module}

    client = FEDFILTER / "client"
    filter_side = imports(client / "filter_mod.py").union(*(imports(p) for p in (client / "round").glob("*.py")))
    assert not {m for m in filter_side if m.startswith("fedfilter.client.secagg")}, filter_side
    secagg_side = set().union(*(imports(p) for p in (client / "secagg").glob("*.py")))
    assert not {m for m in secagg_side if m.startswith("fedfilter.client.filter_mod")}, secagg_side
