"""Individual privacy filters: pure functions over a small float64 state, one row per client.

A Gaussian release with sensitivity ``s`` (the norm of the clipped update) and noise standard
deviation ``std`` has privacy loss ``(s/std)^2`` times a fixed weight per coordinate of the state:

=======  ======================  ==========================  ======================================
kind     state coordinates       weight                      continue while
=======  ======================  ==========================  ======================================
gdp      sum mu_t^2              1                           sum mu_t^2 <= mu_B^2 (exact curve)
zcdp     sum rho_t               1/2                         sum rho_t <= B* (papers/004 Thm 4.9)
rdp      sum rho_t(alpha), each  alpha/2 per order alpha     some order within its budget
=======  ======================  ==========================  ======================================

Validity. gdp: Smith and Thakurta 2022 (arXiv 2210.17520) Theorem 1.1 / Koskela, Tobaben and
Honkela ICLR 2023 Theorem 6 (fully adaptive composition of Gaussian mechanisms). zcdp: papers/004
Theorem 4.9 with Remark 4.4. rdp: papers/004 Theorem 4.3 for each order, and a union bound over
orders: halting when *every* order exceeds its budget B_alpha is valid at delta = sum_alpha
delta_alpha, because at the halting time T some order has S_alpha(T) <= B_alpha, and for each order
(1 - e^(eps - L))_+ 1{S_alpha(T) <= B_alpha} <= c_alpha e^((alpha-1)(L - S_alpha(T)) + (alpha-1)(B_alpha - eps))
whose expectation is at most delta_alpha by optional stopping of the supermartingale in the proof of
Theorem 4.3 (CKS 2020 Proposition 12 gives c_alpha and the conversion). So each order's budget is
set for delta / (number of orders) (as in Lécuyer 2021, arXiv 2103.01379, Section 3). With a single
order this is exactly papers/004 Theorem 4.3.

The filters never hold mutable state: ``spend`` returns the new state. Losses round up and
allowances round down (``client.privacy.rounding``), so no sequence of floating-point operations
lets a client spend beyond its budget. Every function broadcasts over a leading client axis, which
is how the vectorised engine applies the very same code to thousands of clients at once.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from client.privacy import gaussian_dp, renyi, zcdp
from client.privacy.rounding import add_up, div_up, down, mul_up, square_up, sub_down

FILTER_KINDS = ("gdp", "rdp", "zcdp")
# Allowances start this many ulps below the closed form, then are checked against ``admits``.
_ALLOWANCE_SLACK = 64 * 2.0**-52


def _check_eps_delta(epsilon: float, delta: float) -> None:
    problems = []
    if not (isinstance(epsilon, (int, float)) and math.isfinite(epsilon) and epsilon > 0):
        problems.append(f"epsilon must be a finite number > 0. Found {epsilon!r}.")
    if not (isinstance(delta, (int, float)) and 0 < delta < 1):
        problems.append(f"delta must be a number in (0, 1). Found {delta!r}.")
    if problems:
        raise ValueError(" ".join(problems))


@dataclass(frozen=True)
class GaussianFilter:
    """A budget over adaptively chosen Gaussian releases.

    ``budget`` and ``weights`` have one entry per state coordinate. A release of sensitivity ``s``
    and noise std ``std`` adds ``weights * (s/std)^2``; a state is within budget when *some*
    coordinate is (for one coordinate, the plain filter).
    """

    kind: str
    epsilon: float
    delta: float
    weights: np.ndarray = field(repr=False)
    budget: np.ndarray = field(repr=False)
    orders: tuple[float, ...] = ()

    @property
    def dim(self) -> int:
        return int(self.budget.shape[-1])

    def initial_state(self, n_clients: int | None = None) -> np.ndarray:
        shape = (self.dim,) if n_clients is None else (n_clients, self.dim)
        return np.zeros(shape, dtype=np.float64)

    def charge(self, *, sensitivity, noise_std) -> np.ndarray:
        """The loss of one release, rounded up; shape ``(..., dim)``."""
        s = np.asarray(sensitivity, dtype=np.float64)
        std = np.asarray(noise_std, dtype=np.float64)
        if np.any(~np.isfinite(s) | (s < 0)):
            raise ValueError(f"sensitivity must be finite and >= 0. Found {s!r}.")
        if np.any(~np.isfinite(std) | (std <= 0)):
            raise ValueError(f"noise_std must be finite and > 0. Found {std!r}.")
        # Zero stays exactly zero (0 / std and 0 * w are exact): a release without data costs nothing.
        mu2 = np.where(s > 0, square_up(div_up(s, std)), 0.0)
        return np.where(np.expand_dims(mu2, -1) > 0, mul_up(np.expand_dims(mu2, -1), self.weights), 0.0)

    def spend(self, state: np.ndarray, charge: np.ndarray) -> np.ndarray:
        """The state after a release (rounded up). Does not check the budget: see ``admits``.

        Adding an exact zero is exact, so a release without data (charge 0) leaves the state as is.
        """
        return np.where(charge > 0, add_up(state, charge), state)

    def within_budget(self, state: np.ndarray) -> np.ndarray:
        """True where some coordinate is within its budget (the filter says CONT)."""
        return np.any(state <= self.budget, axis=-1)

    def admits(self, state: np.ndarray, charge: np.ndarray) -> np.ndarray:
        """True where the release keeps the client within its budget."""
        return self.within_budget(self.spend(state, charge))

    def allowance(self, state: np.ndarray, *, noise_std) -> np.ndarray:
        """The largest sensitivity still admitted at this noise (rounded down; 0 if none).

        Closed form ``std * max_j sqrt((B_j - S_j) / w_j)``, started a few ulps low and then
        checked with ``admits`` itself, so the allowance is admitted by construction and lands
        within about 1e-14 (relative) of the exact budget: papers/004 Algorithm 7's
        ``min(C, sqrt(B_norm - sum ||g_j||^2))`` with the minimum over C taken by the caller.
        """
        std = np.asarray(noise_std, dtype=np.float64)
        room = np.maximum(sub_down(self.budget, state), 0.0)
        per_coord = np.sqrt(np.maximum(down(room / self.weights), 0.0))
        s = down(std * np.max(per_coord, axis=-1) * (1 - _ALLOWANCE_SLACK))
        s = np.maximum(s, 0.0)
        for _ in range(64):  # never taken in practice; guarantees admits() by construction
            bad = ~self.admits(state, self.charge(sensitivity=s, noise_std=std))
            if not np.any(bad):
                return s
            s = np.where(bad, down(s * (1 - 2.0**-30)), s)
        return np.where(self.admits(state, self.charge(sensitivity=s, noise_std=std)), s, 0.0)

    def remaining_fraction(self, state: np.ndarray) -> np.ndarray:
        """Share of the budget left, in (0, 1]; by the coordinate with the most room."""
        room = np.maximum(self.budget - state, 0.0) / np.where(self.budget > 0, self.budget, 1.0)
        return np.max(np.where(self.budget > 0, room, 0.0), axis=-1)

    def scaled(self, fraction: float) -> "GaussianFilter":
        """The same filter with every budget coordinate times ``fraction`` (a per-run quota)."""
        if not (math.isfinite(fraction) and 0 < fraction <= 1):
            raise ValueError(f"run quota must be a fraction in (0, 1]. Found {fraction!r}.")
        budget = self.budget if fraction == 1 else down(self.budget * fraction)
        return GaussianFilter(self.kind, self.epsilon, self.delta, self.weights, budget, self.orders)

    def epsilon_spent(self, state: np.ndarray) -> float:
        """The smallest epsilon (at this delta) whose filter of this kind admits ``state``.

        This is how much of the budget the releases so far used up, in epsilon units; the
        guarantee the client holds is its budget (a filter, not an odometer).
        """
        state = np.asarray(state, dtype=np.float64)
        if self.kind == "gdp":
            eps = gaussian_dp.epsilon_for_mu(float(np.sqrt(state[0]) * (1 + 2.0**-51)), self.delta)
        elif self.kind == "zcdp":
            eps = zcdp.epsilon_from_zcdp(float(state[0]), self.delta)
        else:
            eps = renyi.epsilon_from_rdp(self.orders, state, self.delta / self.dim)
        # A state this filter admits is certified by its own budget, so the exact answer is at
        # most ``self.epsilon``; the upward-rounded conversion may overshoot that by a few ulps.
        return min(eps, float(self.epsilon)) if self.within_budget(state) else eps


def gdp_filter(epsilon: float, delta: float) -> GaussianFilter:
    """Continue while ``sum mu_t^2 <= mu_B^2``, ``mu_B`` from the exact curve (rounded down)."""
    _check_eps_delta(epsilon, delta)
    mu_b = gaussian_dp.mu_for_budget(epsilon, delta)
    return GaussianFilter("gdp", epsilon, delta, np.ones(1), np.array([down(mu_b * mu_b)]))


def zcdp_filter(epsilon: float, delta: float) -> GaussianFilter:
    """papers/004 Theorem 4.9: continue while ``sum mu_t^2 / 2 <= B*``."""
    _check_eps_delta(epsilon, delta)
    return GaussianFilter("zcdp", epsilon, delta, np.array([0.5]), np.array([zcdp.zcdp_budget(epsilon, delta)]))


def rdp_filter(epsilon: float, delta: float, orders: Sequence[float] | None = None) -> GaussianFilter:
    """papers/004 Theorem 4.3 per order and Remark 4.4 over a grid, at delta / len(orders) each."""
    _check_eps_delta(epsilon, delta)
    orders_arr = renyi.check_orders(renyi.FILTER_ORDERS if orders is None else orders)
    budgets = renyi.rdp_budgets(orders_arr, epsilon, delta / orders_arr.size)
    return GaussianFilter(
        "rdp", epsilon, delta, orders_arr / 2, budgets, tuple(float(a) for a in orders_arr)
    )


def make_filter(kind: str, epsilon: float, delta: float, orders: Sequence[float] | None = None) -> GaussianFilter:
    """The filter named ``kind`` (one of ``FILTER_KINDS``) for the budget (epsilon, delta)."""
    if kind == "gdp":
        return gdp_filter(epsilon, delta)
    if kind == "zcdp":
        return zcdp_filter(epsilon, delta)
    if kind == "rdp":
        return rdp_filter(epsilon, delta, orders)
    raise ValueError(f"filter must be one of {', '.join(FILTER_KINDS)}. Found {kind!r}.")


def round_allowance(filt: GaussianFilter, state: np.ndarray, *, noise_std, clip,
                    run_filter: GaussianFilter | None = None, run_state: np.ndarray | None = None) -> np.ndarray:
    """papers/004 Algorithm 7's per-round clip ``min(C, what the filter(s) still admit)``.

    The Flower client (one row) and the vectorised engine (one row per client) both call this,
    so they clip and charge identically.
    """
    allow = np.minimum(np.asarray(clip, dtype=np.float64), filt.allowance(state, noise_std=noise_std))
    if run_filter is not None:
        allow = np.minimum(allow, run_filter.allowance(run_state, noise_std=noise_std))
    return allow


def exhausted(allowance, clip, exhausted_below: float) -> np.ndarray:
    """True where what is left is below ``exhausted_below * C``: the client has nothing to give."""
    return np.asarray(allowance) <= exhausted_below * np.asarray(clip)
