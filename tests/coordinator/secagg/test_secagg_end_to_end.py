"""Distributed rounds end to end: the product's coordinator and devices through Flower's real SecAgg+.

The coordinator is ``IndividualFilterStrategy(FedAvg, placement="distributed")`` (``start``, its
public ledger); every device is ``ClientApp(mods=[secure_aggregation_mod, individual_filter_mod])``
with its own budget ledger and a seeded noise stream; ``tests/harness/secagg_loopback.py`` carries every
message through Flower's wire format, in one process, without Ray. Test hooks (never in a reply):
a wrapper around the devices' Skellam sampler records each device's integer update ``k`` and report
``y = k + noise``; a wrapper around ``decode_sum`` records the integer sum the coordinator unmasked.

Checked independently of the code under test: the unmasked sum against the devices' own reports;
the released noise against the devices' own noise draws; each spend against the closed form
(Agarwal, Kairouz, Liu 2021, recomputed here) and against the exact Rényi divergence of the Skellam
mechanism at the device's actual integer update (``skellam_rdp_exact``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, Message, RecordDict
from flwr.clientapp import ClientApp
from flwr.common import bytes_to_ndarray
from flwr.common.secure_aggregation.secaggplus_constants import RECORD_KEY_CONFIGS, Key
from flwr.serverapp.strategy import FedAvg, Result
from harness.secagg_loopback import LoopbackGrid, stage_of

import fedfilter.client.mechanisms.skellam as release_distributed
from fedfilter.client.filter_mod import individual_filter_mod
from fedfilter.client.ledger.budget import BudgetLedger
from fedfilter.client.mechanisms.gaussian_noise import round_noise_stream
from fedfilter.client.mechanisms.skellam_noise import add_skellam_noise
from fedfilter.client.secagg.mod import secure_aggregation_mod
from fedfilter.client.settings.node_config import enrol_device
from fedfilter.coordinator.public_ledger import PublicLedger
from fedfilter.coordinator.secagg import secure_round
from fedfilter.coordinator.strategy import IndividualFilterStrategy, NothingReleasedError
from fedfilter.privacy.filters import rdp_order
from fedfilter.privacy.rounding import down
from fedfilter.privacy.skellam import skellam_rdp_exact
from fedfilter.protocol.secagg.grid import grid_step
from fedfilter.protocol.wire import ARRAYS_RECORD, CONSISTENCY_RECORD, REQUEST_RECORD, round_spec_from_record

KEYS = ["w", "b"]
SHAPES = [(20, 40), (40,)]  # 840 coordinates: enough for an empirical look at the noise's variance
N, Z, CLIP, RUN = 10, 0.5, 1.0, "secagg-e2e"  # z = 0.5: the devices' default minimum
GAMMA = grid_step(CLIP)
COLLECT = "collect_masked_vectors"


def nid_of(i: int) -> int:
    return 100 + i


def initial_model() -> list[np.ndarray]:
    return [np.zeros(s, dtype=np.float32) for s in SHAPES]


def steps(n: int) -> dict[int, list[np.ndarray]]:
    """Each device's training step: 0 or +-16 or +-32 grid steps per coordinate (norm below 0.25 < C).
    From the zero model the update is exactly that, so round 1's k is known and has two distinct |k_i|
    (the exact divergence, slow at this variance, is computed once per distinct value)."""
    rng = np.random.default_rng(11)
    return {nid_of(i): [(rng.integers(-2, 3, s) * 16 * GAMMA).astype(np.float32) for s in SHAPES] for i in range(n)}


@dataclass
class Federation:
    grid: LoopbackGrid
    strategy: IndividualFilterStrategy
    result: object
    k: dict = field(default_factory=dict)  # (node, round) -> the device's integer update
    y: dict = field(default_factory=dict)  # (node, round) -> its integer report k + noise
    mu: dict = field(default_factory=dict)  # (node, round) -> the share variance it drew
    sums: dict = field(default_factory=dict)  # round -> (n reports, the unmasked integer sum)


def run_federation(
    tmp_path, monkeypatch, *, min_reports=6, rounds=1, drop=None, n=N, epsilon=8.0, num_shares="auto"
) -> Federation:
    configs = {
        nid_of(i): {
            "ledger-dir": str(tmp_path / f"dev{i}"),
            "client-id": f"dev{i}",
            "budget-epsilon": epsilon,
            "worst-case-epsilon": 1000.0,  # does not bind: this test is about the main account
            "budget-delta": 1e-5,
            "filter": "rdp",
            "after-exhaustion": "leave",
            "reply-hold-s": 0,
            "noise-seed": 5000 + i,
        }
        for i in range(n)
    }
    for config in configs.values():
        enrol_device(config)
    step = steps(n)

    def train(msg, ctx):
        record = msg.content[ARRAYS_RECORD]
        new = {key: Array((record[key].numpy() + s).astype(np.float32)) for key, s in zip(KEYS, step[ctx.node_id])}
        return Message(RecordDict({ARRAYS_RECORD: ArrayRecord(new)}), reply_to=msg)

    fed = Federation(grid=None, strategy=None, result=None)  # type: ignore[arg-type]
    current = [None]
    sampler = release_distributed.add_skellam_noise

    def sampler_hook(k, mu, stream):
        y = sampler(k, mu, stream)
        fed.k[current[0]], fed.y[current[0]], fed.mu[current[0]] = [a.copy() for a in k], [a.copy() for a in y], mu
        return y

    monkeypatch.setattr(release_distributed, "add_skellam_noise", sampler_hook)
    decode = secure_round.decode_sum

    def decode_hook(aggregated, n_reports, q):
        sums = decode(aggregated, n_reports, q)
        fed.sums[len(fed.sums) + 1] = (n_reports, [s.copy() for s in sums])
        return sums

    monkeypatch.setattr(secure_round, "decode_sum", decode_hook)

    def device(nid):
        app = ClientApp(mods=[secure_aggregation_mod, individual_filter_mod])
        app.train()(train)

        def deliver(msg, ctx):
            if REQUEST_RECORD in msg.content:
                current[0] = (nid, round_spec_from_record(msg.content[REQUEST_RECORD]).round_id)
            return app(msg, ctx)

        return deliver

    fed.grid = LoopbackGrid({nid: device(nid) for nid in configs}, configs, drop=drop)
    fed.strategy = IndividualFilterStrategy(
        FedAvg(min_available_nodes=n, fraction_evaluate=0.0),
        noise_multiplier=Z,
        clip=CLIP,
        placement="distributed",
        min_reports=min_reports,
        run_name=RUN,
        public_ledger=str(tmp_path / "public.sqlite"),
        secagg_num_shares=num_shares,
    )
    initial = ArrayRecord({k: Array(a) for k, a in zip(KEYS, initial_model())})
    try:
        fed.result = fed.strategy.start(grid=fed.grid, initial_arrays=initial, num_rounds=rounds, timeout=60)
    except NothingReleasedError:  # no round released: what Flower's loop returned holds no arrays
        fed.result = Result()
    return fed


def mu_total() -> float:
    """The accounted Skellam variance of the released sum, grid units: (z C / gamma)^2 (rounded down)."""
    return float(down((Z * CLIP / GAMMA) ** 2))


_EXACT: dict[tuple[int, float], float] = {}


def exact_rdp(ints: np.ndarray, alpha: float) -> float:
    """``skellam_rdp_exact(ints, mu_total, alpha)``: a sum over coordinates, each distinct |k_i| computed once
    (and kept across devices: the same per-coordinate divergence)."""
    values, counts = np.unique(np.abs(ints), return_counts=True)
    total = 0.0
    for v, c in zip(values.tolist(), counts.tolist()):
        if v and (v, alpha) not in _EXACT:
            _EXACT[(v, alpha)] = skellam_rdp_exact([v], mu_total(), alpha)
        total += c * _EXACT[(v, alpha)] if v else 0.0
    return total


def akl_rho(l1: float, l2: float, mu: float, alpha: float) -> float:
    """Agarwal, Kairouz, Liu 2021 (Thm 3.5 / Cor 3.6) per unit order, written out here: eps(alpha) / alpha,
    interpolated between integer orders by the convexity of (alpha - 1) D_alpha."""

    def at(m):
        return m * l2 * l2 / (2 * mu) + min(((2 * m - 1) * l2 * l2 + 6 * l1) / (4 * mu * mu), 3 * l1 / (2 * mu))

    n, t = math.floor(alpha), alpha - math.floor(alpha)
    if n < 2:
        eps = at(2)
    elif t == 0:
        eps = at(n)
    else:
        eps = ((1 - t) * (n - 1) * at(n) + t * n * at(n + 1)) / (alpha - 1)
    return eps / alpha


def device_spends(tmp_path, i):
    ledger = BudgetLedger.open(tmp_path / f"dev{i}")
    try:
        return ledger.records(RUN), ledger.filter, ledger.state()
    finally:
        ledger.close()


def check_spend(tmp_path, fed, i, round_id, exact=True):
    """The device's recorded charge: the closed form at its actual k, never below the exact divergence."""
    records, filt, state = device_spends(tmp_path, i)
    (rec,) = [r for r in records if r.round_id == round_id]
    k = fed.k[(nid_of(i), round_id)]
    ints = np.concatenate([a.ravel() for a in k]).astype(np.int64)
    l1, l2 = float(np.abs(ints).sum()), math.sqrt(float((ints * ints).sum()))
    alpha = rdp_order(filt)
    closed = akl_rho(l1, l2, mu_total(), alpha)
    charge = float(rec.charge.sum())
    assert charge == pytest.approx(closed, rel=1e-9) and charge >= closed
    if exact:
        assert 0 < exact_rdp(ints, alpha) / alpha <= charge
    assert rec.placement == "distributed" and rec.status == "contributed"
    assert filt.within_budget(state).all()
    if round_id == 1:  # k is the device's own update (below C: not clipped), exactly on the grid
        for got, s in zip(k, steps(N)[nid_of(i)]):
            np.testing.assert_array_equal(got.ravel() * GAMMA, s.astype(np.float64).ravel())
    return rec


def check_sum(fed, round_id, in_sum):
    """The integer sum the coordinator unmasked is exactly the sum of the reports of ``in_sum``."""
    n, sums = fed.sums[round_id]
    assert n == len(in_sum)
    for index, got in enumerate(sums):
        want = sum(fed.y[(nid, round_id)][index] for nid in in_sum).reshape(got.shape)
        np.testing.assert_array_equal(got, want)
    return n, sums


def test_ten_devices_the_unmasked_sum_is_exactly_the_sum_of_their_integer_reports(tmp_path, monkeypatch):
    fed = run_federation(tmp_path, monkeypatch, rounds=2)
    for round_id in (1, 2):
        check_sum(fed, round_id, [nid_of(i) for i in range(N)])
        for i in range(N):
            check_spend(tmp_path, fed, i, round_id, exact=round_id == 1)
    with PublicLedger(tmp_path / "public.sqlite", read_only=True) as ledger:
        records = ledger.records(RUN)
    assert [(r.clients_sampled, r.reports_received, r.replies_dropped, r.released) for r in records] == [
        (N, N, 0, True)
    ] * 2
    # Round 2 started from round 1's release: the model moved by the released mean.
    assert set(fed.result.arrays.keys()) == set(KEYS)


def test_the_coordinator_holds_masked_vectors_and_the_sum_only(tmp_path, monkeypatch):
    fed = run_federation(tmp_path, monkeypatch)
    q = 2**28  # secaggplus_settings(10)
    collected = 0
    for msg in fed.grid.received:
        assert all(len(record) == 0 for record in msg.content.array_records.values())  # every array cleared
        for name, record in msg.content.metric_records.items():
            assert (name, dict(record)) == ("fitres.num_examples", {"num_examples": 1})
        assert set(msg.content.config_records) <= {
            RECORD_KEY_CONFIGS,
            CONSISTENCY_RECORD,
            "fitres.metrics",
            "fitres.status",
        }
        configs = msg.content.config_records[RECORD_KEY_CONFIGS]
        if Key.MASKED_PARAMETERS not in configs:
            continue
        collected += 1
        y = fed.y[(int(msg.metadata.src_node_id), 1)]
        masked = [bytes_to_ndarray(b).astype(np.int64).ravel() for b in configs[Key.MASKED_PARAMETERS]][1:]
        for m, report in zip(masked, y):
            plain = np.mod(report.ravel(), q)  # the report as Flower quantizes it: (y mod q - q/2) + q/2
            assert np.mean(m == plain) < 0.01 and np.mean(m >= q) > 0.5  # masked: uniform on [0, 2**32)
    assert collected == N

    # No reply and no coordinator object holds an individual report: only the strategy's counts.
    def holds_a_message(value) -> bool:
        values = value.values() if isinstance(value, dict) else value if isinstance(value, (list, tuple)) else [value]
        return any(isinstance(v, Message) for v in values)

    held = [name for name, value in vars(fed.strategy).items() if holds_a_message(value)]
    assert held == [], held


@pytest.mark.parametrize("stage", [COLLECT, "unmask"])
def test_dropouts_after_the_masks_are_shared_leave_at_least_the_accounted_noise(tmp_path, monkeypatch, stage):
    dropped = {nid_of(2), nid_of(5), nid_of(7)}  # 3 of 10: more than the default sparse graph assumes
    fed = run_federation(
        tmp_path, monkeypatch, min_reports=6, drop=lambda st, nid: st == stage and nid in dropped, num_shares=1.0
    )
    # Dropped at "unmask", a device's masked report is already in the sum; at COLLECT it is not.
    in_sum = [nid_of(i) for i in range(N) if not (stage == COLLECT and nid_of(i) in dropped)]
    n, sums = check_sum(fed, 1, in_sum)
    assert fed.strategy.last_outcome.released and n >= 6
    # The released sum's noise is exactly the surviving devices' seeded draws (recomputed from seeds).
    noise_sum = [np.zeros(s, dtype=np.int64) for s in SHAPES]
    for nid in in_sum:
        i = nid - 100
        mu = fed.mu[(nid, 1)]
        zeros = [np.zeros_like(k) for k in fed.k[(nid, 1)]]
        draws = add_skellam_noise(zeros, mu, round_noise_stream(5000 + i, RUN, 1))
        for index, (y, k, e) in enumerate(zip(fed.y[(nid, 1)], fed.k[(nid, 1)], draws)):
            np.testing.assert_array_equal(y, k + e)
            noise_sum[index] += np.asarray(e).reshape(SHAPES[index])
    k_sum = [sum(fed.k[(nid, 1)][index] for nid in in_sum).reshape(s) for index, s in enumerate(SHAPES)]
    for got, ks, e in zip(sums, k_sum, noise_sum):
        np.testing.assert_array_equal(got - ks, e)
    # Each share has variance mu_share = up(mu_total / m); n >= m of them carry at least mu_total.
    shares = {fed.mu[(nid, 1)] for nid in in_sum}
    (mu_share,) = shares
    assert mu_share * 6 >= mu_total() and n * mu_share >= mu_total()
    observed = np.var(np.concatenate([e.ravel() for e in noise_sum]).astype(np.float64))
    assert observed == pytest.approx(n * mu_share, rel=0.2)  # 840 draws: sd of the estimate ~5 %
    # Every device that trained paid exactly its own charge, the dropped ones included.
    for i in range(N):
        check_spend(tmp_path, fed, i, 1)


@pytest.mark.parametrize("stage", [COLLECT, "share_keys"])
def test_a_round_below_the_threshold_is_not_released_and_costs_no_device_more_than_its_charge(
    tmp_path, monkeypatch, stage
):
    dropped = {nid_of(0), nid_of(3), nid_of(9)}
    fed = run_federation(tmp_path, monkeypatch, min_reports=8, drop=lambda st, nid: st == stage and nid in dropped)
    assert not fed.sums and not fed.strategy.last_outcome.released  # never unmasked, never released
    assert len(fed.result.arrays) == 0  # the model stays the initial one
    assert "unmask" not in {stage_of(m) for m in fed.grid.sent}
    for i in range(N):
        records, _, _ = device_spends(tmp_path, i)
        if stage == COLLECT:  # every device trained and paid once, exactly its charge
            assert len(records) == 1
            check_spend(tmp_path, fed, i, 1)
        else:  # the protocol stopped before any device trained: nothing spent anywhere
            assert records == [] and not fed.k
    with PublicLedger(tmp_path / "public.sqlite", read_only=True) as ledger:
        (record,) = ledger.records(RUN)
    assert (record.released, record.reports_received, record.aggregate_norm) == (False, 0, 0.0)
