"""Clear error replies, nothing spent.

A model with no floating-point values (only integer, bool or complex arrays, or none) and a ledger
directory that is missing or read-only each get an error reply from the mod that names the cause,
and a clear error from the core; nothing is trained, spent or released. The reply names the kind of
failure only: the same words whatever the device's budget state (what a reply shows depends on nothing private).
"""

import ctypes
import os
from contextlib import contextmanager

import numpy as np
import pytest
from flwr.app import ArrayRecord, RecordDict
from helpers.ledger import restart_device
from helpers.mods import Handler, context, spec, train_message

from fedfilter.client.filter_mod import individual_filter_mod
from fedfilter.client.ledger.budget import BudgetLedger
from fedfilter.client.ledger.schema import LEDGER_FILE
from fedfilter.client.ledger.storage import LedgerWriteError
from fedfilter.client.release import FilteredClient
from fedfilter.protocol.request import RoundSpec
from fedfilter.protocol.wire import REQUEST_RECORD, request_record


def spends(ledger_dir) -> int:
    ledger = BudgetLedger.open(ledger_dir)
    try:
        return len(ledger.records())
    finally:
        ledger.close()


# --- a model with nothing to release ------------------------------------------------------------
NO_FLOATS = {
    "int64": [np.ones((40, 50), np.int64), np.ones(50, np.int64)],
    "bool": [np.ones((40, 50), bool), np.zeros(50, bool)],
    "complex64": [np.ones((40, 50), np.complex64), np.ones(50, np.complex64)],
    "empty float": [np.ones((0, 50), np.float32), np.ones(0, np.float32)],
}


@pytest.mark.parametrize("kind", list(NO_FLOATS))
def test_a_model_with_no_floating_point_values_is_refused_by_name(tmp_path, kind):
    ctx = context(tmp_path)
    handler = Handler()
    reply = individual_filter_mod(train_message(spec(1), arrays=NO_FLOATS[kind]), ctx, handler)
    assert reply.has_error() and "no floating-point values" in reply.error.reason
    assert "Nothing was trained, spent or released" in reply.error.reason
    assert handler.calls == 0 and spends(tmp_path / "ledger") == 0


def test_a_model_without_arrays_is_refused_by_name(tmp_path):
    ctx = context(tmp_path)
    msg = train_message(spec(1))
    msg.content = RecordDict({"arrays": ArrayRecord(), REQUEST_RECORD: request_record(spec(1))})
    handler = Handler()
    reply = individual_filter_mod(msg, ctx, handler)
    assert reply.has_error() and "no floating-point values" in reply.error.reason and "0 array(s)" in reply.error.reason
    assert handler.calls == 0 and spends(tmp_path / "ledger") == 0


def test_the_refusal_of_a_model_does_not_depend_on_the_budget(tmp_path):
    fresh, spent = context(tmp_path / "a"), context(tmp_path / "b", **{"budget-epsilon": 0.05})
    for r in range(1, 4):  # the second device spends its whole budget
        individual_filter_mod(train_message(spec(r), message_id=f"s{r}"), spent, Handler())
    reasons = {
        individual_filter_mod(train_message(spec(9), arrays=NO_FLOATS["int64"]), ctx, Handler()).error.reason
        for ctx in (fresh, spent)
    }
    assert len(reasons) == 1


def test_the_core_refuses_an_update_with_nothing_to_release(tmp_path):
    ledger = BudgetLedger.enrol(tmp_path, client_id="d", epsilon=4.0, delta=1e-5)
    client = FilteredClient(ledger)
    for update in ([], [np.ones(0, np.float32)]):
        with pytest.raises(ValueError, match="at least one floating-point value.*nothing was spent"):
            client.release(RoundSpec("r", 0, 1.0, 1.0), update)
    assert ledger.records() == []
    ledger.close()


# --- a ledger directory that is missing or read-only -------------------------------------------
def test_a_missing_ledger_directory_is_refused_by_name(tmp_path):
    ctx = context(tmp_path, enrol=False, **{"ledger-dir": str(tmp_path / "nowhere")})
    handler = Handler()
    reply = individual_filter_mod(train_message(spec(1)), ctx, handler)
    assert reply.has_error() and "no budget ledger at its ledger-dir" in reply.error.reason
    assert "nothing was trained, spent or released" in reply.error.reason
    assert str(tmp_path) not in reply.error.reason  # the device's paths stay on the device
    assert handler.calls == 0 and not (tmp_path / "nowhere").exists()


_CAP_DAC = (1 << 1) | (1 << 2) | (1 << 3)  # CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH, CAP_FOWNER


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


@contextmanager
def _without_root_file_access():
    """As root, file permissions are not checked: drop that power from this thread's effective
    capabilities (Linux capabilities are per thread; SQLite runs in the calling thread), then restore."""
    if os.geteuid() != 0:
        yield
        return
    libc = ctypes.CDLL(None, use_errno=True)
    header, data = _CapHeader(0x20080522, 0), (_CapData * 2)()  # _LINUX_CAPABILITY_VERSION_3
    if libc.capget(ctypes.byref(header), data) != 0:
        pytest.skip("capget failed: cannot drop root's file access in this environment")
    saved = data[0].effective
    data[0].effective = saved & ~_CAP_DAC
    if libc.capset(ctypes.byref(header), data) != 0:
        pytest.skip("capset failed: cannot drop root's file access in this environment")
    try:
        yield
    finally:
        data[0].effective = saved
        assert libc.capset(ctypes.byref(header), data) == 0


@contextmanager
def read_only(directory):
    """The ledger directory and its files read-only, as on a read-only mount."""
    paths = [directory, *directory.iterdir()]
    modes = {p: p.stat().st_mode for p in paths}
    for p in paths:
        p.chmod(0o555 if p.is_dir() else 0o444)
    try:
        with _without_root_file_access():
            yield
    finally:
        for p, mode in modes.items():
            p.chmod(mode)


@pytest.mark.parametrize("cached", [False, True], ids=["opened-read-only", "made-read-only-while-open"])
def test_a_read_only_ledger_directory_is_refused_by_name_and_nothing_is_spent(tmp_path, cached):
    restart_device()
    ctx = context(tmp_path)
    individual_filter_mod(train_message(spec(1), message_id="first"), ctx, Handler())
    if not cached:
        restart_device()  # closing the last connection removes the -wal and -shm files
    with read_only(tmp_path / "ledger"):
        reply = individual_filter_mod(train_message(spec(2), message_id="second"), ctx, Handler())
    assert reply.has_error() and "cannot be written (read-only, full or failing disk)" in reply.error.reason
    assert "nothing was" in reply.error.reason and str(tmp_path) not in reply.error.reason
    restart_device()
    assert spends(tmp_path / "ledger") == (2 if cached else 1)  # a committed spend is wasted, never released
    if cached:  # the spend was committed before the seal could be written: the mod released nothing
        assert not reply.has_content()


def test_the_core_reports_a_read_only_ledger_directory_as_read_only(tmp_path):
    BudgetLedger.enrol(tmp_path / "ledger", client_id="d", epsilon=4.0, delta=1e-5).close()
    assert not (tmp_path / "ledger" / (LEDGER_FILE + "-wal")).exists()
    with read_only(tmp_path / "ledger"), pytest.raises(LedgerWriteError, match="read-only") as err:
        BudgetLedger.open(tmp_path / "ledger")
    assert str(tmp_path / "ledger") in str(err.value)


def test_a_read_only_refusal_does_not_depend_on_the_budget(tmp_path):
    reasons = set()
    for name, epsilon in (("a", 4.0), ("b", 0.05)):
        restart_device()
        ctx = context(tmp_path / name, **{"budget-epsilon": epsilon})
        for r in range(1, 4):
            individual_filter_mod(train_message(spec(r), message_id=f"{name}{r}"), ctx, Handler())
        restart_device()
        with read_only(tmp_path / name / "ledger"):
            reasons.add(individual_filter_mod(train_message(spec(9), message_id="late"), ctx, Handler()).error.reason)
    assert len(reasons) == 1
