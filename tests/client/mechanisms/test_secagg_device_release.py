"""The Skellam release itself (``client/mechanisms/skellam.py``): what it charges, that a device stays
within its budget over many rounds, the ledger's discipline (replays, quotas, commit before noise), and
the filter it needs."""

from __future__ import annotations

import math
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from helpers.skellam_release import release_skellam

from fedfilter.client.ledger.budget import BudgetLedger
from fedfilter.client.ledger.storage import ReplayError
from fedfilter.client.mechanisms.gaussian_noise import round_noise_stream
from fedfilter.client.mechanisms.skellam import skellam_grid
from fedfilter.client.settings.policy import ClientPolicy
from fedfilter.privacy.filters import rdp_order
from fedfilter.privacy.rounding import down
from fedfilter.privacy.skellam import integer_norms, l2_up, skellam_charge
from fedfilter.protocol.request import RoundSpec, RoundSpecError
from fedfilter.protocol.secagg.grid import grid_step, secaggplus_settings

POLICY = ClientPolicy(allow_distributed=True)
N_SAMPLED = 10
Q = secaggplus_settings(N_SAMPLED)["quantization_range"]


def request(round_id: int, *, z=1.0, clip=1.0, m=5, run="run-r") -> RoundSpec:
    return RoundSpec(run, round_id, z, clip, placement="distributed", min_reports=m)


def grid_for(spec: RoundSpec):
    return skellam_grid(spec, target_range=Q, sample_num=N_SAMPLED)


def enrol(tmp_path, name="dev", *, epsilon=4.0, kind="rdp", run_quota=1.0, worst=1000.0) -> BudgetLedger:
    # A worst-case budget that does not bind: these tests are about the main account (test_worst_case*).
    return BudgetLedger.enrol(
        tmp_path / name,
        client_id=name,
        epsilon=epsilon,
        delta=1e-5,
        filter_kind=kind,
        run_quota=run_quota,
        worst_case_epsilon=worst,
    )


def update(rng, scale=0.5, sizes=(12, 5)):
    return [(rng.normal(size=s) * scale).astype(np.float32) for s in sizes]


def test_the_grid_is_public_arithmetic_of_the_request():
    spec = request(0, z=1.3, clip=0.75, m=4)
    g = grid_for(spec)
    assert g.gamma == grid_step(0.75) and 2**12 <= 0.75 / g.gamma < 2**13
    ratio = 1.3 * 0.75 / g.gamma
    assert g.mu_total == float(down(ratio * ratio)) and g.mu_total <= ratio * ratio
    assert g.mu_share * 4 >= g.mu_total and g.mu_share == np.nextafter(g.mu_total / 4, np.inf)
    assert g.noise_std == math.sqrt(g.mu_share) * g.gamma


def test_the_charge_is_the_skellam_charge_at_the_snapped_updates_norms(tmp_path):
    ledger = enrol(tmp_path)
    rng = np.random.default_rng(1)
    spec = request(0, z=2.0, clip=1.0, m=3)
    g = grid_for(spec)
    rel = release_skellam(ledger, POLICY, spec, update(rng, 0.02), g, noise_seed=5)
    assert rel.status == "contributed"
    (rec,) = ledger.records()
    # Recover k from the public report only for this check: y - noise, with the seed's noise.
    from fedfilter.client.mechanisms.skellam_noise import add_skellam_noise

    sizes = [(12,), (5,)]
    noise = add_skellam_noise([np.zeros(s, np.int64) for s in sizes], g.mu_share, round_noise_stream(5, "run-r", 0))
    y = [np.mod(np.asarray(r, dtype=np.int64) + Q // 2, Q) for r in rel.arrays]
    k = [np.mod(a - e + Q // 2, Q) - Q // 2 for a, e in zip(y, noise)]
    l1, l2sq = integer_norms(k)
    assert l2sq > 0 and rec.sensitivity == l2_up(l2sq) * g.gamma
    np.testing.assert_array_equal(rec.charge, skellam_charge(ledger.filter, l1, l2_up(l2sq), g.mu_total))
    # Independently: Agarwal-Kairouz-Liu's bound written out. The charge (rho units, at the filter's
    # order alpha) lies between the Gaussian term at alpha and the bound at ceil(alpha) (D_alpha is
    # non-decreasing in alpha), and is close to the Gaussian charge of the same norm at the accounted
    # std z C (the sum's noise).
    alpha = rdp_order(ledger.filter)
    l2, mu, top = l2_up(l2sq), g.mu_total, math.ceil(alpha)
    discrete = min(((2 * top - 1) * l2**2 + 6 * l1) / (4 * mu**2), 3 * l1 / (2 * mu))
    charge = float(rec.charge[0])
    assert l2**2 / (2 * mu) <= charge <= (top * l2**2 / (2 * mu) + discrete) / alpha * (1 + 1e-12)
    gaussian = float(ledger.filter.charge(sensitivity=rec.sensitivity, noise_std=2.0)[0])
    assert gaussian * (1 - 1e-9) <= charge == pytest.approx(gaussian, rel=1e-2)


def test_a_device_spends_within_its_budget_over_many_rounds_then_sends_noise_only(tmp_path):
    ledger = enrol(tmp_path, epsilon=1.0)
    rng = np.random.default_rng(2)
    statuses = []
    for r in range(40):
        spec = request(r, z=1.0, m=5)
        rel = release_skellam(ledger, POLICY, spec, update(rng, 2.0), grid_for(spec))
        statuses.append(rel.status)
        assert bool(ledger.filter.within_budget(ledger.state()))
        assert rel.arrays is not None and [a.shape for a in rel.arrays] == [(12,), (5,)]
        assert all(np.all((a >= -Q // 2) & (a < Q // 2)) for a in rel.arrays)
        if rel.status == "noise-only":
            assert np.all(rel.charge == 0) and rel.sensitivity == 0.0
    assert statuses[0] == "contributed" and statuses[-1] == "noise-only"
    assert statuses.index("noise-only") > 1  # partial rounds at the end of the budget, then nothing
    assert ledger.spent_epsilon() <= 1.0
    assert {r.placement for r in ledger.records()} == {"distributed"}


def test_replays_gdp_filters_and_local_requests_are_refused_with_nothing_spent(tmp_path):
    ledger = enrol(tmp_path)
    rng = np.random.default_rng(3)
    spec = request(0)
    release_skellam(ledger, POLICY, spec, update(rng), grid_for(spec))
    with pytest.raises(ReplayError):
        release_skellam(ledger, POLICY, spec, update(rng), grid_for(spec))
    assert len(ledger.records()) == 1
    gdp = enrol(tmp_path, "g", kind="gdp")
    with pytest.raises(RoundSpecError, match="this device's filter is 'gdp'"):
        release_skellam(gdp, POLICY, spec, update(rng), grid_for(spec))
    assert gdp.records() == []
    local = RoundSpec("run-r", 1, 1.0, 1.0)
    with pytest.raises(RoundSpecError, match="placement='distributed'"):
        release_skellam(ledger, POLICY, local, update(rng), grid_for(spec))
    with pytest.raises(RoundSpecError, match="secure aggregation"):
        release_skellam(ledger, ClientPolicy(), request(2), update(rng), grid_for(spec))
    assert len(ledger.records()) == 1


def test_the_run_quota_caps_a_run_and_leave_mode_sends_nothing(tmp_path):
    ledger = enrol(tmp_path, epsilon=2.0, run_quota=0.25)
    rng = np.random.default_rng(4)
    leave = ClientPolicy(allow_distributed=True, after_exhaustion="leave")
    out = []
    for r in range(20):
        spec = request(r)
        out.append(release_skellam(ledger, leave, spec, update(rng, 2.0), grid_for(spec)))
    assert out[-1].status == "left" and out[-1].arrays is None
    assert bool(ledger.run_filter.within_budget(ledger.run_state("run-r")))
    assert ledger.spent_epsilon() < 2.0  # the rest of the lifetime budget is left for other runs
    spec = request(0, run="run-other")
    assert release_skellam(ledger, leave, spec, update(rng, 2.0), grid_for(spec)).status == "contributed"


def test_a_crash_between_the_commit_and_the_reply_leaves_the_spend(tmp_path):
    """The process dies in the sampler, after the commit and before anything left the device."""
    script = textwrap.dedent(
        f"""
        import os
        import numpy as np
        import fedfilter.client.mechanisms.skellam as rd
        from fedfilter.client.ledger.budget import BudgetLedger
        from fedfilter.client.mechanisms.gaussian_noise import NoiseStream
        from fedfilter.client.release import release
        from fedfilter.protocol.request import RoundSpec
        from fedfilter.protocol.secagg.grid import secaggplus_settings

        ledger = BudgetLedger.enrol({str(tmp_path / "dev")!r}, client_id="dev", epsilon=4.0, delta=1e-5,
                                    filter_kind="rdp", worst_case_epsilon=1000.0)
        rd.add_skellam_noise = lambda *a, **k: os._exit(9)
        spec = RoundSpec("run-c", 0, 1.0, 1.0, placement="distributed", min_reports=5)
        grid = rd.skellam_grid(spec, target_range=secaggplus_settings(10)["quantization_range"], sample_num=10)
        update = [np.full(8, 0.1, np.float32)]
        release(ledger, rd.SkellamMechanism.for_update(spec, grid, update), update, run_id="run-c", round_id=0,
                exhausted_below=1e-3, after_exhaustion="noise-only", stream=NoiseStream())
        """
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 9, proc.stderr
    ledger = BudgetLedger.open(tmp_path / "dev")
    try:
        (rec,) = ledger.records()
        assert (rec.run_id, rec.status, rec.placement) == ("run-c", "contributed", "distributed")
        assert float(rec.charge[0]) > 0 and ledger.spent_epsilon() > 0
        with pytest.raises(ReplayError):  # and the round cannot be released again after the restart
            spec = RoundSpec("run-c", 0, 1.0, 1.0, placement="distributed", min_reports=5)
            release_skellam(ledger, POLICY, spec, [np.full(8, 0.1, np.float32)], grid_for(spec))
    finally:
        ledger.close()
