"""A coordinator with only genuine devices that lies about the round's parameters, played against real
devices and ledgers over the loopback grid (Flower's SecAgg+ workflow and client mod, fedfilter's
consistency round).

Whatever it claims that the devices accept, every sum it can unmask must carry at least the noise
each device's main account charged for. Each test reads what the coordinator actually unmasked (the
sum Flower's workflow hands its strategy) and compares the exact Rényi divergence of that sum
(``helpers.budget_reference.mp_skellam_divergence``: Bessel functions at 50 digits) with the charge
in the device's ledger, at the order its filter uses. Both attacks below unmask a sum of fewer
honest reports than ``min_reports`` on a device that checks the claimed population, or that
authenticates the survivor set without the round's parameters.
"""

from __future__ import annotations

import mpmath
import numpy as np
import pytest
from flwr.common.secure_aggregation.secaggplus_constants import RECORD_KEY_CONFIGS, Key, Stage
from harness.secagg_loopback import LoopbackGrid, stage_of
from helpers import secagg as secagg_helpers
from helpers.budget_reference import mp_skellam_divergence
from helpers.secagg import RUN, node_id, run_round

from fedfilter.client.ledger.budget import BudgetLedger
from fedfilter.privacy.filters import rdp_order
from fedfilter.protocol.request import RoundSpec
from fedfilter.protocol.secagg.grid import grid_step, secaggplus_settings
from fedfilter.protocol.wire import REQUEST_RECORD

Z = 2.0**-8  # mu_total = (z C / gamma)^2 = 256 grid steps squared: mpmath sums the divergence exactly
LOW_NOISE = {"min-noise-multiplier": 1e-6}  # the owners accept this z (the test's noise is tiny on purpose)


def _forging_grid(monkeypatch, forge):
    """Make ``run_round`` build a grid whose coordinator rewrites each message (``forge(stage, msg)``)."""

    class Forging(LoopbackGrid):
        def send_and_receive(self, messages, *, timeout=None):
            messages = list(messages)
            for msg in messages:
                forge(stage_of(msg), msg)
            return super().send_and_receive(messages, timeout=timeout)

    monkeypatch.setattr(secagg_helpers, "LoopbackGrid", Forging)


def _main_charges(tmp_path, n):
    """Each device's recorded main-account charges (one per spend) and its filter's order."""
    out = []
    for i in range(n):
        ledger = BudgetLedger.open(tmp_path / f"dev{i}")
        try:
            out.append(([float(r.charge[0]) for r in ledger.records()], rdp_order(ledger.filter)))
        finally:
            ledger.close()
    return out


def _assert_every_unmasked_sum_is_covered(tmp_path, result, n, mu_of):
    """If the coordinator unmasked a sum, each device in it paid at least the exact divergence of the
    sum's noise at its own update: the sum holds ``len(results)`` reports, the noise of report ``j``
    is ``Sk(mu_of(j))``, and independent Skellams add."""
    if not result.strategy.aggregated:
        return
    in_sum = sorted(int(proxy.node_id) for proxy, _ in result.strategy.results)
    mu_sum = sum(mu_of(nid) for nid in in_sum)
    charges = _main_charges(tmp_path, n)
    for i in range(n):
        nid = node_id(i)
        if nid not in in_sum:
            continue
        k = [int(v) for a in result.captured.k[nid] for v in np.asarray(a).reshape(-1)]
        paid, alpha = charges[i]
        (charge,) = paid
        read = mp_skellam_divergence(k, mu_sum, alpha)
        assert read <= mpmath.mpf(charge) * alpha, (
            f"device {i} paid {charge * alpha:.4g} (order {alpha}) for a sum of {len(in_sum)} reports whose exact "
            f"divergence is {float(read):.4g}"
        )


def test_a_claimed_population_does_not_shrink_the_sum_below_min_reports(tmp_path, monkeypatch):
    """Five genuine devices, min-reports 10. The coordinator claims 20 sampled, 9 shares, threshold 5: a
    device that bounded the sum by ceil(n t / k) = 12 >= 10 trained and paid for a sum of 10 reports,
    and the coordinator unmasked all 5 (half the accounted noise variance). The bound a device can
    check is its own threshold: 5 < 10 is refused before anything is trained or spent."""
    n, m, t = 5, 10, 5

    def claim(stage, msg):
        if stage == Stage.SETUP:
            configs = msg.content.config_records[RECORD_KEY_CONFIGS]
            configs[Key.SAMPLE_NUMBER], configs[Key.SHARE_NUMBER] = 20, 9

    _forging_grid(monkeypatch, claim)
    spec = RoundSpec(RUN, 1, Z, 1.0, placement="distributed", min_reports=m)
    settings = secaggplus_settings(20)  # Flower's grid for the population it claims (n q < M holds for 20)
    over = {i: LOW_NOISE for i in range(n)}
    result = run_round(tmp_path, monkeypatch, n, spec=spec, threshold=t, settings=settings, node_over=over)
    _assert_every_unmasked_sum_is_covered(tmp_path, result, n, lambda nid: result.captured.mu[nid])
    secagg_helpers.assert_refused_before_training(tmp_path, result, n, "threshold 5", "below min-reports 10")


def test_different_requests_to_different_devices_cannot_share_one_sum(tmp_path, monkeypatch):
    """One request to the victim, one with a tenth of the noise multiplier to the four others (their
    owners accept it). Each device's own checks pass; a sum of the five carries 0.21 of the noise
    variance the victim paid for. The survivor-set tags now bind the request each device received:
    the groups' tags do not verify across them, and no share is revealed."""
    n, m, t = 5, 5, 5
    victim = node_id(0)

    def split(stage, msg):
        if stage == Stage.COLLECT_MASKED_VECTORS and int(msg.metadata.dst_node_id) != victim:
            msg.content.config_records[REQUEST_RECORD]["noise-multiplier"] = Z / 10

    _forging_grid(monkeypatch, split)
    spec = RoundSpec(RUN, 1, Z, 1.0, placement="distributed", min_reports=m)
    result = run_round(tmp_path, monkeypatch, n, spec=spec, threshold=t, node_over={i: LOW_NOISE for i in range(n)})
    assert set(result.captured.mu) == {node_id(i) for i in range(n)}  # every device trained and paid
    assert result.captured.mu[victim] > 50 * result.captured.mu[node_id(1)]
    _assert_every_unmasked_sum_is_covered(tmp_path, result, n, lambda nid: result.captured.mu[nid])
    assert not result.strategy.aggregated
    unmask = [r for r in result.grid.received if r._stage == Stage.UNMASK]
    assert unmask and all(r.has_error() and "tag on the survivor set is invalid" in r.error.reason for r in unmask)


@pytest.mark.parametrize("colluders", [0, 1])
def test_an_honest_round_on_the_rule_is_unmasked_and_covered(tmp_path, monkeypatch, colluders):
    """The control: the same devices on a graph the rule accepts (t = m + c) are unmasked, and the sum's
    exact divergence is within what each device paid."""
    n, m = 5, 3
    t = m + colluders
    _forging_grid(monkeypatch, lambda stage, msg: None)
    spec = RoundSpec(RUN, 1, Z, 1.0, placement="distributed", min_reports=m)
    over = {i: {**LOW_NOISE, "secagg-colluders": colluders} for i in range(n)}
    result = run_round(tmp_path, monkeypatch, n, spec=spec, threshold=t, node_over=over)
    assert result.strategy.aggregated and len(result.strategy.results) == n
    _assert_every_unmasked_sum_is_covered(tmp_path, result, n, lambda nid: result.captured.mu[nid])
    gamma = grid_step(1.0)
    assert result.captured.mu[node_id(0)] >= (Z / gamma) ** 2 / m * (1 - 1e-12)


def test_a_device_allowing_colluders_refuses_a_threshold_without_room_for_them(tmp_path, monkeypatch):
    n, m, t = 5, 3, 3
    _forging_grid(monkeypatch, lambda stage, msg: None)
    spec = RoundSpec(RUN, 1, Z, 1.0, placement="distributed", min_reports=m)
    over = {i: {**LOW_NOISE, "secagg-colluders": 1} for i in range(n)}
    result = run_round(tmp_path, monkeypatch, n, spec=spec, threshold=t, node_over=over)
    secagg_helpers.assert_refused_before_training(tmp_path, result, n, "threshold 3 with 1 colluders", "min-reports 3")
