"""Individual privacy filters: pure functions over a one-number state, one row per client.

Every release is a Gaussian mechanism with sensitivity ``s`` (the norm of the clipped update) and
noise standard deviation ``std``, ``mu_t = s / std``. Each filter keeps one running sum, ``weight *
sum mu_t^2``, and continues while it is at most the budget:

=======  =====================  ======  ==================================================
kind     state                  weight  budget (continue while state <= budget)
=======  =====================  ======  ==================================================
gdp      sum mu_t^2             1       mu_B^2, mu_B from the exact Gaussian-DP curve
zcdp     rho = sum mu_t^2 / 2   1/2     B* of papers/004 Theorem 4.9
rdp      rho = sum mu_t^2 / 2   1/2     rho* = max_alpha B_alpha / alpha over the orders
=======  =====================  ======  ==================================================

Validity. gdp: Smith and Thakurta 2022 (arXiv 2210.17520) Theorem 1.1 / Koskela, Tobaben and
Honkela ICLR 2023 Theorem 6 (fully adaptive composition of Gaussian mechanisms). zcdp: papers/004
Theorem 4.9 with Remark 4.4.

rdp: a Gaussian release is ``(alpha, alpha mu_t^2 / 2)``-RDP at every order alpha (Mironov 2017,
Proposition 7), so every order's Rényi loss is ``alpha * rho`` with the same ``rho``, and "some
order within its budget B_alpha" (B_alpha: the largest RDP value that converts to (epsilon, delta)
at order alpha, ``renyi.rdp_budgets``) is the single threshold ``rho <= rho* = max_alpha B_alpha /
alpha``. Let alpha* be the maximising order (``rdp_order``): it depends only on (epsilon, delta)
and the grid, so it is fixed before any release. ``rho <= rho*`` is exactly papers/004 Theorem
4.3's filter F_{alpha*, B_alpha*} (``sum_t alpha* mu_t^2 / 2 <= alpha* rho* <= B_alpha*``), so the
transcript is (alpha*, B_alpha*)-RDP and converts (Canonne, Kamath and Steinke 2020, Proposition
12, the conversion of ``renyi.epsilon_from_rdp``) to (epsilon, delta) at the FULL delta; no union
bound over orders is paid. Where rho* comes from the KL shortcut (``renyi.gaussian_rho_budget``),
alpha* is the smallest order: Theorem 4.3 at alpha_min with B = alpha_min rho* bounds the
transcript's D_alpha_min, KL <= D_alpha_min (Rényi divergences are non-decreasing in the order),
and KL <= -log(1 - delta^2) is (0, delta)-DP by Bretagnolle-Huber.

The filter's state may also hold non-Gaussian charges: a Skellam release (``skellam.py``) is
(alpha, eps(alpha))-RDP with eps not proportional to alpha, and it is charged ``eps(alpha*) /
alpha*`` (rounded up) in the same rho units. Theorem 4.3 at alpha* still applies (``sum_t
eps_t(alpha*) <= alpha* rho``), but then the transcript is RDP at alpha* ONLY, not at every
order; ``epsilon_spent`` therefore converts the state at alpha* alone (with the KL shortcut taken
from alpha* rho, which bounds KL too). For Gaussian-only states this is an upper bound on the
best-order reading (equal to it at the budget, where alpha* is the best order), and for mixed
states it is the only valid one. This admits exactly what dp_accounting's ``RdpAccountant``
certifies for the same Gaussian rounds fixed in advance, up to rounding.

The filters never hold mutable state: ``spend`` returns the new state. Losses round up and
allowances round down (``fedfilter.privacy.rounding``), so no sequence of floating-point operations
lets a client spend beyond its budget. Every function broadcasts over a leading client axis, which
is how the vectorised engine applies the very same code to thousands of clients at once. The
allowance does the same work whatever the state (no early exit, no data-dependent branch), so its
running time does not reveal how much budget is left.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from fedfilter.checks import positive_finite
from fedfilter.privacy import gaussian_dp, renyi, zcdp
from fedfilter.privacy.rounding import add_up, div_up, down, mul_up, square_up, sub_down

FILTER_KINDS = ("gdp", "rdp", "zcdp")
# Allowances start this many ulps below the closed form, then are checked against ``admits``.
_ALLOWANCE_SLACK = 64 * 2.0**-52


def _check_eps_delta(epsilon: float, delta: float) -> None:
    problems = []
    if (problem := positive_finite("epsilon", epsilon)) is not None:
        problems.append(problem)
    if not (isinstance(delta, (int, float)) and 0 < delta < 1):
        problems.append(f"delta must be a number in (0, 1). Found {delta!r}.")
    if problems:
        raise ValueError(" ".join(problems))


def _closed_form(room, weight: float, std) -> np.ndarray:
    """``std * sqrt(room / weight)``, ``_ALLOWANCE_SLACK`` low and rounded down, never negative."""
    per = np.sqrt(np.maximum(down(np.maximum(room, 0.0) / weight), 0.0))
    return np.maximum(down(std * per * (1 - _ALLOWANCE_SLACK)), 0.0)


@dataclass(frozen=True)
class GaussianFilter:
    """A budget over adaptively chosen Gaussian releases: continue while ``state <= budget``.

    ``weights`` and ``budget`` have one entry, as every state has one coordinate: a release of
    sensitivity ``s`` and noise std ``std`` adds ``weights * (s/std)^2``. ``orders`` are the Rényi
    orders the rdp filter converts with (empty for the others).
    """

    kind: str
    epsilon: float
    delta: float
    weights: np.ndarray = field(repr=False)
    budget: np.ndarray = field(repr=False)
    orders: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        if np.shape(self.weights) != (1,) or np.shape(self.budget) != (1,):
            raise ValueError(
                f"a filter has one weight and one budget. Found shapes "
                f"{np.shape(self.weights)} and {np.shape(self.budget)}."
            )

    @property
    def dim(self) -> int:
        return 1

    def initial_state(self, n_clients: int | None = None) -> np.ndarray:
        shape = (self.dim,) if n_clients is None else (n_clients, self.dim)
        return np.zeros(shape, dtype=np.float64)

    def _checked(self, name: str, value) -> np.ndarray:
        arr = np.asarray(value, dtype=np.float64)
        if arr.ndim == 0 or arr.shape[-1] != self.dim:
            hint = (
                " An rdp ledger written before the single-threshold rdp filter keeps one Rényi sum"
                " per order; this version cannot read it (nothing was spent)."
                if self.kind == "rdp"
                else ""
            )
            raise ValueError(
                f"{name} must have {self.dim} coordinate per client for the {self.kind} "
                f"filter. Found shape {arr.shape}.{hint}"
            )
        return arr

    def charge(self, *, sensitivity, noise_std) -> np.ndarray:
        """The loss of one release, rounded up; shape ``(..., 1)``."""
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
        state, charge = self._checked("state", state), self._checked("charge", charge)
        return np.where(charge > 0, add_up(state, charge), state)

    def within_budget(self, state: np.ndarray) -> np.ndarray:
        """True where the state is within the budget (the filter says CONT)."""
        return self._checked("state", state)[..., 0] <= self.budget[0]

    def admits(self, state: np.ndarray, charge: np.ndarray) -> np.ndarray:
        """True where the release keeps the client within its budget."""
        return self.within_budget(self.spend(state, charge))

    def allowance(self, state: np.ndarray, *, noise_std) -> np.ndarray:
        """The largest sensitivity still admitted at this noise (rounded down; 0 if none).

        papers/004 Algorithm 7's ``min(C, sqrt(B_norm - sum ||g_j||^2))``, the minimum over C taken
        by the caller. Two closed-form candidates ``std * sqrt(room / w)``, each
        ``_ALLOWANCE_SLACK`` low: ``first`` with ``room = B - S`` (the allowance of earlier versions,
        bit for bit); ``second`` with ``room = down(B) - S``, which is admitted by the error bounds
        alone (its charge is at most ``room``, so the up-rounded sum stays <= B) and lands within
        about 200 ulps of B; ``first`` (never below ``second``) misses only when B - S is under
        about 1% of B. The result is ``first`` if admitted, else ``second`` if admitted, else 0:
        admitted by construction (``admits`` itself decides), and the same work whatever the state
        (both candidates are always charged and checked, no early exit), so the time it takes does
        not reveal whether the budget is spent.
        """
        state = self._checked("state", state)
        std = np.asarray(noise_std, dtype=np.float64)
        w, b, spent = float(self.weights[0]), float(self.budget[0]), state[..., 0]
        first = _closed_form(sub_down(b, spent), w, std)
        second = _closed_form(sub_down(down(b), spent), w, std)
        ok_first = self.admits(state, self.charge(sensitivity=first, noise_std=std))
        ok_second = self.admits(state, self.charge(sensitivity=second, noise_std=std))
        return np.where(ok_first, first, np.where(ok_second, second, 0.0))

    def remaining_fraction(self, state: np.ndarray) -> np.ndarray:
        """Share of the budget left, in [0, 1]."""
        b = float(self.budget[0])
        room = np.maximum(b - self._checked("state", state)[..., 0], 0.0)
        return room / b if b > 0 else np.zeros_like(room)

    def scaled(self, fraction: float) -> GaussianFilter:
        """The same filter with its budget times ``fraction`` (a per-run quota)."""
        if not (math.isfinite(fraction) and 0 < fraction <= 1):
            raise ValueError(f"run quota must be a fraction in (0, 1]. Found {fraction!r}.")
        budget = self.budget if fraction == 1 else down(self.budget * fraction)
        return GaussianFilter(self.kind, self.epsilon, self.delta, self.weights, budget, self.orders)

    def epsilon_spent(self, state: np.ndarray) -> float:
        """The smallest epsilon (at this delta) whose filter of this kind admits ``state``.

        This is how much of the budget the releases so far used up, in epsilon units; the
        guarantee the client holds is its budget (a filter, not an odometer).
        """
        state = self._checked("state", state).reshape(-1)
        if state.size != 1:
            raise ValueError(f"epsilon_spent reads one client's state. Found {state.size} values.")
        if self.kind == "gdp":
            eps = gaussian_dp.epsilon_for_mu(float(np.sqrt(state[0]) * (1 + 2.0**-51)), self.delta)
        elif self.kind == "zcdp":
            eps = zcdp.epsilon_from_zcdp(float(state[0]), self.delta)
        else:  # the transcript is (alpha*, alpha* rho)-RDP (only at alpha* if it holds Skellam charges)
            order = rdp_order(self)
            eps = renyi.epsilon_from_rdp([order], [float(mul_up(order, state[0]))], self.delta)
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
    """papers/004 Theorem 4.3 at the best order of the grid (dp_accounting's by default), at the
    full delta: continue while ``sum mu_t^2 / 2 <= rho*`` (see the module docstring)."""
    _check_eps_delta(epsilon, delta)
    orders_arr = renyi.check_orders(renyi.DEFAULT_ORDERS if orders is None else orders)
    rho = renyi.gaussian_rho_budget(orders_arr, epsilon, delta)
    return GaussianFilter("rdp", epsilon, delta, np.array([0.5]), np.array([rho]), tuple(float(a) for a in orders_arr))


def rdp_order(filt: GaussianFilter) -> float:
    """alpha*: the order at which the rdp filter's threshold rho* is attained (see the module docstring).

    The largest order of the grid with ``B_alpha / alpha == rho*`` (any such order is valid; a larger
    one charges Skellam releases less, their discreteness term being divided by alpha), or the
    smallest order where rho* is the KL shortcut's (Theorem 4.3 at alpha_min gives D_alpha_min <=
    alpha_min rho* and KL <= D_alpha_min). Computed from (epsilon, delta, orders), not the budget,
    so a run quota (``scaled``) keeps its lifetime filter's order. Raises for gdp and zcdp.
    """
    if filt.kind != "rdp":
        raise ValueError(f"filter {filt.kind!r} has no Rényi order: only filter='rdp' charges at an order.")
    orders = np.asarray(filt.orders, dtype=np.float64)
    rho = renyi.gaussian_rho_budget(orders, filt.epsilon, filt.delta)
    per_order = down(renyi.rdp_budgets(orders, filt.epsilon, filt.delta) / orders)
    hits = orders[(per_order >= rho) & (per_order > 0)]
    return float(np.max(hits)) if hits.size else float(np.min(orders))


def make_filter(kind: str, epsilon: float, delta: float, orders: Sequence[float] | None = None) -> GaussianFilter:
    """The filter named ``kind`` for one client's lifetime budget (epsilon, delta).

    A filter (papers/004) admits a sequence of adaptively chosen Gaussian releases while their
    accumulated privacy loss stays within the budget; each client holds its own state.

    Parameters
    ----------
    kind : {"gdp", "rdp", "zcdp"}
        ``FILTER_KINDS``: Gaussian DP (fully adaptive composition of Gaussian mechanisms, the
        module docstring's references), Rényi DP over ``orders`` (papers/004 Theorem 4.3; the only
        kind that also accounts Skellam noise, so the one distributed placement needs), or
        zero-concentrated DP (papers/004 Theorem 4.9).
    epsilon : float
        The budget's epsilon; a finite number > 0.
    delta : float
        The budget's delta, in (0, 1).
    orders : sequence of float, optional
        The Rényi orders of the rdp filter (default ``renyi.DEFAULT_ORDERS``); ignored otherwise.

    Returns
    -------
    GaussianFilter
        The filter: ``initial_state()``, ``charge(sensitivity=, noise_std=)``, ``admits``,
        ``spend`` and ``allowance(state, noise_std=)`` (the largest norm a round may still carry).

    Raises
    ------
    ValueError
        Naming an unknown ``kind`` or a bad budget, and the value found.

    Examples
    --------
    >>> filt = make_filter("gdp", 4.0, 1e-5)
    >>> state = filt.initial_state()
    >>> charge = filt.charge(sensitivity=1.0, noise_std=10.0)  # a full-norm round at z = 10
    >>> bool(filt.admits(state, charge))
    True
    >>> filt.spend(state, charge)
    array([0.01])
    """
    if kind == "gdp":
        return gdp_filter(epsilon, delta)
    if kind == "zcdp":
        return zcdp_filter(epsilon, delta)
    if kind == "rdp":
        return rdp_filter(epsilon, delta, orders)
    raise ValueError(f"filter must be one of {', '.join(FILTER_KINDS)}. Found {kind!r}.")


def round_allowance(
    filt: GaussianFilter,
    state: np.ndarray,
    *,
    noise_std,
    clip,
    run_filter: GaussianFilter | None = None,
    run_state: np.ndarray | None = None,
) -> np.ndarray:
    """papers/004 Algorithm 7's per-round clip ``min(C, what the filter(s) still admit)``.

    The Flower client (one row) and the vectorised engine (one row per client) both call this,
    so they clip and charge identically. Constant work: no branch depends on the states.
    """
    allow = np.minimum(np.asarray(clip, dtype=np.float64), filt.allowance(state, noise_std=noise_std))
    if run_filter is not None:  # configuration, not data: a device either has a run quota or not
        if run_state is None:
            raise ValueError("run_state is required with run_filter. Found None.")
        allow = np.minimum(allow, run_filter.allowance(run_state, noise_std=noise_std))
    return allow


def exhausted(allowance, clip, exhausted_below: float) -> np.ndarray:
    """True where what is left is below ``exhausted_below * C``: the client has nothing to give."""
    return np.asarray(allowance) <= exhausted_below * np.asarray(clip)
