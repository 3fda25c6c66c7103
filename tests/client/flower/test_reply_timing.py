"""The reply hold (client/flower/reply_timing.py): when a reply leaves must not depend on data or budget.

Unit tests with a fake clock, the mod driven by hand-built Messages, and a short version of
benchmarks/reply_timing.py (30 replies per device through the built-in ClientApp).
"""

from __future__ import annotations

import logging
import math
import time

import numpy as np
import pytest
from flwr.app import ConfigRecord, Error, Message, RecordDict
from harness import reply_timing as bench
from helpers.mods import Handler, context, records, spec, train_message

from fedfilter.app.client_app import make_client_app
from fedfilter.client.filter_mod import individual_filter_mod
from fedfilter.client.flower.reply_timing import ReplyHold, held_deadline
from fedfilter.client.ledger.budget import BudgetLedger
from fedfilter.client.settings.node_config import DEFAULT_REPLY_HOLD_S, reply_hold_s


class FakeClock:
    def __init__(self, t: float = 100.0):
        self.t, self.slept = t, []

    def __call__(self) -> float:
        return self.t

    def sleep(self, s: float) -> None:
        self.slept.append(s)
        self.t += s


# --- the setting and the deadline ----------------------------------------------------------------
def test_reply_hold_is_on_by_default_and_parses_owner_values():
    assert reply_hold_s({}) == DEFAULT_REPLY_HOLD_S > 0
    assert reply_hold_s({"reply-hold-s": 0}) == 0.0
    assert reply_hold_s({"reply-hold-s": "2.5"}) == 2.5  # --node-config strings


@pytest.mark.parametrize("bad", [-1, math.nan, math.inf, "soon", True, 3601, None])
def test_a_bad_reply_hold_is_refused_naming_key_and_value(bad):
    with pytest.raises(ValueError) as err:
        reply_hold_s({"reply-hold-s": bad})
    assert "'reply-hold-s'" in str(err.value) and f"Found {bad!r}." in str(err.value)


def test_the_deadline_is_the_first_whole_multiple_of_the_hold_not_before_now():
    assert held_deadline(10.0, 10.0, 2.0) == 12.0  # at least one period, even with no work
    assert held_deadline(10.0, 11.9, 2.0) == 12.0
    assert held_deadline(10.0, 12.0, 2.0) == 12.0
    assert held_deadline(10.0, 12.1, 2.0) == 14.0  # an overrun waits for the next multiple
    assert held_deadline(10.0, 17.0, 2.0) == 18.0


def test_an_unarmed_hold_returns_the_reply_itself_without_sleeping():
    clock = FakeClock()
    hold = ReplyHold(clock=clock, sleep=clock.sleep)
    request = train_message(spec())
    reply = Message(RecordDict(), reply_to=request)
    assert hold.reply(reply, request) is reply and clock.slept == []
    hold.arm(0.0)  # reply-hold-s = 0: off
    assert hold.reply(reply, request) is reply and clock.slept == []


def test_an_armed_hold_sleeps_to_the_deadline_then_rebuilds_content_and_errors():
    clock = FakeClock(100.0)
    hold = ReplyHold(clock=clock, sleep=clock.sleep)
    hold.arm(5.0)
    clock.t += 1.25  # the round's work
    request = train_message(spec())
    content = RecordDict({"fedfilter.status": ConfigRecord({"status": "report"})})
    reply = hold.reply(Message(content, reply_to=request), request)
    assert clock.t == 105.0 and sum(clock.slept) == pytest.approx(3.75)
    assert reply.content is content and reply.metadata.reply_to_message_id == request.metadata.message_id
    error = hold.reply(Message(Error(code=6, reason="x"), reply_to=request), request)
    assert error.has_error() and error.error.reason == "x"
    assert clock.t == 105.0  # already at the deadline: no further wait
    clock.t += 0.5
    hold.reply(Message(content, reply_to=request), request)
    assert clock.t == 110.0  # past it: the next whole multiple


# --- through the mod -------------------------------------------------------------------------------
class SlowHandler(Handler):
    """The inner handler, taking ``seconds`` and noting when its own reply was built."""

    def __init__(self, seconds: float, **kw):
        super().__init__(**kw)
        self.seconds, self.built = seconds, []

    def __call__(self, msg, ctx):
        time.sleep(self.seconds)
        out = super().__call__(msg, ctx)
        self.built.append(out.metadata.created_at)
        return out


HOLD = 0.3


def _timed(msg, ctx, handler):
    sent, started = time.time(), time.monotonic()
    reply = individual_filter_mod(msg, ctx, handler)
    return reply, time.monotonic() - started, sent


def test_a_report_is_held_and_its_metadata_stamped_after_the_hold(tmp_path):
    handler = SlowHandler(0.02)
    reply, elapsed, sent = _timed(train_message(spec(1)), context(tmp_path, **{"reply-hold-s": HOLD}), handler)
    assert not reply.has_error()
    assert HOLD <= elapsed < 2 * HOLD
    assert reply.metadata.created_at >= sent + HOLD  # built after the hold, not when training ended
    assert reply.metadata.created_at > handler.built[0]
    assert reply.metadata.ttl <= 3600.0 - HOLD  # Flower's ttl counts down from the request's: also held
    assert [r.status for r in records(tmp_path)[0]] == ["contributed"]


def test_a_round_that_overruns_the_hold_replies_at_the_next_multiple_and_warns(tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="fedfilter.client"):
        reply, elapsed, _ = _timed(
            train_message(spec(1)), context(tmp_path, **{"reply-hold-s": 0.1}), SlowHandler(0.13)
        )
    assert not reply.has_error()
    assert 0.2 <= elapsed < 0.4
    assert "longer than reply-hold-s=0.1" in caplog.text


def test_a_left_marker_is_held_like_a_report(tmp_path):
    ctx = context(tmp_path, **{"reply-hold-s": HOLD, "after-exhaustion": "leave", "budget-epsilon": 0.5})
    individual_filter_mod(train_message(spec(1, z=0.5)), ctx, Handler())  # a full round spends it all
    reply, elapsed, sent = _timed(train_message(spec(2, z=0.5)), ctx, Handler())
    assert dict(reply.content["fedfilter.status"]) == {"status": "left"}
    assert elapsed >= HOLD and reply.metadata.created_at >= sent + HOLD


def test_a_replay_refusal_is_held_like_a_report(tmp_path):
    # Whether a round was answered before is read from the ledger: its refusal waits too.
    ctx = context(tmp_path, **{"reply-hold-s": HOLD})
    individual_filter_mod(train_message(spec(1)), ctx, Handler())
    reply, elapsed, sent = _timed(train_message(spec(1)), ctx, Handler())
    assert reply.has_error() and "already answered" in reply.error.reason
    assert elapsed >= HOLD and reply.metadata.created_at >= sent + HOLD


def test_refusals_of_the_request_or_the_settings_are_answered_at_once(tmp_path, caplog):
    # They depend only on the request and the owner's settings, never on the ledger or the data.
    handler = Handler()
    reply, elapsed, _ = _timed(train_message(spec(1, z=0.01)), context(tmp_path, **{"reply-hold-s": 30}), handler)
    assert reply.has_error() and "noise_multiplier" in reply.error.reason and elapsed < 5
    with caplog.at_level(logging.ERROR, logger="fedfilter.client"):
        reply, elapsed, _ = _timed(train_message(spec(1)), context(tmp_path, **{"reply-hold-s": -3}), handler)
    assert reply.has_error() and elapsed < 5
    assert "'reply-hold-s'" in caplog.text and "Found -3" in caplog.text
    assert handler.calls == 0 and records(tmp_path)[0] == []  # nothing trained, nothing spent


def test_an_exception_after_the_ledger_is_held_before_it_propagates(tmp_path, monkeypatch):
    def broken(*args, **kwargs):  # the ledger fails in a way the mod does not answer itself
        raise RuntimeError("disk on fire")

    monkeypatch.setattr(BudgetLedger, "has_release", broken)
    started = time.monotonic()
    with pytest.raises(RuntimeError, match="disk on fire"):
        individual_filter_mod(train_message(spec(1)), context(tmp_path, **{"reply-hold-s": HOLD}), Handler())
    assert time.monotonic() - started >= HOLD


# --- the benchmark, short -------------------------------------------------------------------------
def test_best_threshold_accuracy_matches_a_one_cut_at_a_time_reference():
    rng = np.random.default_rng(1)
    for _ in range(30):
        a, b = rng.integers(0, 6, size=rng.integers(1, 12)), rng.integers(2, 8, size=rng.integers(1, 12))
        pooled = np.concatenate([a, b])
        naive = max(a.size, b.size) / pooled.size
        for t in np.unique(pooled):
            right = np.sum(a <= t) + np.sum(b > t)
            naive = max(naive, right / pooled.size, (pooled.size - right) / pooled.size)
        assert bench.best_threshold_accuracy(a, b)[0] == pytest.approx(naive)
    assert bench.best_threshold_accuracy([1, 2, 3], [4, 5, 6]) == (1.0, 3.0)


@pytest.mark.timeout(120)
def test_short_benchmark_held_replies_show_no_difference_unheld_ones_leak_the_data_size(tmp_path):
    pytest.importorskip("torch")
    pytest.importorskip("scipy")
    (off,) = bench.measure(make_client_app(), 30, [0.0], local_epochs=5, root=tmp_path)["phases"]
    # The hold must cover a round. A round that overruns it replies at the next multiple and shows
    # its lateness (documented); on a loaded machine a fixed 0.05 s does not cover one, so the hold
    # is set well above the unheld rounds just measured: three times their 90th percentile, not
    # their maximum, because one stalled round (a ledger fsync behind the other test worker's disk
    # writes) would otherwise set a hold that 90 held replies multiply past the time limit.
    unheld = np.concatenate([samples["times"] for samples in off["samples"].values()])
    hold = max(0.05, 3 * float(np.quantile(unheld, 0.9)))
    (on,) = bench.measure(make_client_app(), 30, [hold], local_epochs=5, root=tmp_path)["phases"]

    # Without the hold, 65 vs 203 examples (x 5 epochs) shows in both observables: the harness
    # can see a leak. (Budget state is not asserted: whether the noise-only path is slower depends
    # on the filter's allowance, which is being made constant-work.)
    for row in off["rows"]:
        if row["comparison"] == "data size":
            assert row["p"] < 0.01, row
    # With it: every reply took at least the hold, and 30 replies each show nothing. The bounds
    # are looser than the benchmark's (p > 0.01, < 60 % at 200 replies) so that chance alone
    # fails this test only a few times in a thousand runs.
    for samples in on["samples"].values():
        assert min(samples["times"]) >= hold and min(samples["created"]) >= hold
    for row in on["rows"]:
        assert row["p"] > 1e-3 and row["accuracy"] < 0.8, row


# --- simulations and the local deployment say that the hold is off -------------------------------
def test_demo_and_deploy_local_set_the_hold_explicitly_and_say_when_it_is_off(tmp_path):
    from fedfilter.cli.demo import device_configs
    from fedfilter.client.flower.reply_timing import timing_protection
    from fedfilter.deploy.command import DeployOptions, device_node_config

    demo = device_configs(tmp_path, [1.0, 2.0], after_exhaustion="noise-only")
    assert [d["reply-hold-s"] for d in demo.values()] == [0.0, 0.0]
    assert device_node_config(0, DeployOptions(clients=1), tmp_path)["reply-hold-s"] == 0.0
    assert device_node_config(0, DeployOptions(clients=1, reply_hold_s=20.0), tmp_path)["reply-hold-s"] == 20.0
    assert timing_protection(0.0).startswith("off") and "reveal" in timing_protection(0.0)
    assert timing_protection(20.0).startswith("on") and "20 s" in timing_protection(20.0)
