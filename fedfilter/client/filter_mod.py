"""A Flower mod that puts a device's individual, lifelong privacy filter around any ClientApp.

Usage::

    from flwr.clientapp import ClientApp
    from fedfilter.client.filter_mod import individual_filter_mod

    app = ClientApp(mods=[individual_filter_mod])

What the mod does with each message (DESIGN.md sections 1 and 2):

* **train** (``"train"`` and ``"train.<action>"``): reads the coordinator's round request from the
  ``ConfigRecord`` ``"fedfilter.request"`` (``run-id``, ``round-id``, ``noise-multiplier``,
  ``clip``, ``placement``, ``min-reports``) and the device's own settings from
  ``context.node_config`` only (``NODE_CONFIG_KEYS``; the coordinator cannot set them). A request
  that breaks the device's policy, a model with no floating-point values (only integer, bool or
  complex arrays, or none), or a round already released, is answered with an error ``Message``
  that names the field and value; nothing is trained, spent or released. A ledger the device
  cannot use (missing, refused until its owner acts, not writable) is answered with an error that
  names that kind only (``LedgerError.public``), never its spends or budget. Otherwise the
  inner handler always runs (so a client with no budget left is not faster than one with budget),
  the update ``returned - received`` goes through ``fedfilter.client.release.release`` (clip to the
  allowance, durable spend, then noise), and the reply carries exactly:

  - ``"arrays"``: an ``ArrayRecord`` with the noisy *update* (same keys and shapes as the model
    received; floating-point arrays in float32 whatever the model's dtype, ``fedfilter.client.mechanisms.gaussian``),
    and ``"fedfilter.status"``: ``ConfigRecord({"status": "report"})``, for a
    client that contributed and for one that sends pure noise alike; or
  - only ``"fedfilter.status"``: ``ConfigRecord({"status": "left"})`` for a client in ``leave``
    mode whose budget is spent (no ``ArrayRecord`` at all).

  Every metric and config the inner handler returned is dropped: example counts and training
  metrics depend on private data and carry no noise. Local bookkeeping (status, spend) stays in
  the device's ledger.

  Anything that goes wrong *after* an accepted request (the inner handler raises or answers with
  an error, returns arrays of the wrong shape, or an update holding NaN or inf) would otherwise
  show up as an un-noised, data-dependent signal. Instead the update is taken to be zero: the
  reply is pure noise (which costs nothing), and the cause is logged on the device only.

  Timing: once a round reaches the ledger, every reply (report, marker, replay refusal, error) is
  held until arrival + a whole multiple of the owner's ``reply-hold-s`` and only then built, so its
  arrival, ``created_at`` and ``ttl`` do not depend on the data or the budget
  (``client/flower/reply_timing.py``). Refusals before that depend only on the request and the settings,
  and are answered at once.
  **Under SecAgg+** (``ClientApp(mods=[secure_aggregation_mod, individual_filter_mod])``,
  ``client/secagg/mod.py``): in the stage where Flower's ``secaggplus_mod`` masks this mod's reply,
  and only there, the request must be ``distributed`` (``local`` is refused; without that mod
  ``distributed`` is refused, whatever the node config), the coordinator's SecAgg+ setup must pass
  ``grid.check_secagg_state`` and the device's filter must be ``rdp``: else the error names the
  field and value and nothing is trained, spent or released. The release is Skellam noise on SecAgg+'s
  integer grid (``client/mechanisms/skellam.py``), and the reply is the legacy layout
  ``secaggplus_mod`` reads: the encoded report (masked by the mod), ``num_examples = 1``, no metric,
  status OK. A ``leave`` device whose budget is spent answers with an error and drops out of the
  round. The reply hold applies as above.
* **evaluate**: refused with an error ``Message``. Loss and accuracy on a client's private data
  are data-dependent releases that carry no noise and are not accounted by the filter, with or
  without ``num-examples``; the coordinator evaluates on held-out data instead.
* anything else (``query``, system messages) passes through untouched: a ClientApp that answers
  queries with private data is outside what this mod protects.

Device settings (``context.node_config``; in the Deployment Engine from
``flower-supernode --node-config "ledger-dir='/var/lib/fedfilter' budget-epsilon=8.0 ..."``):
``fedfilter.client.settings.node_config`` lists the keys (``NODE_CONFIG_KEYS``), their defaults and meaning.

In the Simulation Engine every node's ``node_config`` holds only ``partition-id`` and
``num-partitions``. A node without its own ``ledger-dir`` then takes its entry (by partition-id)
of the device-settings file named by ``FEDFILTER_DEVICE_SETTINGS`` on the machine that runs the
simulation (``client/settings/simulated.py``; used by ``flwr run``), or, in-process,
``simulated_device_config_mod`` stands in for ``--node-config``.
"""

from __future__ import annotations

import logging
import sqlite3
from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Context, Error, Message, RecordDict

from fedfilter.client.flower.ledger_cache import cached_ledger, forget_ledger
from fedfilter.client.flower.mod_once import once_per_message
from fedfilter.client.flower.npy_codec import decode, encode
from fedfilter.client.flower.reply_timing import ReplyHold
from fedfilter.client.ledger.budget import BudgetLedger
from fedfilter.client.ledger.storage import (
    LedgerError,
    LedgerMissingError,
    LedgerUnavailableError,
    ReplayError,
    storage_error,
)
from fedfilter.client.ledger.worst_case import WorstCaseMissingError, require_worst_case
from fedfilter.client.mechanisms.gaussian import (
    GaussianMechanism,
    NonFiniteUpdateError,
    as_float_arrays,
    floating_indices,
)
from fedfilter.client.mechanisms.skellam import SkellamGrid, SkellamMechanism
from fedfilter.client.release import Release, noise_stream, release
from fedfilter.client.secagg.masked_round import masked_report_content, reply_masked, secagg_round_grid
from fedfilter.client.settings.errors import DeviceSettingsError
from fedfilter.client.settings.node_config import (
    DeviceConfig,
    EnrolmentMismatch,
    device_config,
    reply_hold_s,
)
from fedfilter.client.settings.policy import check_request
from fedfilter.client.settings.simulated import with_device_settings
from fedfilter.protocol.flower_api import RECORD_KEY_CONFIGS, ErrorCode
from fedfilter.protocol.refusals import refusal_reason
from fedfilter.protocol.request import RoundSpec, RoundSpecError
from fedfilter.protocol.wire import (
    ARRAYS_RECORD,
    REQUEST_RECORD,
    STATUS_LEFT,
    STATUS_RECORD,
    STATUS_REPORT,
    round_spec_from_record,
)

__all__ = ["individual_filter_mod"]

log = logging.getLogger("fedfilter.client")

RUN_BINDING = "fedfilter.run"  # context.state: the request run-id this Flower run is bound to

# Set while this mod's body handles a message: a copy nested past once_per_message (``__wrapped__``) passes
# through instead of waiting forever on the ledger lock the outer copy holds (flower/ledger_cache.py).
_FILTERING: ContextVar[bool] = ContextVar("fedfilter_filtering", default=False)

# Errors the mod answers with. Both are Flower's MOD_FAILED_PRECONDITION (6); the reason says more.
ERROR_CODE = ErrorCode.MOD_FAILED_PRECONDITION


# --- helpers ---------------------------------------------------------------------------------
def _category(msg: Message) -> str:
    return msg.metadata.message_type.split(".", 1)[0]


def _error(msg: Message, code: str, text: str) -> Message:
    """An error reply whose reason is ``fedfilter[<code>]: <text>`` (``protocol/refusals.py``)."""
    reason = refusal_reason(code, text)
    log.warning("fedfilter mod: %s", reason)
    return Message(Error(code=ERROR_CODE, reason=reason), reply_to=msg)


def _bind_run(context: Context, spec: RoundSpec) -> str | None:
    """Keep one request run-id per Flower run, so a coordinator cannot dodge the run quota.

    ``context.state`` lives exactly as long as the Flower run on this node (both engines).
    """
    bound = context.state.config_records.get(RUN_BINDING)
    if bound is None:
        context.state[RUN_BINDING] = ConfigRecord({"run-id": spec.run_id})
        return None
    if bound["run-id"] != spec.run_id:
        return (
            f"round request refused: {REQUEST_RECORD}['run-id']={spec.run_id!r} differs from "
            f"{bound['run-id']!r}, the run-id this Flower run started with; the per-run quota is "
            "kept per run-id."
        )
    return None


def _inner_update(
    call_next, msg: Message, context: Context, keys: list[str], received: list[np.ndarray]
) -> list[np.ndarray] | None:
    """Run the inner handler and return ``returned - received`` in the model's dtypes.

    ``None`` when the handler failed or answered with something that is not the model: the cause
    is logged here, on the device, and never sent.
    """
    try:
        out = call_next(msg, context)
    except Exception:  # noqa: BLE001 - any failure becomes a zero update (see module docstring)
        log.exception("fedfilter mod: the inner train handler raised; releasing a zero update")
        return None
    if out.has_error():
        log.error(
            "fedfilter mod: the inner train handler answered with an error (code %s: %s); releasing a zero update",
            out.error.code,
            out.error.reason,
        )
        return None
    records = list(out.content.array_records.items())
    if len(records) != 1 or list(records[0][1].keys()) != keys:
        log.error(
            "fedfilter mod: the inner reply must hold exactly one ArrayRecord with the keys "
            "received; releasing a zero update"
        )
        return None
    update = []
    for key, old in zip(keys, received):
        try:
            new = decode(records[0][1][key])
        except Exception:  # noqa: BLE001
            log.exception("fedfilter mod: array %r of the inner reply cannot be read", key)
            return None
        if new.shape != old.shape:
            log.error(
                "fedfilter mod: array %r came back with shape %s, expected %s; releasing a zero update",
                key,
                new.shape,
                old.shape,
            )
            return None
        if np.issubdtype(old.dtype, np.floating):
            update.append((new.astype(np.float64) - old.astype(np.float64)).astype(old.dtype))
        else:
            # Integer buffers (e.g. BatchNorm's num_batches_tracked, which counts batches and so
            # reveals the data size) are never released: their update is always zero.
            update.append(np.zeros_like(old))
    return update


def _ledger_cause(device: DeviceConfig, err: BaseException) -> str:
    """What the error reply says about a ledger failure: its kind only (``LedgerError.public``), never
    paths, spends or budget (invariant 5); the full message goes to the device's log."""
    if isinstance(err, sqlite3.Error | OSError):
        err = storage_error(device.ledger_dir, err)
    if isinstance(err, LedgerError):
        return f"{err.public} (details in the device's log)"
    if isinstance(err, ValueError):
        return "this device's budget ledger does not match its settings (details in the device's log)"
    return f"{LedgerError.public} (details in the device's log)"


def _ledger_code(err: BaseException) -> str:
    """The refusal code of a ledger failure, by its kind (``protocol/refusals.py``)."""
    if isinstance(err, LedgerMissingError):
        return "not-enrolled"
    if isinstance(err, LedgerUnavailableError):
        return "ledger-refused"
    if isinstance(err, ValueError):
        return "device-settings"
    return "ledger-failed"


def _reply(msg: Message, status: str, keys: list[str], arrays: list[np.ndarray] | None) -> Message:
    content = RecordDict()
    if arrays is not None:
        content[ARRAYS_RECORD] = ArrayRecord({k: encode(a) for k, a in zip(keys, arrays)})
    content[STATUS_RECORD] = ConfigRecord({"status": status})
    return Message(content, reply_to=msg)


class _RefusedBeforeTraining(RoundSpecError):
    """A request the device can judge only with its ledger open, refused before any training."""


@dataclass(frozen=True)
class _Outcome:
    release: Any  # client.release.Release (under SecAgg+, its arrays are the encoded report)
    update: list[np.ndarray]
    floating: list[int]  # indices of the floating-point arrays (the only ones released)


def _filtered_release(
    ledger: BudgetLedger,
    device: DeviceConfig,
    spec: RoundSpec,
    msg: Message,
    context: Context,
    call_next,
    keys: list[str],
    received: list[np.ndarray],
    grid: SkellamGrid | None = None,
) -> _Outcome | None:
    """Train, filter, spend durably and noise one round; ``None`` if the round was answered before.

    ``grid``: the round is masked by SecAgg+ (``secure_aggregation_mod``): a Skellam release.
    """
    if ledger.has_release(spec.run_id, spec.round_id):
        return None
    if grid is not None and ledger.filter.kind != "rdp":  # refused before training: nothing spent
        raise _RefusedBeforeTraining(
            "round request refused: distributed (Skellam) releases are accounted by the rdp filter; "
            f"this device's filter is {ledger.filter.kind!r}.",
            code="filter-not-rdp",
        )
    if grid is not None:
        try:
            require_worst_case(ledger.current_worst_filter())  # refused before training: nothing spent
        except WorstCaseMissingError as err:
            raise _RefusedBeforeTraining(str(err)) from None
    # Always train, whatever the budget: a noise-only reply must take as long as a real one.
    update = _inner_update(call_next, msg, context, keys, received)
    if update is None:
        update = [np.zeros_like(a) for a in received]
    floating = floating_indices(received)
    policy = device.policy  # the request was validated once, at the mod's entry
    # Gaussian noise on the floating-point arrays, or under SecAgg+ Skellam noise on every array's grid.
    released = update if grid is not None else [update[i] for i in floating]

    def spend_and_noise(arrays: list[np.ndarray]) -> Release:
        mechanism = (
            GaussianMechanism.for_request(spec) if grid is None else SkellamMechanism.for_update(spec, grid, arrays)
        )
        return release(
            ledger,
            mechanism,
            arrays,
            run_id=spec.run_id,
            round_id=int(spec.round_id),
            exhausted_below=policy.exhausted_below,
            after_exhaustion=policy.after_exhaustion,
            stream=noise_stream(device.noise_seed, spec),
        )

    try:
        return _Outcome(spend_and_noise(released), update, floating)
    except NonFiniteUpdateError:
        log.error("fedfilter mod: the update holds NaN or inf; releasing a zero update instead")
        return _Outcome(spend_and_noise([np.zeros_like(a) for a in released]), update, floating)


# --- the mods --------------------------------------------------------------------------------
@once_per_message  # the device runtime puts it around every approved app, which may list it too
def individual_filter_mod(msg: Message, context: Context, call_next: Callable[[Message, Context], Message]) -> Message:
    """Wrap a ClientApp's training with the device's individual privacy filter.

    Every ``train`` message is checked against the device owner's settings (``context.node_config``)
    and ``check_request`` before anything runs; an accepted round trains, clips the update to the
    allowance the device's filter grants, spends it durably in the device's ledger, and only then
    adds the noise. ``evaluate`` is refused; other messages pass through (see the module docstring).

    Parameters
    ----------
    msg : Message
        The message the SuperNode delivered to this ClientApp.
    context : Context
        The node's context; ``context.node_config`` holds the owner's settings (``NODE_CONFIG_KEYS``).
    call_next : Callable[[Message, Context], Message]
        The inner handler (the app's training code, or the next mod).

    Returns
    -------
    Message
        The noisy update and status ``"report"``, the status ``"left"``, or an error reply whose
        reason is ``fedfilter[<code>]: <text>`` (``fedfilter.protocol.refusals``).

    Examples
    --------
    >>> from flwr.clientapp import ClientApp
    >>> app = ClientApp(mods=[individual_filter_mod])
    """
    if _FILTERING.get():  # a second copy inside the first, past once_per_message: the outer one filters
        return call_next(msg, context)
    hold = ReplyHold()  # the clock starts when the message reaches the device's mod
    token = _FILTERING.set(True)
    try:
        reply = _filter_round(msg, context, call_next, hold)
    except Exception:
        hold.wait()  # Flower answers with the exception: not before the hold either
        raise
    finally:
        _FILTERING.reset(token)
    return hold.reply(reply, msg)


def _filter_round(msg: Message, context: Context, call_next, hold: ReplyHold) -> Message:
    category = _category(msg)
    if category == "evaluate":
        return _error(
            msg,
            "evaluate-refused",
            "evaluation on a client's private data is refused: loss and "
            "accuracy on it are un-noised releases outside the privacy filter. Evaluate "
            "the global model on held-out data at the coordinator.",
        )
    if category != "train":
        return call_next(msg, context)
    if RECORD_KEY_CONFIGS in msg.content.config_records and not reply_masked():
        # secure_aggregation_mod strips SecAgg+'s configs before this mod sees a masked stage: here
        # it is missing, or listed after this mod.
        return _error(
            msg,
            "secagg-mod-order",
            "a SecAgg+ message reached individual_filter_mod outside secure_aggregation_mod: list it first, "
            "ClientApp(mods=[secure_aggregation_mod, individual_filter_mod]). Nothing was trained, spent or released.",
        )

    # 1. The device's own settings. Their details stay on the device: the reason sent is generic.
    try:
        # Simulation only: without its own ledger-dir, a node may take its entry of the file that
        # FEDFILTER_DEVICE_SETTINGS names on this machine (client/settings/simulated.py).
        node_config = with_device_settings(context.node_config)
        device = device_config(node_config)
        hold_s = reply_hold_s(node_config)
    except DeviceSettingsError as err:  # the simulation runner's file: say where (budget values stay here)
        log.error("fedfilter mod: %s", err)
        return _error(msg, "device-settings", f"{err.public} Nothing was trained, spent or released.")
    except ValueError as err:
        log.error("fedfilter mod: %s", err)
        return _error(
            msg,
            "device-settings",
            "this device's privacy settings are missing or invalid (details in "
            "the device's log); nothing was trained, spent or released.",
        )

    # 2. The coordinator's request: refused before any training or spending. Distributed placement
    # only when this reply will be masked by SecAgg+ (the mark of secure_aggregation_mod, which runs
    # before this mod on the device), and then nothing else.
    masked = reply_masked()
    grid: SkellamGrid | None = None
    try:
        spec = round_spec_from_record(msg.content.config_records.get(REQUEST_RECORD))
        check_request(spec, replace(device.policy, allow_distributed=masked))
        if masked:
            grid = secagg_round_grid(spec, context, device.policy)
    except RoundSpecError as err:
        return _error(msg, err.code, f"{err} Nothing was trained, spent or released.")
    array_records = list(msg.content.array_records.items())
    if len(array_records) != 1:
        return _error(
            msg,
            "bad-model",
            f"a train message must hold exactly one ArrayRecord (the model). Found {len(array_records)}.",
        )
    model = array_records[0][1]
    keys = list(model.keys())
    try:
        received = [decode(model[k]) for k in keys]
    except Exception as err:  # noqa: BLE001
        return _error(msg, "bad-model", f"the model in the train message cannot be read: {err}")
    try:  # the model's dtypes are the coordinator's choice: refusing them tells nothing about the device
        as_float_arrays([received[i] for i in floating_indices(received)])
    except ValueError:
        dtypes = sorted({str(a.dtype) for a in received})
        return _error(
            msg,
            "no-float-model",
            "round request refused: the model holds no floating-point values to release "
            f"({len(received)} array(s), dtypes {dtypes}). Nothing was trained, spent or released.",
        )
    if (reason := _bind_run(context, spec)) is not None:
        return _error(msg, "run-id-changed", reason)

    # From here the reply depends on the ledger (budget state, replays) and on training: every
    # reply, refusals included, waits for the owner's hold (client/flower/reply_timing.py).
    hold.arm(hold_s)
    outcome = None
    for _ in range(3):  # a ledger closed by another thread between lookup and use is reopened
        try:
            key, entry = cached_ledger(device)
        except EnrolmentMismatch as err:  # the owner's settings against the enrolment: names only
            log.error("fedfilter mod: %s", err)
            return _error(msg, "device-settings", f"{err.public} Nothing was trained, spent or released.")
        except (LedgerError, OSError, ValueError, sqlite3.Error) as err:  # fail closed until the owner acts
            log.error("fedfilter mod: cannot open the budget ledger: %s", err)
            return _error(
                msg, _ledger_code(err), f"{_ledger_cause(device, err)}; nothing was trained, spent or released."
            )
        try:
            with entry.held():  # one message at a time per device ledger in this process
                if entry.closed:
                    continue
                outcome = _filtered_release(entry.ledger, device, spec, msg, context, call_next, keys, received, grid)
        except _RefusedBeforeTraining as err:
            return _error(msg, err.code, f"{err} Nothing was trained, spent or released.")
        except ReplayError as err:  # a concurrent duplicate of this round got there first
            return _error(msg, "replay", f"round request refused: {err}")
        except (LedgerError, sqlite3.Error) as err:  # lost spends, a full or read-only disk: nothing released
            log.error("fedfilter mod: the budget ledger failed: %s", err)
            forget_ledger(key, entry)
            return _error(msg, _ledger_code(err), f"{_ledger_cause(device, err)}; nothing was released.")
        except BaseException:
            forget_ledger(key, entry)
            raise
        break
    if outcome is None:
        return _error(
            msg,
            "replay",
            f"round request refused: round-id={spec.round_id} of run-id="
            f"{spec.run_id!r} was already answered; a repeated round gets no second release.",
        )

    if grid is not None:  # under SecAgg+: the legacy layout secaggplus_mod masks, constants besides
        if outcome.release.status == "left":  # an error drops this device from the SecAgg+ round
            return _error(msg, "left", "this device's budget is spent and it leaves (after-exhaustion='leave').")
        return Message(masked_report_content(outcome.release.arrays), reply_to=msg)
    if outcome.release.status == "left":
        return _reply(msg, STATUS_LEFT, keys, None)
    out = list(outcome.update)
    floating = outcome.floating
    for i, noisy in zip(floating, outcome.release.arrays):
        out[i] = noisy
    for i in set(range(len(out))) - set(floating):
        out[i] = np.zeros_like(received[i])
    return _reply(msg, STATUS_REPORT, keys, out)
