"""Individual privacy filters: pure functions over a one-number state, one row per client.

A release is a Gaussian mechanism (sensitivity ``s``, noise std ``std``, ``mu_t = s / std``). Each
filter (``FILTER_KINDS``) continues while its state stays within budget: gdp ``sum mu_t^2 <= mu_B^2``
(the exact Gaussian-DP curve); zcdp and rdp ``rho = sum mu_t^2 / 2`` at most ``B*`` or ``rho*``
(Feldman and Zrnic, "Individual Privacy Accounting via a Rényi Filter", NeurIPS 2021, Theorems 4.9
and 4.3: docs/derivations/rdp-filter.md). Losses round up, allowances round down; every function
broadcasts over a leading client axis (the engine runs the same code); allowances take constant work.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from fedfilter.checks import positive_finite
from fedfilter.privacy import gaussian_dp, renyi, zcdp
from fedfilter.privacy.rounding import add_up, div_up, down, mul_up, square_up, sub_down

FILTER_KINDS = ("gdp", "rdp", "zcdp")  # the kinds ``make_filter`` builds
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

    Parameters
    ----------
    kind, epsilon, delta, orders
        The kind (``FILTER_KINDS``), the (epsilon, delta) budget certified, the rdp filter's orders.
    weights, budget : numpy.ndarray
        Shape ``(1,)`` each: a release adds ``weights * (s/std)^2``; ``budget`` is the largest state.

    Examples
    --------
    >>> make_filter("zcdp", 4.0, 1e-5)  # computes the budget; the constructor only stores it
    GaussianFilter(kind='zcdp', epsilon=4.0, delta=1e-05, orders=())
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
        """The number of coordinates of a state: always 1 (one running sum per client).

        Examples
        --------
        >>> make_filter("gdp", 1.0, 1e-5).dim
        1
        """
        return 1

    def initial_state(self, n_clients: int | None = None) -> np.ndarray:
        """Zeros: the state of a client that has spent nothing.

        Parameters
        ----------
        n_clients : int, optional
            One row per client (shape ``(n_clients, 1)``); without it, one client (``(1,)``).

        Returns
        -------
        numpy.ndarray

        Examples
        --------
        >>> make_filter("gdp", 1.0, 1e-5).initial_state(2).shape
        (2, 1)
        """
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
        """The loss of one release, ``weights * (s/std)^2`` rounded up; shape ``(..., 1)``.

        Parameters
        ----------
        sensitivity, noise_std : float or array_like
            ``s`` (finite, >= 0; 0 charges exactly 0) and ``std`` (finite, > 0).

        Returns
        -------
        numpy.ndarray

        Examples
        --------
        >>> make_filter("zcdp", 4.0, 1e-5).charge(sensitivity=1.0, noise_std=2.0), 1.0**2 / (2 * 2.0**2)  # rho
        (array([0.125]), 0.125)
        """
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
        """The state after a release, rounded up (a new array); ``admits`` checks the budget.

        Parameters
        ----------
        state, charge : numpy.ndarray
            The state and the release's charge, shape ``(..., 1)`` each; a zero charge leaves it as is.

        Returns
        -------
        numpy.ndarray

        Examples
        --------
        >>> make_filter("zcdp", 4.0, 1e-5).spend(np.zeros(1), np.array([0.125]))
        array([0.125])
        """
        state, charge = self._checked("state", state), self._checked("charge", charge)
        return np.where(charge > 0, add_up(state, charge), state)

    def within_budget(self, state: np.ndarray) -> np.ndarray:
        """True where ``state <= budget`` (the filter says CONT).

        Parameters
        ----------
        state : numpy.ndarray
            Shape ``(..., 1)``.

        Returns
        -------
        numpy.ndarray of bool

        Examples
        --------
        >>> make_filter("zcdp", 4.0, 1e-5).within_budget(np.array([[0.0], [1.0]]))
        array([ True, False])
        """
        return self._checked("state", state)[..., 0] <= self.budget[0]

    def admits(self, state: np.ndarray, charge: np.ndarray) -> np.ndarray:
        """True where the release keeps the client within its budget.

        Parameters
        ----------
        state, charge : numpy.ndarray
            The state before the release and its charge, shape ``(..., 1)`` each.

        Returns
        -------
        numpy.ndarray of bool

        Examples
        --------
        >>> filt, z2 = make_filter("zcdp", 4.0, 1e-5), np.array([0.125])  # budget 0.298: two rounds at z = 2
        >>> bool(filt.admits(z2, z2)), bool(filt.admits(2 * z2, z2))
        (True, False)
        """
        return self.within_budget(self.spend(state, charge))

    def allowance(self, state: np.ndarray, *, noise_std) -> np.ndarray:
        """The largest sensitivity still admitted at this noise (rounded down; 0 if none): Feldman and
        Zrnic 2021, Algorithm 7's ``sqrt(B_norm - sum ||g_j||^2)``; docs/derivations/rdp-filter.md.

        Parameters
        ----------
        state, noise_std : numpy.ndarray, float or array_like
            The client's state, shape ``(..., 1)``, and the coming release's noise std.

        Returns
        -------
        numpy.ndarray

        Examples
        --------
        >>> a = float(make_filter("gdp", 4.0, 1e-5).allowance(np.zeros(1), noise_std=10.0))  # mu_B * std
        >>> round(a, 9), round(gaussian_dp.mu_for_budget(4.0, 1e-5) * 10.0, 9)
        (9.249308977, 9.249308977)
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
        """Share of the budget left, ``max(budget - state, 0) / budget``.

        Parameters
        ----------
        state : numpy.ndarray
            Shape ``(..., 1)``.

        Returns
        -------
        numpy.ndarray

        Examples
        --------
        >>> float(make_filter("gdp", 4.0, 1e-5).remaining_fraction(gdp_filter(4.0, 1e-5).budget / 4))
        0.75
        """
        b = float(self.budget[0])
        room = np.maximum(b - self._checked("state", state)[..., 0], 0.0)
        return room / b if b > 0 else np.zeros_like(room)

    def scaled(self, fraction: float) -> GaussianFilter:
        """The same filter with its budget times ``fraction`` (a per-run quota), rounded down.

        Parameters
        ----------
        fraction : float
            In (0, 1] (else ``ValueError``).

        Returns
        -------
        GaussianFilter

        Examples
        --------
        >>> make_filter("gdp", 4.0, 1e-5).scaled(1.0) == make_filter("gdp", 4.0, 1e-5)
        True
        """
        if not (math.isfinite(fraction) and 0 < fraction <= 1):
            raise ValueError(f"run quota must be a fraction in (0, 1]. Found {fraction!r}.")
        budget = self.budget if fraction == 1 else down(self.budget * fraction)
        return GaussianFilter(self.kind, self.epsilon, self.delta, self.weights, budget, self.orders)

    def epsilon_spent(self, state: np.ndarray) -> float:
        """The smallest epsilon (at this delta) whose filter of this kind admits ``state``: what the
        releases so far used up (the client's guarantee is its budget: a filter, not an odometer).

        Parameters
        ----------
        state : numpy.ndarray
            ONE client's state (else ``ValueError``).

        Returns
        -------
        float
            Rounded up; at most ``self.epsilon`` while the state is within budget.

        Examples
        --------
        >>> eps = make_filter("zcdp", 4.0, 1e-5).epsilon_spent(np.array([0.125]))  # one round at z = 2
        >>> round(eps, 12), round(0.125 + 2 * math.sqrt(0.125 * math.log(1e5)), 12)  # rho + 2 sqrt(rho log(1/delta))
        (2.524262956094, 2.524262956094)
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
        # Within budget the exact answer is at most epsilon; the upward rounding may overshoot it.
        return min(eps, float(self.epsilon)) if self.within_budget(state) else eps


def gdp_filter(epsilon: float, delta: float) -> GaussianFilter:
    """Continue while ``sum mu_t^2 <= mu_B^2``, ``mu_B = gaussian_dp.mu_for_budget(...)`` rounded down.

    Valid for fully adaptive Gaussian releases: Smith and Thakurta 2022 (arXiv 2210.17520) Theorem 1.1;
    Koskela, Tobaben and Honkela, ICLR 2023, Theorem 6.

    Parameters
    ----------
    epsilon, delta : float
        The budget.

    Returns
    -------
    GaussianFilter

    Examples
    --------
    >>> round(float(gdp_filter(4.0, 1e-5).budget[0]), 12), round(gaussian_dp.mu_for_budget(4.0, 1e-5) ** 2, 12)
    (0.855497165459, 0.855497165459)
    """
    _check_eps_delta(epsilon, delta)
    mu_b = gaussian_dp.mu_for_budget(epsilon, delta)
    return GaussianFilter("gdp", epsilon, delta, np.ones(1), np.array([down(mu_b * mu_b)]))


def zcdp_filter(epsilon: float, delta: float) -> GaussianFilter:
    """Feldman and Zrnic 2021, Theorem 4.9: continue while ``sum mu_t^2 / 2 <= B*``.

    Parameters
    ----------
    epsilon, delta : float
        The budget; ``B* = zcdp.zcdp_budget(epsilon, delta)``.

    Returns
    -------
    GaussianFilter

    Examples
    --------
    >>> bool(zcdp_filter(1.0, 1e-5).budget[0] == zcdp.zcdp_budget(1.0, 1e-5))
    True
    """
    _check_eps_delta(epsilon, delta)
    return GaussianFilter("zcdp", epsilon, delta, np.array([0.5]), np.array([zcdp.zcdp_budget(epsilon, delta)]))


def rdp_filter(epsilon: float, delta: float, orders: Sequence[float] | None = None) -> GaussianFilter:
    """Feldman and Zrnic 2021, Theorem 4.3 at the best order, at the full delta: ``rho <= rho*``.

    Parameters
    ----------
    epsilon, delta, orders
        The budget, and the Rényi orders (default ``renyi.DEFAULT_ORDERS``, dp_accounting's).

    Returns
    -------
    GaussianFilter

    Examples
    --------
    >>> bool(rdp_filter(4.0, 1e-5, [2.0, 8.0]).budget[0] == renyi.gaussian_rho_budget([2.0, 8.0], 4.0, 1e-5))
    True
    """
    _check_eps_delta(epsilon, delta)
    orders_arr = renyi.check_orders(renyi.DEFAULT_ORDERS if orders is None else orders)
    rho = renyi.gaussian_rho_budget(orders_arr, epsilon, delta)
    return GaussianFilter("rdp", epsilon, delta, np.array([0.5]), np.array([rho]), tuple(float(a) for a in orders_arr))


def rdp_order(filt: GaussianFilter) -> float:
    """alpha*: the order at which the rdp filter's threshold rho* is attained (from epsilon, delta, orders).

    The largest order with ``B_alpha / alpha == rho*`` (it charges Skellam releases least), or the
    smallest where rho* is the KL shortcut's.

    Parameters
    ----------
    filt : GaussianFilter
        An rdp filter (``ValueError`` for gdp and zcdp).

    Returns
    -------
    float

    Examples
    --------
    >>> filt = rdp_filter(4.0, 1e-5, orders=[2.0, 8.0])
    >>> rdp_order(filt), bool(filt.budget[0] == down(renyi.rdp_budgets([8.0], 4.0, 1e-5)[0] / 8.0))
    (8.0, True)
    """
    if filt.kind != "rdp":
        raise ValueError(f"filter {filt.kind!r} has no Rényi order: only filter='rdp' charges at an order.")
    orders = np.asarray(filt.orders, dtype=np.float64)
    rho = renyi.gaussian_rho_budget(orders, filt.epsilon, filt.delta)
    per_order = down(renyi.rdp_budgets(orders, filt.epsilon, filt.delta) / orders)
    hits = orders[(per_order >= rho) & (per_order > 0)]
    return float(np.max(hits)) if hits.size else float(np.min(orders))


def make_filter(kind: str, epsilon: float, delta: float, orders: Sequence[float] | None = None) -> GaussianFilter:
    """The filter named ``kind`` for one client's lifetime budget (epsilon, delta): a filter (Feldman and
    Zrnic 2021) admits adaptively chosen Gaussian releases while their accumulated loss stays within it.

    Parameters
    ----------
    kind : {"gdp", "rdp", "zcdp"}
        Gaussian DP, Rényi DP over ``orders`` (the only kind that also accounts Skellam noise, so the
        one distributed placement needs), or zCDP.
    epsilon, delta : float
        The budget: epsilon a finite number > 0, delta in (0, 1) (else ``ValueError``, naming it).
    orders : sequence of float, optional
        The Rényi orders of the rdp filter (default ``renyi.DEFAULT_ORDERS``); ignored otherwise.

    Returns
    -------
    GaussianFilter

    Examples
    --------
    >>> filt = make_filter("gdp", 4.0, 1e-5)
    >>> charge = filt.charge(sensitivity=1.0, noise_std=10.0)  # a full-norm round at z = 10
    >>> bool(filt.admits(filt.initial_state(), charge)), filt.spend(filt.initial_state(), charge)
    (True, array([0.01]))
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
    """Feldman and Zrnic 2021, Algorithm 7's per-round clip ``min(C, what the filter(s) still admit)``.

    The Flower client and the vectorised engine both call this (same clip, same charge); constant work.

    Parameters
    ----------
    filt, state, noise_std, clip
        The lifetime filter, its state, the release's noise std and the clip norm ``C``.
    run_filter, run_state : optional
        A per-run quota (``GaussianFilter.scaled``) and its state (required with it).

    Returns
    -------
    numpy.ndarray

    Examples
    --------
    >>> filt = make_filter("gdp", 4.0, 1e-5)
    >>> round_allowance(filt, np.array([[0.0], [filt.budget[0]]]), noise_std=10.0, clip=1.0)
    array([1., 0.])
    """
    allow = np.minimum(np.asarray(clip, dtype=np.float64), filt.allowance(state, noise_std=noise_std))
    if run_filter is not None:  # configuration, not data: a device either has a run quota or not
        if run_state is None:
            raise ValueError("run_state is required with run_filter. Found None.")
        allow = np.minimum(allow, run_filter.allowance(run_state, noise_std=noise_std))
    return allow


def exhausted(allowance, clip, exhausted_below: float) -> np.ndarray:
    """True where what is left is at most ``exhausted_below * C``: the client has nothing to give.

    Parameters
    ----------
    allowance, clip, exhausted_below
        The round's allowance (``round_allowance``), ``C``, and the fraction of ``C`` that counts as none.

    Returns
    -------
    numpy.ndarray of bool

    Examples
    --------
    >>> exhausted(np.array([0.0, 0.5]), 1.0, 0.01)
    array([ True, False])
    """
    return np.asarray(allowance) <= exhausted_below * np.asarray(clip)
