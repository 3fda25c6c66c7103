"""The coordinator: ``IndividualFilterStrategy(FedAvg, placement="distributed")`` behind two spies.

* ``RecordingGrid`` wraps the Grid Flower hands the ServerApp and records every reply the
  coordinator received (per ``send_and_receive`` call: the SecAgg+ stage it answered, and what each
  reply carried), saving the masked vectors of the COLLECT_MASKED_VECTORS stage.
* ``decode_sum`` in ``fedfilter.coordinator.secagg.secure_round`` is wrapped (in this process only) to save
  the integer sum the coordinator unmasked, with the round, the number of reports and ``q``.

Everything is written to ``probe_dir()`` for the test; nothing here changes what is sent or released,
except in the attack the test asks for with ``FEDFILTER_TEST_SECAGG_CLAIM="n,k,t"`` (``_install_claim``):
the coordinator then runs SecAgg+ with neighbourhood ``k`` and threshold ``t`` and tells every device
that ``n`` nodes were sampled (with Flower's grid for ``n``), whatever ``min-reports`` it asks for.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from typing import Any

import numpy as np
from flwr.app import Array, ArrayRecord, Context, Message
from flwr.common import bytes_to_ndarray
from flwr.common.secure_aggregation.secaggplus_constants import RECORD_KEY_CONFIGS, Key
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import FedAvg

import fedfilter.coordinator.secagg.secure_round as secure_round
from fedfilter.coordinator.strategy import IndividualFilterStrategy

from . import KEYS, SHAPES, probe_dir


def _stage(message: Message) -> str:
    configs = message.content.config_records.get(RECORD_KEY_CONFIGS) if message.has_content() else None
    if configs is not None and Key.STAGE in configs:
        return str(configs[Key.STAGE])
    return str(message.metadata.message_type)


def _describe(reply: Message) -> dict[str, Any]:
    """What one reply carried: every record by name, arrays by size, config entries by key and type."""
    if reply.has_error():
        return {"node": int(reply.metadata.src_node_id), "error": reply.error.reason}
    content = reply.content
    arrays = {name: [int(np.prod(a.shape)) for a in rec.values()] for name, rec in content.array_records.items()}
    configs = {name: {k: type(v).__name__ for k, v in rec.items()} for name, rec in content.config_records.items()}
    metrics = {name: dict(rec) for name, rec in content.metric_records.items()}
    return {"node": int(reply.metadata.src_node_id), "arrays": arrays, "metrics": metrics, "configs": configs}


class RecordingGrid(Grid):
    """The ServerApp's Grid, recording every reply (delegates everything else unchanged)."""

    def __init__(self, inner: Grid) -> None:
        self.inner = inner
        self.calls: list[dict[str, Any]] = []

    def set_run(self, run) -> None:
        self.inner.set_run(run)

    @property
    def run(self):
        return self.inner.run

    def create_message(self, content, message_type, dst_node_id, group_id, ttl=None) -> Message:
        return self.inner.create_message(content, message_type, dst_node_id, group_id, ttl)

    def get_node_ids(self) -> Iterable[int]:
        return self.inner.get_node_ids()

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        raise RuntimeError("this test app receives only through send_and_receive (what Flower's code calls)")

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        raise RuntimeError("this test app receives only through send_and_receive (what Flower's code calls)")

    def send_and_receive(self, messages: Iterable[Message], *, timeout: float | None = None) -> Iterable[Message]:
        messages = list(messages)
        stages = sorted({_stage(m) for m in messages})
        groups = sorted({m.metadata.group_id for m in messages})
        if CLAIM_ENV in os.environ:
            claimed = int(os.environ[CLAIM_ENV].split(",")[0])
            for message in messages:
                if _stage(message) == "setup":
                    message.content.config_records[RECORD_KEY_CONFIGS][Key.SAMPLE_NUMBER] = claimed
        replies = list(self.inner.send_and_receive(messages, timeout=timeout))
        self.calls.append({"stages": stages, "groups": groups, "replies": [_describe(r) for r in replies]})
        for reply in replies:
            configs = None if reply.has_error() else reply.content.config_records.get(RECORD_KEY_CONFIGS)
            if configs is not None and Key.MASKED_PARAMETERS in configs:
                masked = [bytes_to_ndarray(b) for b in configs[Key.MASKED_PARAMETERS]]
                name = f"masked-r{reply.metadata.group_id}-n{int(reply.metadata.src_node_id)}.npz"
                np.savez(probe_dir() / name, *masked)
        return replies


CLAIM_ENV = "FEDFILTER_TEST_SECAGG_CLAIM"


def _install_claim() -> None:
    """The attack: the coordinator's own graph (k, t) in place of the one the rule picks, and the grid
    Flower's settings give for the claimed population (so that the devices' grid check passes)."""
    if CLAIM_ENV not in os.environ:
        return
    n, k, t = (int(x) for x in os.environ[CLAIM_ENV].split(","))
    settings = secure_round.secaggplus_settings
    secure_round.round_graph = lambda *args, **kwargs: secure_round.RoundGraph(k, t, 0.0)
    secure_round.secaggplus_settings = lambda _sampled: settings(n)


def _install_sum_spy() -> None:
    """Wrap the coordinator's secure round and its decode step to save the unmasked integer sum."""
    run_secure_round, decode_sum = secure_round.run_secure_round, secure_round.decode_sum
    current = {"round": 0}

    def run_spy(grid, contents, *, server_round, **kwargs):
        current["round"] = int(server_round)
        out = run_secure_round(grid, contents, server_round=server_round, **kwargs)
        # What SecAgg+ unmasked, released or not: the number of reports in the sum the coordinator holds.
        unmasked = {"reports": out.reports if out.aggregate is not None else 0, "reason": out.reason}
        (probe_dir() / f"unmasked-r{server_round}.json").write_text(json.dumps(unmasked))
        return out

    def decode_spy(aggregated, n_reports, q):
        sums = decode_sum(aggregated, n_reports, q)
        out = probe_dir() / f"sum-r{current['round']}.npz"
        np.savez(out, *sums, n_reports=np.int64(n_reports), q=np.int64(q))
        return sums

    secure_round.run_secure_round = run_spy
    secure_round.decode_sum = decode_spy


app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    cfg = context.run_config
    n = int(cfg["num-nodes"])
    _install_sum_spy()
    _install_claim()
    recording = RecordingGrid(grid)
    inner = FedAvg(
        fraction_train=1.0, fraction_evaluate=0.0, min_train_nodes=n, min_available_nodes=n, min_evaluate_nodes=0
    )
    strategy = IndividualFilterStrategy(
        inner,
        noise_multiplier=float(cfg["noise-multiplier"]),
        clip=float(cfg["clip"]),
        placement="distributed",
        min_reports=int(cfg["min-reports"]),
        public_ledger=str(cfg["public-ledger"]),
        run_name=str(cfg["run-name"]),
        message_ttl_s=3 * float(cfg["round-timeout-s"]),
    )
    initial = ArrayRecord({k: Array(np.zeros(s, dtype=np.float32)) for k, s in zip(KEYS, SHAPES)})
    strategy.start(
        grid=recording, initial_arrays=initial, num_rounds=int(cfg["num-rounds"]), timeout=float(cfg["round-timeout-s"])
    )
    partial = probe_dir() / "replies.partial.json"
    partial.write_text(json.dumps(recording.calls, indent=1))
    os.replace(partial, probe_dir() / "replies.json")
