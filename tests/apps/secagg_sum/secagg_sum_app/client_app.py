"""The devices: ``[secure_aggregation_mod, probe_mod, individual_filter_mod]`` around a numpy step.

``probe_mod`` sits inside Flower's ``secaggplus_mod`` (which ``secure_aggregation_mod`` runs), so it
sees the legacy reply ``individual_filter_mod`` built (``fitres.parameters``: the encoded integer
report ``encode_report(y, q)``) before SecAgg+ quantizes and masks it, and saves it for the test.
"""

from __future__ import annotations

import os

import numpy as np
from flwr.app import Array, ArrayRecord, Context, Message, RecordDict
from flwr.clientapp import ClientApp

from fedfilter.client.filter_mod import individual_filter_mod
from fedfilter.client.secagg.mod import reply_masked, secure_aggregation_mod
from fedfilter.protocol.wire import ARRAYS_RECORD, REQUEST_RECORD, round_spec_from_record

from . import KEYS, probe_dir

LEGACY_PARAMETERS = "fitres.parameters"  # flwr.compat fitres_to_recorddict's record name


def train(msg: Message, context: Context) -> Message:
    """A fixed step per node and round (norm ~0.4, below the clip 0.5: mostly not clipped)."""
    pid = int(context.node_config["partition-id"])
    round_id = round_spec_from_record(msg.content[REQUEST_RECORD]).round_id
    rng = np.random.default_rng(1000 * round_id + pid)
    record = msg.content[ARRAYS_RECORD]
    new = {}
    for key in KEYS:
        old = record[key].numpy()
        new[key] = Array((old + rng.normal(0.0, 0.035, old.shape)).astype(np.float32))
    return Message(RecordDict({ARRAYS_RECORD: ArrayRecord(new)}), reply_to=msg)


def probe_mod(msg: Message, context: Context, call_next) -> Message:
    """Save the report this device hands SecAgg+ (test only: a real device never writes it)."""
    reply = call_next(msg, context)
    if not reply_masked() or reply.has_error() or LEGACY_PARAMETERS not in reply.content.array_records:
        return reply
    round_id = round_spec_from_record(msg.content[REQUEST_RECORD]).round_id
    arrays = reply.content.array_records[LEGACY_PARAMETERS].to_numpy_ndarrays()
    out = probe_dir() / f"report-r{round_id}-n{int(context.node_id)}.npz"
    partial = out.with_suffix(".partial.npz")
    np.savez(partial, *arrays)
    os.replace(partial, out)  # whole files only: the test reads after the run
    return reply


app = ClientApp(mods=[secure_aggregation_mod, probe_mod, individual_filter_mod])
app.train()(train)
