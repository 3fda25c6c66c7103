"""A malicious coordinator for SecAgg+ rounds: it watches and forges messages between the stages.

``run_attack`` runs a round whose coordinator is ``attacker(seen, forge)``; ``refused``/``answered``
name the devices that refused or answered a stage and ``charges`` reads what each device paid;
``assert_no_single_report`` does what the audit did with what the attacker gathered: collect both kinds
of key share of a victim, strip its masks off its masked vector and compare with its own report.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, Message, RecordDict
from flwr.clientapp import ClientApp
from flwr.common import bytes_to_ndarray
from flwr.common.secure_aggregation.secaggplus_constants import RECORD_KEY_CONFIGS, Key, Stage
from flwr.serverapp.strategy import FedAvg
from harness.secagg_loopback import LoopbackGrid, stage_of

import fedfilter.client.mechanisms.skellam as release_distributed
from fedfilter.client.filter_mod import individual_filter_mod
from fedfilter.client.ledger.budget import BudgetLedger
from fedfilter.client.secagg.mod import secure_aggregation_mod
from fedfilter.client.settings.node_config import enrol_device
from fedfilter.coordinator.run_log import NothingReleasedError
from fedfilter.coordinator.secagg import secure_round
from fedfilter.coordinator.strategy import IndividualFilterStrategy
from fedfilter.protocol.secagg.grid import grid_step, secaggplus_settings
from fedfilter.protocol.secagg.keys import bytes_to_private_key, bytes_to_public_key, generate_shared_key
from fedfilter.protocol.secagg.masks import aes_mask_gen
from fedfilter.protocol.secagg.shamir import combine_shares
from fedfilter.protocol.wire import ARRAYS_RECORD

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
    strategy: IndividualFilterStrategy | None = None  # the coordinator (its last_outcome: the round's counts)


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

        def consistency_stage(self, grid, context, state):  # the consistency round (absent before it existed)
            if consistency is not None:
                return consistency(self, grid, context, state)
            return super().consistency_stage(grid, context, state)

    return Attacker


def run_attack(
    tmp_path,
    monkeypatch,
    n,
    workflow,
    *,
    min_reports=2,
    seen: Seen | None = None,
    extra: dict | None = None,
    rounds: int = 1,
    prepare=None,
    data_seed: int = 5,
) -> Seen:
    """``prepare(configs)``: called after the devices are enrolled (node id -> node config), e.g. to spend
    their budgets in an earlier run; ``data_seed``: the devices' training steps (their "data")."""
    seen = seen if seen is not None else Seen()
    configs = {
        nid_of(i): {
            "ledger-dir": str(tmp_path / f"dev{i}"),
            "client-id": f"dev{i}",
            "budget-epsilon": 8.0,
            # Distributed rounds need a worst-case account; it does not bind here: these
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
    if prepare is not None:
        prepare(configs)
    gamma = grid_step(CLIP)
    rng = np.random.default_rng(data_seed)
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
        secagg_num_shares=1.0,  # Flower's full graph: the attacks below are written for its threshold
    )
    seen.strategy = strategy
    initial = ArrayRecord({k: Array(np.zeros(s, dtype=np.float32)) for k, s in zip(["w", "b"], SHAPES)})
    try:
        strategy.start(grid=grid, initial_arrays=initial, num_rounds=rounds, timeout=60)
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


# --- what the attacker reads out of what it gathered -----------------------------------------
def gathered_shares(seen: Seen, victim: int) -> tuple[list[bytes], list[bytes]]:
    """The victim's shares of its private-mask seed and of ``sk1`` among the unmask replies (Flower
    lists the active ids' seed shares first, then the dropped ids' sk1 shares)."""
    seed_shares, sk1_shares = [], []
    for s, q, r in seen.log:
        if s != Stage.UNMASK or r.has_error():
            continue
        n_active = len(configs_of(q)[Key.ACTIVE_NODE_ID_LIST])
        for index, (nid, share) in enumerate(zip(configs_of(r)[Key.NODE_ID_LIST], configs_of(r)[Key.SHARE_LIST])):
            if nid == victim:
                (seed_shares if index < n_active else sk1_shares).append(share)
    return seed_shares, sk1_shares


def unmask(seen: Seen, victim: int, seed_shares: list[bytes], sk1_shares: list[bytes]) -> list[np.ndarray] | None:
    """The victim's quantized report from its masked vector and both kinds of share, or None when the
    coordinator holds fewer than the threshold of either kind (or no masked vector of it)."""
    setup = {
        int(r.metadata.src_node_id): configs_of(r) for s, q, r in seen.log if s == Stage.SETUP and not r.has_error()
    }
    collect = [
        (q, r)
        for s, q, r in seen.log
        if s == Stage.COLLECT_MASKED_VECTORS and not r.has_error() and r.metadata.src_node_id == victim
    ]
    setup_request = next(q for s, q, r in seen.log if s == Stage.SETUP)
    threshold, mod_range = configs_of(setup_request)[Key.THRESHOLD], configs_of(setup_request)[Key.MOD_RANGE]
    if not collect or len(seed_shares) < threshold or len(sk1_shares) < threshold:
        return None
    (request, reply) = collect[0]
    seed, sk1 = combine_shares(seed_shares), combine_shares(sk1_shares)
    vector = [bytes_to_ndarray(b).astype(np.int64) for b in configs_of(reply)[Key.MASKED_PARAMETERS]]
    shapes = [a.shape for a in vector]
    vector = [v - m for v, m in zip(vector, aes_mask_gen(seed, mod_range, shapes))]
    for peer in configs_of(request)[Key.SOURCE_LIST]:  # the neighbours it added pairwise masks with
        shared = generate_shared_key(bytes_to_private_key(sk1), bytes_to_public_key(setup[peer][Key.PUBLIC_KEY_1]))
        sign = -1 if victim > peer else 1
        vector = [v + sign * m for v, m in zip(vector, aes_mask_gen(shared, mod_range, shapes))]
    return [np.mod(v, mod_range) for v in vector[1:]]  # the first array is Flower's weight factor


def is_report(seen: Seen, victim: int, got: list[np.ndarray]) -> bool:
    q = secaggplus_settings(len(seen.grid.apps))["quantization_range"]
    return all(np.array_equal(g.ravel(), np.mod(a.ravel(), q)) for g, a in zip(got, seen.y[victim]))


def assert_no_single_report(seen: Seen) -> None:
    for victim in seen.y:
        got = unmask(seen, victim, *gathered_shares(seen, victim))
        if got is not None:
            exact = "and read its single report exactly" if is_report(seen, victim, got) else ""
            pytest.fail(f"the coordinator gathered both kinds of key share of node {victim} {exact}")
