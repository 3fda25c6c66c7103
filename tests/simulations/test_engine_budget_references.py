"""The vectorised engine against independent references: raw per-client states and sensitivities.

The engine keeps no spend rows, so a thin subclass records what ``Engine._spend`` (its single
spend step, the vectorised ``FilteredClient.release``) is handed each round (clients and
certified norms) and then calls it unchanged. Every client's sensitivities are converted with
``tests/budget_reference.py`` (mpmath's exact Gaussian-DP curve, dp_accounting), never with
``epsilon_spent`` (capped at the budget), and the states are checked against exact fractions.
"""

from __future__ import annotations

from collections import defaultdict
from fractions import Fraction

import numpy as np
import pytest
from budget_reference import check_spends, exact_mu2, weights

from fedfilter.client.privacy.filters import make_filter
from fedfilter.simulations.engine import Engine, EngineConfig
from fedfilter.simulations.tasks.registry import load_task

N = 10
DELTA = 1e-5
EPS = [0.3, 0.5, 0.8, 1.0, 2.0, 0.3, 0.5, 0.8, 1.0, 4.0]


class RecordingEngine(Engine):
    """Records, per client, each spend's sensitivity and the state before and after it."""

    def __init__(self, config, task=None):
        super().__init__(config, task=task)
        self.rows: dict[int, list[tuple[float, np.ndarray, np.ndarray]]] = defaultdict(list)

    def _spend(self, clients, norms):
        before = self.state[clients].copy()
        super()._spend(clients, norms)
        for k, c in enumerate(clients):
            self.rows[int(c)].append((float(norms[k]), before[k], self.state[c].copy()))


@pytest.fixture(scope="module")
def digits():
    return load_task("digits", num_clients=N)


@pytest.mark.parametrize(
    "kind,norms", [("gdp", "device"), ("gdp", "vectorised"), ("zcdp", "device"), ("rdp", "vectorised")]
)
def test_engine_states_and_sensitivities_stay_within_budget_by_independent_accountants(digits, kind, norms):
    z, clip = 2.0, 0.5
    cfg = EngineConfig(
        task="digits",
        num_clients=N,
        epsilon=EPS,
        delta=DELTA,
        filter_kind=kind,
        noise_multiplier=z,
        clip=clip,
        rounds=6,
        local_epochs=1,
        lr=0.1,
        group_by="none",
        torch_threads=1,
        noise_draw="aggregate",
        eval_every=100,
        norms=norms,
    )
    engine = RecordingEngine(cfg, task=digits)
    for _ in range(cfg.rounds):
        engine.step()
    std = cfg.accounted_std
    assert std == z * clip
    exhausted = engine.exhausted_round > 0
    assert exhausted.sum() >= 4, "too few clients ran out: the budgets would not bind"
    for k in range(N):
        filt = make_filter(kind, EPS[k], DELTA)  # only for its orders (the rdp state's coordinates)
        rows = engine.rows[k]
        assert len(rows) == cfg.rounds  # every client answers every round (fraction 1)
        check_spends(
            kind,
            EPS[k],
            DELTA,
            filt.orders,
            [(s, std) for s, _, _ in rows],
            exhausted=bool(exhausted[k]),
            slack_mu2=2 * (cfg.exhausted_below / z) ** 2,
            use_pld=k < 3,
        )
        # Exact fractions: each round's state covers the state before it plus the exact cost of
        # its sensitivity, and the final state covers the exact sum of all of them.
        w = weights(kind, filt.orders)
        total = [Fraction(0)] * len(w)
        for i, (s, before, after) in enumerate(rows):
            for j, wj in enumerate(w):
                cost = wj * exact_mu2(s, std)
                total[j] += cost
                assert Fraction(float(after[j])) >= Fraction(float(before[j])) + cost, (k, i, j)
                assert Fraction(float(after[j])) >= total[j], (k, i, j)
        assert np.array_equal(rows[-1][2], engine.state[k])
