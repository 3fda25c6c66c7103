"""One SecAgg+ round of devices behind ``secure_aggregation_mod`` and the filter, in process.

``run_round`` drives Flower's SecAgg+ workflow through ``harness.secagg_loopback``'s
grid to n devices (node ids ``node_id(i)``, settings ``node_config``) and returns what every side saw;
``assert_refused_before_training`` is the promise every refusal of a SecAgg+ round keeps.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, RecordDict
from flwr.clientapp import ClientApp
from flwr.common import ndarrays_to_parameters
from flwr.common.secure_aggregation.secaggplus_constants import Stage
from flwr.server import LegacyContext, ServerConfig
from flwr.server.strategy import FedAvg
from flwr.server.workflow import DefaultWorkflow
from harness.secagg_loopback import LoopbackGrid, stage_of

import fedfilter.client.mechanisms.skellam as release_distributed
from fedfilter.client.filter_mod import individual_filter_mod
from fedfilter.client.ledger.budget import BudgetLedger
from fedfilter.client.secagg.mod import secure_aggregation_mod
from fedfilter.client.settings.node_config import enrol_device
from fedfilter.coordinator.secagg.consistency import ConsistencyCheckedSecAggPlus
from fedfilter.protocol.request import RoundSpec
from fedfilter.protocol.secagg.grid import secaggplus_settings
from fedfilter.protocol.secagg.masks import cryptographic_masks
from fedfilter.protocol.wire import ARRAYS_RECORD, REQUEST_RECORD, request_record

KEYS = ["w", "b", "count"]
SHAPES = [(6, 5), (5,), (1,)]
DTYPES = [np.float32, np.float32, np.int64]  # "count": an integer buffer (never released)
RUN = "run-sa"


def model(value: float = 0.25) -> list[np.ndarray]:
    return [np.full(s, value if np.dtype(d).kind == "f" else 3, dtype=d) for s, d in zip(SHAPES, DTYPES)]


def node_id(i: int) -> int:
    return 100 + i


class Trainer:
    """The inner train handler of device ``i``: adds a fixed, device-specific step to every weight."""

    def __init__(self, steps: dict[int, list[np.ndarray]]):
        self.steps, self.calls, self.seen_keys = steps, [], []

    def __call__(self, msg: Message, ctx: Context) -> Message:
        self.calls.append(ctx.node_id)
        self.seen_keys.append(sorted(msg.content.keys()))
        record = msg.content[ARRAYS_RECORD]
        new = {}
        for key, step in zip(KEYS, self.steps[ctx.node_id]):
            old = record[key].numpy()
            new[key] = Array((old + step).astype(old.dtype))
        return Message(RecordDict({"arrays": ArrayRecord(new)}), reply_to=msg)


def device_steps(n: int, seed: int = 0, scale: float = 0.4) -> dict[int, list[np.ndarray]]:
    rng = np.random.default_rng(seed)
    return {
        node_id(i): [
            (rng.normal(size=s) * scale).astype(d) if np.dtype(d).kind == "f" else np.full(s, 7, dtype=d)
            for s, d in zip(SHAPES, DTYPES)
        ]
        for i in range(n)
    }


def node_config(tmp_path, i: int, **over) -> dict:
    config = {
        "ledger-dir": str(tmp_path / f"dev{i}"),
        "client-id": f"dev{i}",
        "budget-epsilon": 8.0,
        "budget-delta": 1e-5,
        "worst-case-epsilon": 1000.0,  # large: these tests are about the main account (worst case: test_worst_case*)
        "filter": "rdp",
        "reply-hold-s": 0,
        "noise-seed": 1000 + i,
        **over,
    }
    return config


class CaptureStrategy(FedAvg):
    """A legacy strategy that keeps what Flower's workflow hands it after unmasking."""

    def __init__(self, n: int):
        super().__init__(
            fraction_fit=1.0,
            fraction_evaluate=0.0,
            min_fit_clients=n,
            min_available_clients=n,
            initial_parameters=ndarrays_to_parameters([np.zeros(1)]),  # the workflow's content is replaced
        )
        self.results: list = []
        self.failures: list = []
        self.aggregated = False

    def aggregate_fit(self, server_round, results, failures):
        self.results, self.failures, self.aggregated = results, failures, True
        return None, {}


class MessageApiSecAgg(ConsistencyCheckedSecAggPlus):
    """Flower's workflow with the consistency round fedfilter's devices require (the product's own
    ``ConsistencyCheckedSecAggPlus``), sending the Message-API train content in its collect stage."""

    def __init__(self, content_for, **kwargs):
        super().__init__(**kwargs)
        self.content_for = content_for

    def setup_stage(self, grid, context, state):
        ok = super().setup_stage(grid, context, state)
        for nid in list(state.nid_to_fitins):
            state.nid_to_fitins[nid] = self.content_for(nid)
        return ok


@dataclass
class Captured:
    """The test hook: each device's integer report y = k + Sk(mu), recorded as the sampler returns it."""

    k: dict[int, list[np.ndarray]] = field(default_factory=dict)
    y: dict[int, list[np.ndarray]] = field(default_factory=dict)
    mu: dict[int, float] = field(default_factory=dict)


@dataclass
class RoundResult:
    grid: LoopbackGrid
    strategy: CaptureStrategy
    trainer: Trainer
    captured: Captured
    settings: dict

    def collect_replies(self) -> list[Message]:
        return [m for m in self.grid.received if _reply_stage(m) == Stage.COLLECT_MASKED_VECTORS]


def _reply_stage(reply: Message) -> str | None:
    return getattr(reply, "_stage", None)


def run_round(
    tmp_path,
    monkeypatch,
    n: int = 6,
    *,
    spec: RoundSpec | None = None,
    threshold: int = 4,
    settings: dict | None = None,
    node_over: dict[int, dict] | None = None,
    mods=None,
    drop=None,
    steps=None,
    enrol: bool = True,
) -> RoundResult:
    spec = spec or RoundSpec(RUN, 1, 1.0, 1.0, placement="distributed", min_reports=threshold)
    settings = settings if settings is not None else secaggplus_settings(n)
    configs = {node_id(i): node_config(tmp_path, i, **(node_over or {}).get(i, {})) for i in range(n)}
    if enrol:
        for config in configs.values():
            enrol_device(config)
    trainer = Trainer(steps or device_steps(n))
    apps = {}
    for nid in configs:
        app = ClientApp(mods=mods if mods is not None else [secure_aggregation_mod, individual_filter_mod])
        app.train()(trainer)
        apps[nid] = app

    captured = Captured()
    sampler = release_distributed.add_skellam_noise

    def hook(k, mu, stream):
        y = sampler(k, mu, stream)
        nid = current[0]
        captured.k[nid], captured.y[nid], captured.mu[nid] = [a.copy() for a in k], [a.copy() for a in y], mu
        return y

    monkeypatch.setattr(release_distributed, "add_skellam_noise", hook)
    current = [0]

    def deliver(nid):
        app = apps[nid]

        def call(msg, ctx):
            current[0] = nid
            return app(msg, ctx)

        return call

    grid = LoopbackGrid({nid: deliver(nid) for nid in apps}, configs, drop=drop)
    original_send = grid.send_and_receive

    def send_and_receive(messages, *, timeout=None):
        messages = list(messages)
        stages = {int(m.metadata.dst_node_id): stage_of(m) for m in messages}
        replies = original_send(messages, timeout=timeout)
        for reply in replies:
            reply._stage = stages[int(reply.metadata.src_node_id)]
        return replies

    grid.send_and_receive = send_and_receive

    start = model()

    def content_for(nid):
        return RecordDict(
            {
                ARRAYS_RECORD: ArrayRecord({k: Array(a) for k, a in zip(KEYS, start)}),
                "config": ConfigRecord({"server-round": 1}),
                REQUEST_RECORD: request_record(spec),
            }
        )

    strategy = CaptureStrategy(n)
    ctx = LegacyContext(
        Context(run_id=7, node_id=1, node_config={}, state=RecordDict(), run_config={}),
        config=ServerConfig(num_rounds=1),
        strategy=strategy,
    )
    workflow = MessageApiSecAgg(content_for, num_shares=1.0, reconstruction_threshold=threshold, **settings)
    with cryptographic_masks():  # the coordinator's side (the devices' mod installs it on theirs)
        DefaultWorkflow(fit_workflow=workflow)(grid, ctx)
    return RoundResult(grid, strategy, trainer, captured, settings)


def ledger_records(tmp_path, i):
    ledger = BudgetLedger.open(tmp_path / f"dev{i}")
    try:
        return ledger.records(), ledger.filter, ledger.state()
    finally:
        ledger.close()


def assert_refused_before_training(tmp_path, result, n, *words):
    collect = [r for r in result.grid.received if r._stage == Stage.COLLECT_MASKED_VECTORS]
    assert len(collect) == n and all(r.has_error() for r in collect)
    for reply in collect:
        for w in words:
            assert w in reply.error.reason, (w, reply.error.reason)
        assert "Nothing was trained, spent or released" in reply.error.reason
    assert result.trainer.calls == []  # nothing trained
    assert result.captured.y == {}  # no noise drawn, nothing released
    assert not result.strategy.aggregated  # Flower's workflow halts: nothing unmasked
    for i in range(n):
        ledger = BudgetLedger.open(tmp_path / f"dev{i}")
        try:
            assert ledger.records() == []  # nothing spent
        finally:
            ledger.close()
