"""The device side of distributed noise over SecAgg+ (issue 15), through Flower's real protocol.

Flower's own ``SecAggPlusWorkflow`` (driven by a minimal legacy server here) talks to in-process
ClientApps ``ClientApp(mods=[secure_aggregation_mod, individual_filter_mod])`` through the wire
format (``simulations/harness/secagg_loopback.py``). As in the product, the workflow is made to send Message-API
content (``"arrays"``, ``"config"``, ``"fedfilter.request"``) in its collect stage. The tests look at
everything the coordinator received, and at each device's integer report (captured by a test hook:
a wrapper around the Skellam sampler, which never ships in a reply).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, RecordDict
from flwr.clientapp import ClientApp
from flwr.common import ndarrays_to_parameters, parameters_to_ndarrays
from flwr.common.secure_aggregation.secaggplus_constants import Stage
from flwr.server import LegacyContext, ServerConfig
from flwr.server.strategy import FedAvg
from flwr.server.workflow import DefaultWorkflow

import fedfilter.client.mechanisms.skellam as release_distributed
from fedfilter.client.filter_mod import individual_filter_mod
from fedfilter.client.ledger.budget import BudgetLedger
from fedfilter.client.mechanisms.gaussian_noise import round_noise_stream
from fedfilter.client.mechanisms.skellam_noise import add_skellam_noise
from fedfilter.client.secagg.mod import secure_aggregation_mod
from fedfilter.client.settings.node_config import enrol_device
from fedfilter.coordinator.secagg_consistency_round import ConsistencyCheckedSecAggPlus
from fedfilter.privacy.rounding import down, up
from fedfilter.privacy.skellam import integer_norms, l2_up, skellam_charge
from fedfilter.protocol.request import RoundSpec
from fedfilter.protocol.secagg_grid import decode_sum, grid_step, secaggplus_settings
from fedfilter.protocol.secagg_masks import cryptographic_masks
from fedfilter.protocol.wire import ARRAYS_RECORD, REQUEST_RECORD, request_record
from fedfilter.simulations.harness.secagg_loopback import LoopbackGrid, stage_of

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


# --- the exact integer sum -------------------------------------------------------------------
@pytest.mark.parametrize(
    "n, dropped, late",
    [
        (8, (), ()),
        (8, (node_id(1), node_id(4)), ()),  # dropped after the masks were shared: their reports are lost
        (10, (node_id(0), node_id(9)), (node_id(5),)),  # and one more drops out while unmasking
    ],
)
def test_the_unmasked_sum_is_exactly_the_sum_of_the_reports(tmp_path, monkeypatch, n, dropped, late):
    t = max(5, n // 2 + 1)  # devices refuse a threshold at or below half their neighbourhood

    def drop(stage, nid):
        return (stage == Stage.COLLECT_MASKED_VECTORS and nid in dropped) or (stage == Stage.UNMASK and nid in late)

    result = run_round(tmp_path, monkeypatch, n, threshold=t, drop=drop)
    assert result.strategy.aggregated and len(result.strategy.results) == n - len(dropped)
    q = result.settings["quantization_range"]
    aggregated = parameters_to_ndarrays(result.strategy.results[0][1].parameters)
    decoded = decode_sum(aggregated, n - len(dropped), q)
    survivors = [node_id(i) for i in range(n) if node_id(i) not in dropped]
    assert set(result.captured.y) == {node_id(i) for i in range(n)}  # the dropped ones trained and spent too
    # The training code saw the Message-API content only, never the SecAgg+ protocol's record.
    assert result.trainer.seen_keys == [sorted([ARRAYS_RECORD, "config", REQUEST_RECORD])] * n
    gamma = grid_step(1.0)
    for index, (got, dtype) in enumerate(zip(decoded, DTYPES)):
        if np.dtype(dtype).kind == "f":
            floating = [KEYS[j] for j, d in enumerate(DTYPES) if np.dtype(d).kind == "f"].index(KEYS[index])
            expected = sum(result.captured.y[nid][floating] for nid in survivors)
            assert np.abs(expected).max() < q // 2  # no wrap: the centred residue is the sum itself
            np.testing.assert_array_equal(got, expected)
            # The sum is that of the snapped updates plus noise of variance n' mu_share >= mu_total.
            k_sum = sum(result.captured.k[nid][floating] for nid in survivors)
            assert np.abs(k_sum * gamma).max() < 3.0
        else:
            np.testing.assert_array_equal(got, 0)  # integer buffers carry no data: released as 0
    # Each device's y is its k plus the noise its seed draws (recomputed here, independently), and its
    # ledger holds the charge of k at its exact integer norms.
    mu_total = _mu_total(1.0, 1.0)
    for i in range(n):
        nid = node_id(i)
        records, filt, _ = ledger_records(tmp_path, i)
        (rec,) = records
        assert rec.placement == "distributed" and rec.status == "contributed"
        mu = result.captured.mu[nid]
        assert mu * t >= mu_total and mu == float(up(mu_total / t))
        zeros = [np.zeros_like(a) for a in result.captured.k[nid]]
        noise = add_skellam_noise(zeros, mu, round_noise_stream(1000 + i, RUN, 1))
        for y, k, e in zip(result.captured.y[nid], result.captured.k[nid], noise):
            np.testing.assert_array_equal(y, k + e)
        assert rec.noise_std == math.sqrt(mu) * gamma
        l1, l2sq = integer_norms(result.captured.k[nid])
        assert 0 < rec.sensitivity == l2_up(l2sq) * gamma <= 1.0
        np.testing.assert_array_equal(rec.charge, skellam_charge(filt, l1, l2_up(l2sq), mu_total))


def _mu_total(z: float, clip: float) -> float:
    ratio = z * clip / grid_step(clip)
    return float(down(ratio * ratio))


def test_the_builtin_client_app_runs_the_secagg_layer_before_the_filter(monkeypatch):
    from flwr.common.secure_aggregation.secaggplus_constants import RECORD_KEY_CONFIGS, Key
    from helpers.flower_messages import delivered

    from fedfilter.app.client_app import make_client_app
    from fedfilter.protocol.refusals import refusal_code

    monkeypatch.delenv("FEDFILTER_DEVICE_SETTINGS", raising=False)
    setup = {Key.STAGE: Stage.SETUP, Key.SAMPLE_NUMBER: 3, Key.SHARE_NUMBER: 3, Key.THRESHOLD: 2}
    setup |= {Key.CLIPPING_RANGE: 8.0, Key.TARGET_RANGE: 1 << 16, Key.MOD_RANGE: 1 << 32, Key.MAX_WEIGHT: 1.0}
    app = make_client_app()

    def ask(content: RecordDict) -> Message:
        return app(delivered(content), Context(run_id=1, node_id=42, node_config={}, state=RecordDict(), run_config={}))

    # SecAgg+'s first stage is answered by the SecAgg+ layer: the filter would refuse a SecAgg+ message
    # that did not pass through it first ("secagg-mod-order").
    reply = ask(RecordDict({RECORD_KEY_CONFIGS: ConfigRecord(setup)}))
    assert not reply.has_error() and RECORD_KEY_CONFIGS in reply.content.config_records
    # A plain round reaches the filter, which refuses a device without settings before any training.
    reply = ask(RecordDict({ARRAYS_RECORD: ArrayRecord({"w": Array(np.zeros(3, np.float32))})}))
    assert reply.has_error() and refusal_code(reply.error.reason) == "device-settings"


def test_a_round_below_the_threshold_is_never_unmasked_and_costs_each_device_its_charge_only(tmp_path, monkeypatch):
    n, t = 6, 5
    dropped = {node_id(0), node_id(2)}  # after the masks were shared: 4 reports < t = 5
    result = run_round(
        tmp_path,
        monkeypatch,
        n,
        threshold=t,
        drop=lambda stage, nid: stage == Stage.COLLECT_MASKED_VECTORS and nid in dropped,
    )
    assert not result.strategy.aggregated  # Flower's workflow halts: no sum is unmasked
    assert not any(r._stage == Stage.UNMASK for r in result.grid.received)
    mu_total = _mu_total(1.0, 1.0)
    for i in range(n):
        records, filt, state = ledger_records(tmp_path, i)
        (rec,) = records  # one round, one charge: the charge of its own report, nothing more
        l1, l2sq = integer_norms(result.captured.k[node_id(i)])
        np.testing.assert_array_equal(rec.charge, skellam_charge(filt, l1, l2_up(l2sq), mu_total))
        np.testing.assert_array_equal(state, filt.spend(np.zeros_like(state), rec.charge))
