"""``fedfilter rounds`` and ``fedfilter plan`` in distributed placement show the worst-case account:
the worst-case-epsilon the rounds need and, with ``--worst-case-epsilon``, the full-norm rounds it
admits, each report read alone at the device's own share.

References: the share's variance and each round's charge computed exactly (fractions, and mpmath's
Agarwal-Kairouz-Liu bound ``helpers.budget_reference.mp_bound`` at the exact L2 = C / gamma and the
exact worst L1 ``min(sqrt(d) L2, L2^2)``), and the device's own grid and charge run round by round.
"""

from __future__ import annotations

import json
import math
from fractions import Fraction
from pathlib import Path

import mpmath
import pytest
from helpers.budget_reference import mp_bound

from fedfilter.cli import main
from fedfilter.client.mechanisms.skellam import skellam_grid
from fedfilter.privacy.filters import make_filter, rdp_order
from fedfilter.privacy.skellam import l1_cap, skellam_charge
from fedfilter.protocol.request import RoundSpec
from fedfilter.protocol.secagg.grid import grid_step, quantization_range

DELTA = 1e-5
# (epsilon, z, clip, m, dim, worst-case-epsilon): README's digits example, and a small model at m = 10.
SETTINGS = [(1.0, 10.0, 0.4, 50, 2410, 20.0), (4.0, 2.0, 1.0, 10, 100, 30.0)]


def argv(eps, z, clip, m, dim):
    return [
        "--epsilon", str(eps), "--delta", str(DELTA), "--noise-multiplier", str(z), "--placement", "distributed",
        "--dim", str(dim), "--min-reports", str(m), "--clip", str(clip),
    ]  # fmt: skip


def exact_share(z, clip, m) -> Fraction:
    return (Fraction(z) * Fraction(clip) / Fraction(grid_step(clip))) ** 2 / m


def exact_rounds(worst_eps, z, clip, m, dim) -> int:
    """floor(B / c): c the exact full-norm charge of one report read alone, B the rdp filter's budget."""
    filt = make_filter("rdp", worst_eps, DELTA)
    alpha = rdp_order(filt)
    l2 = Fraction(clip) / Fraction(grid_step(clip))  # exact: the step is a power of two
    with mpmath.workdps(50):
        l2_mp = mpmath.mpf(l2.numerator) / l2.denominator
        l1 = min(mpmath.sqrt(dim) * l2_mp, l2_mp**2)
        mu = exact_share(z, clip, m)
        charge = mp_bound(l1, l2_mp**2, mpmath.mpf(mu.numerator) / mu.denominator, alpha) / alpha
        return int(mpmath.floor(mpmath.mpf(float(filt.budget[0])) / charge))


def device_rounds(worst_eps, z, clip, m, dim) -> int:
    """What a device's worst-case account admits, round by round, with the device's grid and charge."""
    spec = RoundSpec("plan", 0, z, clip, placement="distributed", min_reports=m)
    grid = skellam_grid(spec, target_range=quantization_range(m), sample_num=m)
    filt = make_filter("rdp", worst_eps, DELTA)
    l2 = clip / grid.gamma
    charge = skellam_charge(filt, l1_cap(l2, dim), l2, grid.mu_share)
    state, n = filt.initial_state(), 0
    while filt.admits(state, charge) and n < 100_000:
        state, n = filt.spend(state, charge), n + 1
    return n


@pytest.mark.parametrize("eps, z, clip, m, dim, worst", SETTINGS)
def test_rounds_shows_what_the_worst_case_budget_admits(capsys, eps, z, clip, m, dim, worst):
    assert main(["rounds", *argv(eps, z, clip, m, dim), "--worst-case-epsilon", str(worst), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    share = exact_share(z, clip, m)
    assert abs(Fraction(out["worst_case_share_variance"]) - share) <= share * Fraction(1, 10**14)
    # Within one round of the exact count, never above it (the planner's charge is rounded up).
    exact = exact_rounds(worst, z, clip, m, dim)
    assert exact - 1 <= out["worst_case_rounds"] <= exact and out["worst_case_rounds"] >= 1
    # Never a round the device's own account would refuse.
    assert out["worst_case_rounds"] <= device_rounds(worst, z, clip, m, dim)
    assert out["device_rounds"] == min(out["rounds"], out["worst_case_rounds"])
    # The worst-case-epsilon the main rounds need: it admits them on the device, and a little less does not.
    needed = out["worst_case_epsilon_needed"]
    assert device_rounds(needed, z, clip, m, dim) >= out["rounds"]
    assert device_rounds(needed * (1 - 1e-3), z, clip, m, dim) < out["rounds"]
    assert needed > eps  # a share read alone costs more than the sum


def test_rounds_text_names_the_worst_case_account_and_refuses_a_budget_below_epsilon(capsys):
    assert main(["rounds", *argv(1.0, 10.0, 0.4, 50, 2410)]) == 0
    text = capsys.readouterr().out
    assert "worst-case-epsilon 9.14842 admits these 6 rounds" in text and "1/50 of the sum's" in text
    assert main(["rounds", *argv(1.0, 10.0, 0.4, 50, 2410), "--worst-case-epsilon", "20"]) == 0
    text = capsys.readouterr().out
    assert "worst-case-epsilon 20 admits 20 full-norm rounds" in text
    assert "device      6 full-norm rounds   (it stops when either account is spent)" in text
    assert main(["rounds", *argv(1.0, 10.0, 0.4, 50, 2410), "--worst-case-epsilon", "0.5"]) == 2
    assert "worst-case-epsilon=0.5 is below the budget epsilon=1.0" in capsys.readouterr().err


def test_plan_shows_the_worst_case_epsilon_the_wanted_rounds_need(capsys):
    eps, z, clip, m, dim, worst = SETTINGS[0]
    plan = ["plan", "--devices", str(m), "--params", str(dim), "--placement", "distributed"]
    plan += ["--noise-multiplier", str(z), "--clip", str(clip), "--epsilon", str(eps), "--delta", str(DELTA)]
    assert main([*plan, "--rounds", "5", "--worst-case-epsilon", str(worst), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    w = out["worst_case"]
    needed = w["worst_case_epsilon_needed"]
    assert device_rounds(needed, z, clip, m, dim) >= 5 > device_rounds(needed * (1 - 1e-3), z, clip, m, dim)
    exact = exact_rounds(worst, z, clip, m, dim)
    assert exact - 1 <= w["worst_case_rounds"] <= exact
    assert w["device_rounds"] == min(out["rounds_afforded"], w["worst_case_rounds"])
    assert main([*plan, "--rounds", "5"]) == 0
    text = capsys.readouterr().out
    assert f"worst-case-epsilon {needed:.6g} admits these 5 rounds" in text
    # Local placement has no second account to show.
    assert main(["plan", "--devices", "10", "--params", "100", *plan[7:], "--rounds", "5", "--json"]) == 0
    assert "worst_case" not in json.loads(capsys.readouterr().out)
    assert math.isfinite(needed)


def test_the_docs_distributed_rounds_block_is_what_the_command_prints(capsys):
    # The device owner's page (docs/device-owner.md, "Plan a budget") shows it, moved from the README.
    readme = (Path(__file__).resolve().parents[2] / "docs" / "device-owner.md").read_text(encoding="utf-8")
    cmd = next(line for line in readme.splitlines() if line.startswith("$ fedfilter rounds") and "distributed" in line)
    shown = readme.split(cmd + "\n", 1)[1].split("```", 1)[0]
    assert main(cmd.split()[2:]) == 0
    assert capsys.readouterr().out == shown
