"""Sends one train round (a valid fedfilter request) and one query; writes what came back (test only)."""

import json
import os
import time
from pathlib import Path

import numpy as np
from flwr.app import ArrayRecord, Context, Message, MessageType, RecordDict
from flwr.serverapp import Grid, ServerApp

from fedfilter.protocol.request import RoundSpec
from fedfilter.protocol.wire import REQUEST_RECORD, request_record

app = ServerApp()


def _describe(reply: Message) -> dict:
    if reply.has_error():
        return {"error": reply.error.reason, "code": int(reply.error.code)}
    return {"records": sorted(reply.content.keys())}


@app.main()
def main(grid: Grid, context: Context) -> None:
    want = int(context.run_config["min-available-nodes"])
    deadline = time.monotonic() + 60
    while len(nodes := list(grid.get_node_ids())) < want and time.monotonic() < deadline:
        time.sleep(0.5)
    spec = RoundSpec(run_id=f"hostile-{context.run_id}", round_id=1, noise_multiplier=1.0, clip=0.5)
    model = ArrayRecord([np.zeros(4, dtype=np.float32)])
    out = {}
    for kind in (MessageType.TRAIN, MessageType.QUERY):
        messages = [
            Message(
                RecordDict({"arrays": model, REQUEST_RECORD: request_record(spec)}), dst_node_id=n, message_type=kind
            )
            for n in nodes
        ]
        out[kind] = [_describe(r) for r in grid.send_and_receive(messages, timeout=120)]
    markers = os.environ.get("FEDFILTER_TEST_MARKER_DIR")
    if markers:
        Path(markers, f"server-{context.run_id}.json").write_text(json.dumps(out, indent=2))
