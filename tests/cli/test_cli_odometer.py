"""``fedfilter odometer`` against an independent mpmath evaluation of Rogers et al. (2016)."""

from __future__ import annotations

import json
import math

import mpmath
import pytest

from fedfilter.cli import main


def _json(capsys, *args):
    assert main(["odometer", *args, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def _eq11(eps, d, n):
    with mpmath.workdps(50):
        e = [mpmath.mpf(x) for x in eps]
        drift = sum(x * mpmath.expm1(x) / 2 for x in e)
        s2 = sum(x * x for x in e)
        return drift + mpmath.sqrt(2 * s2 * (mpmath.log(110) + 1 + 2 * mpmath.log(mpmath.log(n) / mpmath.mpf(d))))


def _eq12(eps, d, n):
    with mpmath.workdps(50):
        e = [mpmath.mpf(x) for x in eps]
        drift = sum(x * mpmath.expm1(x) / 2 for x in e)
        s2 = sum(x * x for x in e)
        n2 = mpmath.mpf(n) ** 2
        rad = 2 * (1 / n2 + s2) * (1 + mpmath.log(1 + n2 * s2) / 2) * mpmath.log(4 * mpmath.log(n) / mpmath.log(2) / d)
        return drift + mpmath.sqrt(rad)


@pytest.mark.parametrize(
    "eps, branch, ref",
    [([0.05] * 40 + [0.2], 11, _eq11), ([0.4] * 9, 12, _eq12), ([0.001, 0.002], 12, _eq12)],
)
def test_advanced_json_matches_equations_11_and_12(capsys, eps, branch, ref):
    out = _json(capsys, "--kind", "advanced", "--epsilons", ",".join(map(repr, eps)), "--delta-g", "1e-6", "--n", "100")
    assert out["branch"] == branch
    exact = ref(eps, mpmath.mpf("1e-6"), 100)
    assert abs(out["epsilon"] - exact) <= 1e-9 * exact
    assert out["epsilon"] >= exact  # rounded up


def test_each_kind_in_its_units(capsys):
    assert _json(capsys, "--kind", "basic", "--epsilons", "0.1,0.2", "--delta-g", "1e-6")["epsilon"] >= 0.3
    gdp = _json(capsys, "--kind", "gdp", "--mus", "0.3,0.4", "--delta-g", "1e-5")
    assert gdp["sum_mu_sq"] >= 0.25 and gdp["epsilon"] > 0.125
    rdp = _json(capsys, "--kind", "rdp", "--rdp", "0.5,0.25", "--order", "9", "--delta-g", "1e-6")
    assert rdp["epsilon"] >= 0.75 + math.log(1e6) / 8
    lem = _json(
        capsys,
        "--kind",
        "basic",
        "--epsilons",
        "0.1",
        "--deltas",
        "1e-8",
        "--delta-g",
        "1e-6",
        "--delta-g-prime",
        "1e-6",
    )
    assert lem["epsilon"] >= 0.2 and lem["delta"] >= 2e-6


@pytest.mark.parametrize(
    "args, field",
    [
        (["--kind", "advanced", "--epsilons", "0.1", "--delta-g", "1e-6"], "--n"),
        (["--kind", "gdp", "--delta-g", "1e-6"], "--mus"),
        (["--kind", "gdp", "--mus", "0.1,x", "--delta-g", "1e-6"], "--mus"),
        (["--kind", "rdp", "--rdp", "0.1", "--order", "0.5", "--delta-g", "1e-6"], "order"),
        (["--kind", "basic", "--epsilons", "0.1", "--deltas", "1e-7", "--delta-g", "1e-6"], "--delta-g-prime"),
    ],
)
def test_bad_input_names_the_flag(capsys, args, field):
    assert main(["odometer", *args]) == 2
    assert field in capsys.readouterr().err
