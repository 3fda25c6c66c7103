"""The filter applied twice filters once, and says so within seconds rather than hanging.

``individual_filter_mod`` holds its device's ledger lock (``client/flower/ledger_cache.py``, not
re-entrant) while the inner handler trains. A second copy of the mod inside the first would wait for
that lock forever: ``once_per_message`` (``client/flower/mod_once.py``) passes such copies through, and
the mod's body passes through a copy that got past it (``__wrapped__``). Every case here must give the
reply of a device filtered once, bit for bit under the same owner's noise seed, with one spend; each
test has a timeout, so a regression that makes the mod wait on its own lock fails in seconds instead of
hanging the suite.
"""

from __future__ import annotations

import pytest
from flwr.clientapp import ClientApp
from helpers.mods import Handler, context, records, spec, train_message

from fedfilter.client.filter_mod import individual_filter_mod
from fedfilter.protocol.wire import ARRAYS_RECORD, STATUS_RECORD

SEED = {"noise-seed": 3}
TIMEOUT_S = 20  # a filtered round here takes well under a second


def app(mods) -> ClientApp:
    client_app = ClientApp(mods=mods)
    client_app.train()(Handler())
    return client_app


def wrapped_twice(name):
    """The ways a ClientApp can end up with the filter twice around its training."""
    if name == "listed twice":
        return app([individual_filter_mod, individual_filter_mod])
    inner = app([individual_filter_mod])  # an app already wrapped ...
    if name == "around a wrapped app":
        return lambda msg, ctx: individual_filter_mod(msg, ctx, inner)  # ... wrapped again
    if name == "past once_per_message":
        return lambda msg, ctx: individual_filter_mod.__wrapped__(msg, ctx, inner)  # type: ignore[attr-defined]
    raise ValueError(f"unknown case {name!r}")


def assert_filtered_once(tmp_path, handle) -> None:
    reference = app([individual_filter_mod])
    for round_id in (1, 2):
        want = reference(train_message(spec(round_id)), context(tmp_path / "once", **SEED))
        got = handle(train_message(spec(round_id)), context(tmp_path / "twice", **SEED))
        assert not got.has_error(), got.error.reason
        assert set(got.content.keys()) == {ARRAYS_RECORD, STATUS_RECORD}
        for key in want.content[ARRAYS_RECORD].keys():
            assert (
                got.content[ARRAYS_RECORD][key].numpy().tobytes() == want.content[ARRAYS_RECORD][key].numpy().tobytes()
            )
    twice, once = records(tmp_path / "twice"), records(tmp_path / "once")
    assert len(twice[0]) == len(once[0]) == 2  # one spend per round
    assert twice[1] == pytest.approx(once[1], rel=1e-12)


@pytest.mark.timeout(TIMEOUT_S, method="thread")  # a thread: a wait on a lock may not be interruptible
@pytest.mark.parametrize("name", ["listed twice", "around a wrapped app", "past once_per_message"])
def test_the_filter_applied_twice_filters_once(tmp_path, name):
    assert_filtered_once(tmp_path, wrapped_twice(name))
