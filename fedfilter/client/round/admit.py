"""Admit a train request: the device's settings, the request's checks, the model, the run binding.

Every refusal here depends only on the request and the owner's settings, and comes before the ledger
is opened: nothing is trained, spent or released, and the reply is not held.
"""

from __future__ import annotations

import logging

from flwr.app import ConfigRecord, Context, Message

from fedfilter.client.flower.npy_codec import decode
from fedfilter.client.mechanisms.gaussian import as_float_arrays, floating_indices
from fedfilter.client.round.admitted import AdmittedRound
from fedfilter.client.round.placement import Placement
from fedfilter.client.round.refusal import refusal
from fedfilter.client.settings.errors import DeviceSettingsError
from fedfilter.client.settings.node_config import device_config, reply_hold_s
from fedfilter.client.settings.simulated import with_device_settings
from fedfilter.protocol.request import RoundSpec, RoundSpecError
from fedfilter.protocol.wire import REQUEST_RECORD, round_spec_from_record

__all__ = ["admit", "RUN_BINDING"]

log = logging.getLogger("fedfilter.client")

RUN_BINDING = "fedfilter.run"  # context.state: the request run-id this Flower run is bound to


def admit(msg: Message, context: Context, placement: Placement) -> AdmittedRound | Message:
    """The admitted round, or the refusal to send (nothing trained, spent or released).

    Parameters
    ----------
    msg : Message
        A train message.
    context : Context
        The node's context: the owner's settings (``context.node_config``) and the run binding
        (``context.state``).
    placement : Placement
        The round's placement (its checks of the message and of the request).

    Examples
    --------
    >>> import time
    >>> from flwr.app import Metadata, RecordDict
    >>> from fedfilter.client.round.placement import LocalPlacement
    >>> meta = Metadata(run_id=1, message_id="m", src_node_id=1, dst_node_id=2, reply_to_message_id="",
    ...                 group_id="1", created_at=time.time(), ttl=60.0, message_type="train")
    >>> ctx = Context(run_id=1, node_id=2, node_config={}, state=RecordDict(), run_config={})
    >>> admit(Message(RecordDict(), metadata=meta), ctx, LocalPlacement()).error.reason[:27]
    'fedfilter[device-settings]:'
    """
    if (refused := placement.refuse_message(msg)) is not None:
        return refused

    # 1. The device's own settings. Their details stay on the device: the reason sent is generic.
    try:
        # Simulation only: without its own ledger-dir, a node may take its entry of the file that
        # FEDFILTER_DEVICE_SETTINGS names on this machine (client/settings/simulated.py).
        node_config = with_device_settings(context.node_config)
        device = device_config(node_config)
        hold_s = reply_hold_s(node_config)
    except DeviceSettingsError as err:  # the simulation runner's file: say where (budget values stay here)
        log.error("fedfilter mod: %s", err)
        return refusal(msg, "device-settings", f"{err.public} Nothing was trained, spent or released.")
    except ValueError as err:
        log.error("fedfilter mod: %s", err)
        return refusal(
            msg,
            "device-settings",
            "this device's privacy settings are missing or invalid (details in "
            "the device's log); nothing was trained, spent or released.",
        )

    # 2. The coordinator's request, against the owner's policy and the placement's own checks
    # (distributed placement only when SecAgg+ masks the reply, and then nothing else).
    try:
        spec = round_spec_from_record(msg.content.config_records.get(REQUEST_RECORD))
        mechanism = placement.admit_request(spec, device.policy)
    except RoundSpecError as err:
        return refusal(msg, err.code, f"{err} Nothing was trained, spent or released.")

    # 3. The model: one ArrayRecord, readable, with floating-point values to release.
    array_records = list(msg.content.array_records.items())
    if len(array_records) != 1:
        return refusal(
            msg,
            "bad-model",
            f"a train message must hold exactly one ArrayRecord (the model). Found {len(array_records)}.",
        )
    model = array_records[0][1]
    keys = list(model.keys())
    try:
        received = [decode(model[k]) for k in keys]
    except Exception as err:  # noqa: BLE001
        return refusal(msg, "bad-model", f"the model in the train message cannot be read: {err}")
    floating = floating_indices(received)
    try:  # the model's dtypes are the coordinator's choice: refusing them tells nothing about the device
        as_float_arrays([received[i] for i in floating])
    except ValueError:
        dtypes = sorted({str(a.dtype) for a in received})
        return refusal(
            msg,
            "no-float-model",
            "round request refused: the model holds no floating-point values to release "
            f"({len(received)} array(s), dtypes {dtypes}). Nothing was trained, spent or released.",
        )

    # 4. One request run-id per Flower run.
    if (reason := _bind_run(context, spec)) is not None:
        return refusal(msg, "run-id-changed", reason)
    return AdmittedRound(spec, device, hold_s, keys, received, floating, mechanism)


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
