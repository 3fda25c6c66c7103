"""The engine's ``accounting="worst-case"`` (the comparison benchmark's arm (c)): every contribution is charged a full
clip-norm round, the uniform accounting of a system without individual accounting, and a client stops
once a full round no longer fits. Checked against exact fractions, mpmath's RDP conversion
(``helpers.budget_reference.rdp_epsilon``) and Google's dp_accounting, never against the filters' own
``epsilon_spent``.
"""

from __future__ import annotations

from fractions import Fraction

import mpmath
import numpy as np
import pytest
from dp_accounting import dp_event, rdp
from helpers.budget_reference import mp_bound, rdp_epsilon

from fedfilter.privacy.filters import rdp_order
from fedfilter.simulations.engine import Engine, EngineConfig
from fedfilter.simulations.tasks.registry import load_task

N = 6
DELTA = 1e-5
Z = 3.0  # a full-clip Gaussian round costs rho = 1 / (2 z^2) = 1/18
# Budgets that run out after different numbers of full rounds (1e-3: before the first one).
EPS = [2.0, 3.0, 4.0, 5.0, 1e-3, 8.0]
ROUNDS = 8


@pytest.fixture(scope="module")
def digits():
    return load_task("digits", num_clients=N)


def run(digits, **kw) -> Engine:
    base = dict(
        task="digits",
        num_clients=N,
        epsilon=EPS,
        delta=DELTA,
        filter_kind="rdp",
        noise_multiplier=Z,
        clip=0.5,
        rounds=ROUNDS,
        local_epochs=1,
        lr=0.05,
        group_by="none",
        torch_threads=1,
        noise_draw="aggregate",
        eval_every=100,
    )
    engine = Engine(EngineConfig(**{**base, **kw}), task=digits)
    for _ in range(ROUNDS):
        engine.step()
    return engine


def full_rounds(engine: Engine) -> np.ndarray:
    """Rounds each client contributed (every client is asked every round)."""
    out = engine.exhausted_round
    return np.where(out < 0, ROUNDS, out - 1)


def at_alpha(rho_total: Fraction, alpha: float) -> mpmath.mpf:
    return rdp_epsilon([Fraction(alpha) * rho_total], [alpha], DELTA)


def test_local_worst_case_charges_exactly_clip_norm_rounds_until_one_no_longer_fits(digits):
    engine = run(digits, accounting="worst-case")
    k = full_rounds(engine)
    rho = Fraction(1, 2) / Fraction(Z) ** 2  # (C / (z C))^2 / 2, whatever the update's norm
    for c, eps in enumerate(EPS):
        # the state is k full-clip charges (each rounded up by at most a few ulps)
        assert engine.state[c, 0] == pytest.approx(float(k[c] * rho), rel=1e-12, abs=0)
        assert engine.state[c, 0] >= float(k[c] * rho)
        # k full rounds are within the budget (dp_accounting, optimal order) ...
        if k[c]:
            acc = rdp.RdpAccountant()
            acc.compose(dp_event.GaussianDpEvent(Z), int(k[c]))
            assert acc.get_epsilon(DELTA) <= eps
        # ... and, exhausted, one more full round would not be (at the filter's order, mpmath)
        if k[c] < ROUNDS:
            assert at_alpha((k[c] + 1) * rho, rdp_order(engine.filters[engine.group[c]])) > eps
    assert len(set(k.tolist())) >= 3  # the budgets run out at different rounds
    assert k[4] == 0  # 1e-3 admits no full round


def test_individual_accounting_charges_less_for_the_same_rounds(digits):
    # The arms differ only in the charge: with updates below the clip, individual charges are smaller.
    worst = run(digits, accounting="worst-case")
    individual = run(digits)
    both = (worst.exhausted_round < 0) & (individual.exhausted_round < 0)
    assert both.any()
    assert np.all(individual.state[both, 0] < worst.state[both, 0])
    assert np.all(full_rounds(individual) >= full_rounds(worst))


def test_distributed_worst_case_charges_the_full_rounds_worst_skellam_charge(digits):
    kw = dict(placement="distributed", worst_case_epsilon=1000.0, min_reports=3, clip=0.1, lr=0.5)
    engine = run(digits, accounting="worst-case", **kw)
    k = full_rounds(engine)
    assert engine.full_allowance is not None
    gamma = engine._distributed.grid.gamma
    for c, eps in enumerate(EPS):
        if k[c] == 0:
            assert engine.state[c, 0] == 0
            continue
        one = engine.state[c, 0] / k[c]
        # every full round costs the same (the charge at the bound, whatever the update) ...
        assert engine.state[c, 0] == pytest.approx(k[c] * one, rel=1e-12)
        # ... at least the Gaussian charge (rho = mu^2 / 2) at the full round's L2 (a Skellam release costs at
        # least the Gaussian of its norm), and at most the worst-case Skellam charge of a full-clip round
        # (mpmath's Agarwal-Kairouz-Liu bound at the worst L1 of that L2, at the filter's order)
        full_l2 = float(engine.full_allowance[c])
        bound = Fraction(full_l2) * Fraction(gamma) / (Fraction(Z) * Fraction(0.1))
        clip_l2 = 0.1 / gamma
        alpha = rdp_order(engine.filters[engine.group[c]])
        mu = engine._distributed.grid.mu_total
        dim = engine._distributed.mechanism.dim
        full_clip = mp_bound(min(clip_l2 * np.sqrt(dim), clip_l2**2), clip_l2**2, mu, alpha) / alpha
        assert float(bound**2 / 2) <= one <= float(full_clip) * (1 + 1e-9)  # the code rounds up by 256 ulps
        assert at_alpha(Fraction(float(engine.state[c, 0])), alpha) <= eps
        if k[c] < ROUNDS:  # exhausted: one more full round would not fit
            assert at_alpha(Fraction(float(engine.state[c, 0] + one)), alpha) > eps
    assert len(set(k.tolist())) >= 3
    individual = run(digits, **kw)
    both = (engine.exhausted_round < 0) & (individual.exhausted_round < 0)
    assert both.any() and np.all(individual.state[both, 0] < engine.state[both, 0])


def test_worst_case_accounting_is_refused_in_central_placement():
    with pytest.raises(ValueError, match="accounting='worst-case'.*placement='central'"):
        EngineConfig(placement="central", noise_draw="aggregate", accounting="worst-case")
    with pytest.raises(ValueError, match="accounting must be one of"):
        EngineConfig(accounting="uniform")
