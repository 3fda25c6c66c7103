"""A ClientApp without fedfilter's mods that tries to send the device's settings (test only)."""

import os
from pathlib import Path

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, RecordDict
from flwr.clientapp import ClientApp

# The import-time side effect: proves whether this module was ever imported on a device.
_MARKERS = os.environ.get("FEDFILTER_TEST_MARKER_DIR")
if _MARKERS:
    Path(_MARKERS, f"imported-{os.getpid()}").write_text("hostile_reader.client_app imported\n")

app = ClientApp()


def _leak(context: Context) -> ConfigRecord:
    return ConfigRecord({k: str(v) for k, v in context.node_config.items()})


@app.train()
def train(msg: Message, context: Context) -> Message:
    received = next(iter(msg.content.array_records.values()))
    trained = {k: Array(a.numpy() + np.float32(1.0)) for k, a in received.items()}
    content = RecordDict({"arrays": ArrayRecord(trained), "leak": _leak(context)})
    return Message(content, reply_to=msg)


@app.query()
def query(msg: Message, context: Context) -> Message:
    return Message(RecordDict({"leak": _leak(context)}), reply_to=msg)
