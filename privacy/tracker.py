"""The individual privacy tracker of papers/004 Algorithm 5 (Section 4.4, Corollary 4.11).

A chain of Rényi filters of budget ``Delta``: each time the running filter would halt, the tracker
``O`` grows by ``Delta`` and a new filter starts with the current loss. At the restart times
``T_m`` the individual loss of order alpha is at most ``O = m * Delta`` (Corollary 4.11), provided
every single loss is at most ``Delta``. ``O`` depends only on the client's own losses, so it can be
shown to the client without harming anyone else (Section 4.4). Vectorised over clients.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fedfilter.privacy.rounding import add_up


@dataclass(frozen=True)
class TrackerState:
    level: np.ndarray  # O_t: the tracker's bound, a multiple of Delta
    running: np.ndarray  # sum of losses since the last restart


def tracker_start(delta_step: float, n_clients: int | None = None) -> TrackerState:
    """Algorithm 5's initialisation ``O_1 = Delta``."""
    if not (np.isfinite(delta_step) and delta_step > 0):
        raise ValueError(f"delta_step must be a finite number > 0. Found {delta_step!r}.")
    shape = () if n_clients is None else (n_clients,)
    return TrackerState(np.full(shape, float(delta_step)), np.zeros(shape))


def tracker_step(state: TrackerState, rho, delta_step: float) -> TrackerState:
    """One step of Algorithm 5 with this round's loss ``rho`` (per client)."""
    rho = np.asarray(rho, dtype=np.float64)
    if np.any(~np.isfinite(rho) | (rho < 0) | (rho > delta_step)):
        raise ValueError(f"every loss must be in [0, delta_step={delta_step}] (Corollary 4.11). Found {rho!r}.")
    total = np.where(state.running > 0, add_up(state.running, rho), rho)  # 0 + rho is exact
    halt = total > delta_step  # F_{alpha, Delta}(rho_restart..rho_t) = HALT
    level = np.where(halt, add_up(state.level, delta_step), state.level)
    running = np.where(halt, rho, total)
    return TrackerState(level, running)


def track(rhos, delta_step: float) -> np.ndarray:
    """``O_t`` for t = 1..k for one client's loss sequence (papers/004 Algorithm 5)."""
    state = tracker_start(delta_step)
    out = []
    for rho in rhos:
        state = tracker_step(state, rho, delta_step)
        out.append(float(state.level))
    return np.array(out)
