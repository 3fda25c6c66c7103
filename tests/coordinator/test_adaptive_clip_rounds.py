"""Adaptive clipping end to end: the product's coordinator and devices, in both placements.

``IndividualFilterStrategy(FedAvg, adaptive_clipping=...)`` asks each device for its clip bit; every
device is a real ``ClientApp`` with the filter mod (and ``secure_aggregation_mod`` in distributed
placement) and its own ledger; ``tests/harness/secagg_loopback.py`` carries every message through
Flower's wire format in one process. Device ``i``'s update has the known norm ``NORMS[i]`` whatever
the model, so the true fraction within each round's clip is known. Checked independently of the
code under test: the clip trajectory against Andrew et al.'s Algorithm 1 recomputed here from the
public record's estimates, each estimate against the true fraction within the bit noise's std
(``sigma_b`` on the sum in distributed placement, ``sigma_b sqrt(n)`` in local), the released model
without the bit, and each device's charge against the exact Gaussian-DP cost of the report vector.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, Message, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp.strategy import FedAvg
from harness.secagg_loopback import LoopbackGrid

from fedfilter.client.filter_mod import individual_filter_mod
from fedfilter.client.ledger.budget import BudgetLedger
from fedfilter.client.secagg.mod import secure_aggregation_mod
from fedfilter.client.settings.node_config import enrol_device
from fedfilter.coordinator.public_ledger import PublicLedger
from fedfilter.coordinator.strategy import IndividualFilterStrategy
from fedfilter.protocol.adaptive_clip import AdaptiveClipping
from fedfilter.protocol.wire import ARRAYS_RECORD

KEYS, SHAPES = ["w", "b"], [(10, 20), (20,)]
DIM = 220
N, RUN = 10, "adaptive-e2e"
NORMS = np.linspace(0.1, 1.0, N)  # device i's update norm
Z_EFF, SIGMA_B, CLIP0 = 0.6, 1.0, 0.3
GAMMA, LR = 0.5, 0.5


def run(tmp_path, placement: str, rounds: int = 4):
    configs = {
        100 + i: {
            "ledger-dir": str(tmp_path / f"dev{i}"),
            "client-id": f"dev{i}",
            "budget-epsilon": 50.0,
            "worst-case-epsilon": 5000.0,
            "budget-delta": 1e-5,
            "filter": "rdp" if placement == "distributed" else "gdp",
            "reply-hold-s": 0,
            "noise-seed": 700 + i,
        }
        for i in range(N)
    }
    for config in configs.values():
        enrol_device(config)
    direction = np.random.default_rng(3).normal(size=DIM)
    direction /= np.linalg.norm(direction)

    def train(msg, ctx):
        step = direction * NORMS[ctx.node_id - 100]
        record = msg.content[ARRAYS_RECORD]
        parts = np.split(step, [200])
        new = {
            k: Array((record[k].numpy().astype(np.float64) + p.reshape(s)).astype(np.float32))
            for k, p, s in zip(KEYS, parts, SHAPES)
        }
        return Message(RecordDict({ARRAYS_RECORD: ArrayRecord(new)}), reply_to=msg)

    mods = [secure_aggregation_mod, individual_filter_mod] if placement == "distributed" else [individual_filter_mod]

    def app(nid):
        client = ClientApp(mods=mods)
        client.train()(train)
        return client

    grid = LoopbackGrid({nid: app(nid) for nid in configs}, configs)
    strategy = IndividualFilterStrategy(
        FedAvg(min_available_nodes=N, fraction_evaluate=0.0),
        noise_multiplier=Z_EFF,
        clip=CLIP0,
        placement=placement,
        min_reports=N if placement == "distributed" else 1,
        run_name=RUN,
        public_ledger=str(tmp_path / "public.sqlite"),
        adaptive_clipping=AdaptiveClipping(
            target_clipped_quantile=GAMMA, clip_norm_lr=LR, clipped_count_stddev=SIGMA_B
        ),
    )
    initial = ArrayRecord({k: Array(np.zeros(s, np.float32)) for k, s in zip(KEYS, SHAPES)})
    result = strategy.start(grid=grid, initial_arrays=initial, num_rounds=rounds, timeout=60)
    ledger = PublicLedger(str(tmp_path / "public.sqlite"))
    try:
        records = ledger.records(RUN)
    finally:
        ledger.close()
    return strategy, result, records


@pytest.mark.parametrize("placement", ["local", "distributed"])
def test_the_clip_follows_the_released_bits_by_algorithm_1(tmp_path, placement):
    strategy, result, records = run(tmp_path, placement)
    assert [r.released for r in records] == [True] * 4
    assert list(result.arrays.keys()) == KEYS  # the bit never reaches the model
    clip = CLIP0
    bit_noise = SIGMA_B * (math.sqrt(N) if placement == "local" else 1.0) / N  # std of the estimate
    for record in records:
        assert record.request.clip == pytest.approx(clip, rel=1e-12)
        assert record.request.clipped_count_stddev == SIGMA_B
        # the request's z is the update's: (z_eff^-2 - (2 sigma_b)^-2)^-1/2
        assert record.request.noise_multiplier == pytest.approx((Z_EFF**-2 - (2 * SIGMA_B) ** -2) ** -0.5, rel=1e-12)
        true_fraction = float(np.mean(NORMS <= clip))
        assert abs(record.unclipped_fraction - true_fraction) < 5 * bit_noise
        clip = clip * math.exp(-LR * (record.unclipped_fraction - GAMMA))  # Andrew et al., Algorithm 1
    assert strategy.current_clip == pytest.approx(clip, rel=1e-12)


def test_each_local_device_pays_for_its_update_and_its_bit(tmp_path):
    _, _, records = run(tmp_path, "local", rounds=2)
    for i in range(N):
        ledger = BudgetLedger.open(tmp_path / f"dev{i}")
        try:
            spends = ledger.records()
        finally:
            ledger.close()
        for spend, record in zip(spends, records):
            clip, z = record.request.clip, record.request.noise_multiplier
            c = z * clip / SIGMA_B
            # the report vector: the update clipped to C, then +-c/2; mu = ||vector|| / (z C)
            expected = math.hypot(min(NORMS[i], clip), c / 2)
            assert spend.sensitivity == pytest.approx(expected, rel=1e-3)
            assert spend.noise_std == pytest.approx(z * clip, rel=1e-12)
