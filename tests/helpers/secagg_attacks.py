"""A malicious coordinator for SecAgg+ rounds: it watches and forges messages between the stages.

``run_attack`` runs a round whose coordinator is ``attacker(seen, forge)``; ``refused``/``answered``
name the devices that refused or answered a stage and ``charges`` reads what each device paid.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from flwr.app import Array, ArrayRecord, Message, RecordDict
from flwr.clientapp import ClientApp
from flwr.common.secure_aggregation.secaggplus_constants import RECORD_KEY_CONFIGS
from flwr.serverapp.strategy import FedAvg

import fedfilter.client.mechanisms.skellam as release_distributed
from fedfilter.client.filter_mod import individual_filter_mod
from fedfilter.client.ledger.budget import BudgetLedger
from fedfilter.client.secagg.mod import secure_aggregation_mod
from fedfilter.client.settings.node_config import enrol_device
from fedfilter.coordinator import secure_round
from fedfilter.coordinator.run_log import NothingReleasedError
from fedfilter.coordinator.strategy import IndividualFilterStrategy
from fedfilter.protocol.secagg_grid import grid_step
from fedfilter.protocol.wire import ARRAYS_RECORD
from fedfilter.simulations.harness.secagg_loopback import LoopbackGrid, stage_of

SHAPES = [(4, 3), (3,)]
CLIP, Z, RUN = 1.0, 0.5, "secagg-attack"


def nid_of(i: int) -> int:
    return 100 + i


@dataclass
class Seen:
    """What the attacking coordinator sent and received, in order: (stage, request, reply)."""

    log: list = field(default_factory=list)
    y: dict = field(default_factory=dict)  # node -> its integer report (test hook)
    grid: LoopbackGrid | None = None


class Forging:
    """A grid that lets the attacker rewrite each request (``forge(stage, msg)``) and records the talk."""

    def __init__(self, grid, seen: Seen, forge):
        self._grid, self._seen, self._forge = grid, seen, forge

    def __getattr__(self, name):
        return getattr(self._grid, name)

    def send_and_receive(self, messages, *, timeout=None):
        messages = list(messages)
        requests = {}
        for msg in messages:
            self._forge(stage_of(msg), msg)
            requests[int(msg.metadata.dst_node_id)] = msg
        replies = self._grid.send_and_receive(messages, timeout=timeout)
        for reply in replies:
            request = requests[int(reply.metadata.src_node_id)]
            self._seen.log.append((stage_of(request), request, reply))
        return replies


def attacker(seen: Seen, forge, *, modulus_range=None, consistency=None):
    """The attacker's SecAgg+ workflow: the product's, with every stage's messages through ``Forging``."""

    class Attacker(secure_round._MessageApiSecAggPlus):
        def __init__(self, contents, graph, **kwargs):
            super().__init__(contents, graph, **kwargs)
            if modulus_range is not None:
                self.modulus_range = modulus_range  # after Flower's own parameter checks

        def setup_stage(self, grid, context, state):
            return super().setup_stage(Forging(grid, seen, forge), context, state)

        def share_keys_stage(self, grid, context, state):
            return super().share_keys_stage(Forging(grid, seen, forge), context, state)

        def collect_masked_vectors_stage(self, grid, context, state):
            return super().collect_masked_vectors_stage(Forging(grid, seen, forge), context, state)

        def unmask_stage(self, grid, context, state):
            return super().unmask_stage(Forging(grid, seen, forge), context, state)

        def consistency_stage(self, grid, context, state):  # the round issue 22 adds (absent before)
            if consistency is not None:
                return consistency(self, grid, context, state)
            return super().consistency_stage(grid, context, state)

    return Attacker


def run_attack(
    tmp_path, monkeypatch, n, workflow, *, min_reports=2, seen: Seen | None = None, extra: dict | None = None
) -> Seen:
    seen = seen if seen is not None else Seen()
    configs = {
        nid_of(i): {
            "ledger-dir": str(tmp_path / f"dev{i}"),
            "client-id": f"dev{i}",
            "budget-epsilon": 8.0,
            # Distributed rounds need a worst-case account (issue 22); it does not bind here: these
            # tests are about which shares leave a device, and the attacks must fail for that reason.
            "worst-case-epsilon": 1000.0,
            "budget-delta": 1e-5,
            "filter": "rdp",
            "reply-hold-s": 0,
            "noise-seed": 77 + i,
            **(extra or {}).get(i, {}),
        }
        for i in range(n)
    }
    for config in configs.values():
        enrol_device(config)
    gamma = grid_step(CLIP)
    rng = np.random.default_rng(5)
    step = {nid: [(rng.integers(-3, 4, s) * 8 * gamma).astype(np.float32) for s in SHAPES] for nid in configs}
    current = [0]
    sampler = release_distributed.add_skellam_noise

    def hook(k, mu, stream):
        y = sampler(k, mu, stream)
        seen.y[current[0]] = [a.copy() for a in y]
        return y

    monkeypatch.setattr(release_distributed, "add_skellam_noise", hook)

    def device(nid):
        app = ClientApp(mods=[secure_aggregation_mod, individual_filter_mod])

        @app.train()
        def train(msg, ctx):
            record = msg.content[ARRAYS_RECORD]
            new = {k: Array((record[k].numpy() + s).astype(np.float32)) for k, s in zip(["w", "b"], step[nid])}
            return Message(RecordDict({ARRAYS_RECORD: ArrayRecord(new)}), reply_to=msg)

        def deliver(msg, ctx):
            current[0] = nid
            return app(msg, ctx)

        return deliver

    monkeypatch.setattr(secure_round, "_MessageApiSecAggPlus", workflow(seen))
    grid = seen.grid = LoopbackGrid({nid: device(nid) for nid in configs}, configs)
    strategy = IndividualFilterStrategy(
        FedAvg(min_available_nodes=n, fraction_evaluate=0.0),
        noise_multiplier=Z,
        clip=CLIP,
        placement="distributed",
        min_reports=min_reports,
        run_name=RUN,
    )
    initial = ArrayRecord({k: Array(np.zeros(s, dtype=np.float32)) for k, s in zip(["w", "b"], SHAPES)})
    try:
        strategy.start(grid=grid, initial_arrays=initial, num_rounds=1, timeout=60)
    except NothingReleasedError:  # the attacked round released nothing: what the tests then check is
        pass  # which shares left the devices and what the coordinator could read from them
    return seen


def configs_of(msg: Message):
    return msg.content.config_records[RECORD_KEY_CONFIGS]


def refused(seen: Seen, stage: str) -> set[int]:
    return {int(r.metadata.src_node_id) for s, q, r in seen.log if s == stage and r.has_error()}


def answered(seen: Seen, stage: str) -> set[int]:
    return {int(r.metadata.src_node_id) for s, q, r in seen.log if s == stage and not r.has_error()}


def charges(tmp_path, n) -> list[float]:
    out = []
    for i in range(n):
        ledger = BudgetLedger.open(tmp_path / f"dev{i}")
        try:
            out.append(float(sum(float(np.sum(r.charge)) for r in ledger.records())))
        finally:
            ledger.close()
    return out
