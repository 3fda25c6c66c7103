"""A Sybil coordinator: it plays the other t SecAgg+ nodes itself and reads one
device's report exactly. The device's worst-case account covers exactly what it could read.

Flower's SecAgg+ workflow and client mod run over the loopback grid (``tests/harness/secagg_loopback.py``,
``test_secagg_device.run_round``). Node 0 is the victim, a real device. The other t nodes are the
coordinator's own: it generated their keys and knows every value they send (here: they run the same
app, and the coordinator reads their reports through the test hook, as it would from its own
processes). Every check the victim makes passes; the unmasked sum minus the Sybils' reports is the
victim's report ``k + Sk(mu_share)``, which carries 1/t of the noise the main account charges.
"""

from __future__ import annotations

import mpmath
import numpy as np
from flwr.common import parameters_to_ndarrays
from helpers.budget_reference import mp_skellam_divergence as mp_divergence
from helpers.secagg import DTYPES, RUN, node_id, run_round

from fedfilter.client.ledger.budget import BudgetLedger
from fedfilter.client.mechanisms.gaussian_noise import round_noise_stream
from fedfilter.client.mechanisms.skellam_noise import add_skellam_noise
from fedfilter.privacy.filters import rdp_order
from fedfilter.privacy.renyi import epsilon_from_rdp
from fedfilter.privacy.skellam import skellam_rdp_exact
from fedfilter.protocol.request import RoundSpec
from fedfilter.protocol.secagg.grid import decode_sum, grid_step

DELTA = 1e-5
T = 4  # the reconstruction threshold, = min_reports; the coordinator forges all T other nodes
Z = 2.0**-8  # mu_total = (z C / gamma)^2 = 256 grid steps squared, mu_share = 64: mpmath can sum it


def test_a_sybil_coordinator_reads_one_report_and_the_worst_case_account_covers_it(tmp_path, monkeypatch):
    n = T + 1
    victim = node_id(0)
    over = {i: {"min-noise-multiplier": 1e-6} for i in range(n)}
    over[0] = {"min-noise-multiplier": 1e-6, "budget-epsilon": 8.0, "worst-case-epsilon": 60.0}
    spec = RoundSpec(RUN, 1, Z, 1.0, placement="distributed", min_reports=T)
    result = run_round(tmp_path, monkeypatch, n, spec=spec, threshold=T, node_over=over)
    assert result.strategy.aggregated and len(result.strategy.results) == n  # every device check passed

    # The coordinator subtracts its Sybils' reports from the unmasked sum: the victim's report, exactly.
    q = result.settings["quantization_range"]
    decoded = decode_sum(parameters_to_ndarrays(result.strategy.results[0][1].parameters), n, q)
    floating = [d for d in DTYPES if np.dtype(d).kind == "f"]
    sybils = [node_id(i) for i in range(1, n)]
    read = []
    for j in range(len(floating)):
        own = sum(result.captured.y[nid][j] for nid in sybils)
        read.append(np.mod(decoded[j] - own + q // 2, q) - q // 2)
    for got, y in zip(read, result.captured.y[victim]):
        np.testing.assert_array_equal(got, y)
    # ... which is k + Sk(mu_share): its own share of noise only (recomputed from its seed).
    mu_share = result.captured.mu[victim]
    k_arrays = result.captured.k[victim]
    noise = add_skellam_noise([np.zeros_like(a) for a in k_arrays], mu_share, round_noise_stream(1000, RUN, 1))
    for got, k, e in zip(read, k_arrays, noise):
        np.testing.assert_array_equal(got, k + e)
    gamma = grid_step(1.0)
    mu_total = float(np.nextafter((Z / gamma) ** 2, 0))
    assert mu_share == float(np.nextafter(mu_total / T, np.inf))

    # The victim's ledger: the worst-case charge covers the exact divergence of that single share at
    # the actual update; the main charge (for the sum's noise) does not.
    ledger = BudgetLedger.open(tmp_path / "dev0")
    try:
        (rec,) = ledger.records()
        worst, main = ledger.worst_filter, ledger.filter
        assert worst is not None and rec.status == "contributed" and rec.worst_charge is not None
        summary = ledger.summary()
    finally:
        ledger.close()
    k = [int(v) for a in k_arrays for v in np.asarray(a).reshape(-1)]
    assert sum(v * v for v in k) > 0
    alpha_w, alpha = rdp_order(worst), rdp_order(main)
    read_alone = mp_divergence(k, mu_share, alpha_w)
    assert mpmath.almosteq(read_alone, skellam_rdp_exact(k, mu_share, alpha_w), rel_eps=1e-9)
    assert read_alone <= float(rec.worst_charge[0]) * alpha_w
    assert mp_divergence(k, mu_share, alpha) > float(rec.charge[0]) * alpha  # the main account alone: no
    # What the device prints covers the read: (eps_worst spent, delta) at least the read's epsilon.
    eps_read = epsilon_from_rdp([alpha_w], [float(read_alone)], DELTA)
    assert summary["worst_case"]["spent_epsilon"] >= eps_read
    assert summary["worst_case"]["spent_epsilon"] <= summary["worst_case"]["budget_epsilon"]


def test_a_device_without_a_worst_case_budget_refuses_the_secagg_round_before_training(tmp_path, monkeypatch):
    from helpers import secagg as test_secagg_device
    from helpers.secagg import assert_refused_before_training

    plain = test_secagg_device.node_config

    def without_worst_case(tmp, i, **over):
        config = plain(tmp, i, **over)
        config.pop("worst-case-epsilon")
        return config

    monkeypatch.setattr(test_secagg_device, "node_config", without_worst_case)
    n = 4
    for i in range(n):  # the owner enrolled the budget only
        BudgetLedger.enrol(
            tmp_path / f"dev{i}", client_id=f"dev{i}", epsilon=8.0, delta=DELTA, filter_kind="rdp"
        ).close()
    result = run_round(tmp_path, monkeypatch, n, threshold=3, enrol=False)
    assert_refused_before_training(tmp_path, result, n, "worst-case-epsilon", "forges the other SecAgg+ peers")
