"""Individual privacy filters: pure functions over a one-number state, one row per client.

Every release is a Gaussian mechanism with sensitivity ``s`` (the norm of the clipped update) and
noise standard deviation ``std``, ``mu_t = s / std``. Each filter keeps one running sum, ``weight *
sum mu_t^2``, and continues while it is at most the budget:

=======  =====================  ======  ==================================================
kind     state                  weight  budget (continue while state <= budget)
=======  =====================  ======  ==================================================
gdp      sum mu_t^2             1       mu_B^2, mu_B from the exact Gaussian-DP curve
zcdp     rho = sum mu_t^2 / 2   1/2     B* of Feldman and Zrnic 2021, Theorem 4.9
rdp      rho = sum mu_t^2 / 2   1/2     rho* = max_alpha B_alpha / alpha over the orders
=======  =====================  ======  ==================================================

Validity. gdp: Smith and Thakurta 2022 (arXiv 2210.17520) Theorem 1.1 / Koskela, Tobaben and
Honkela ICLR 2023 Theorem 6 (fully adaptive composition of Gaussian mechanisms). zcdp: Feldman and
Zrnic, "Individual Privacy Accounting via a Rényi Filter" (NeurIPS 2021), Theorem 4.9 with Remark 4.4.

rdp: a Gaussian release is ``(alpha, alpha mu_t^2 / 2)``-RDP at every order alpha (Mironov 2017,
Proposition 7), so "some order within its budget B_alpha" is the single threshold ``rho <= rho*``,
which is Feldman and Zrnic 2021 Theorem 4.3's filter at the one order alpha* attaining it
(``rdp_order``), fixed before any release; the transcript converts (Canonne, Kamath and Steinke
2020, Proposition 12) to (epsilon, delta) at the FULL delta, with no union bound over orders. A
Skellam release (``skellam.py``) is charged ``eps(alpha*) / alpha*`` in the same rho units, and then
the transcript is RDP at alpha* only, which is why ``epsilon_spent`` reads the state at alpha*. The
argument (and the KL shortcut) is in docs/derivations/rdp-filter.md.

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

    A release of sensitivity ``s`` and noise std ``std`` adds ``weights * (s/std)^2`` to the state.
    Build one with ``make_filter`` (or ``gdp_filter``, ``zcdp_filter``, ``rdp_filter``), which
    computes the budget from (epsilon, delta); the constructor only stores it.

    Parameters
    ----------
    kind : {"gdp", "rdp", "zcdp"}
        Which accounting the state is in (``FILTER_KINDS``).
    epsilon : float
        The (epsilon, delta) budget the filter certifies.
    delta : float
        The budget's delta, in (0, 1).
    weights : numpy.ndarray
        Shape ``(1,)``: the charge of a release is ``weights * (s/std)^2`` (1 for gdp, 1/2 otherwise).
    budget : numpy.ndarray
        Shape ``(1,)``: the largest state the filter admits.
    orders : tuple of float, optional
        The Rényi orders the rdp filter converts with (empty for the others).

    Raises
    ------
    ValueError
        If ``weights`` or ``budget`` does not have shape ``(1,)``.

    Examples
    --------
    >>> filt = make_filter("zcdp", 4.0, 1e-5)
    >>> filt
    GaussianFilter(kind='zcdp', epsilon=4.0, delta=1e-05, orders=())
    >>> filt.weights, filt.dim
    (array([0.5]), 1)
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
        """The state of a client that has spent nothing: zeros.

        Parameters
        ----------
        n_clients : int, optional
            With it, one row per client (shape ``(n_clients, 1)``); without, one client (``(1,)``).

        Returns
        -------
        numpy.ndarray
            Float64 zeros.

        Examples
        --------
        >>> filt = make_filter("gdp", 1.0, 1e-5)
        >>> filt.initial_state()
        array([0.])
        >>> filt.initial_state(2).shape
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
        """The loss of one release, rounded up; shape ``(..., 1)``.

        Parameters
        ----------
        sensitivity : float or array_like
            The release's L2 sensitivity ``s`` (the norm of the clipped update), finite and >= 0.
            Broadcasts over a leading client axis.
        noise_std : float or array_like
            The std ``std`` of the Gaussian noise the release carries, finite and > 0.

        Returns
        -------
        numpy.ndarray
            ``weights * (s/std)^2`` rounded up, shape ``(..., 1)``; exactly 0 where ``s == 0``.

        Raises
        ------
        ValueError
            Naming a negative or non-finite sensitivity, or a noise std that is not > 0.

        Examples
        --------
        A zCDP charge is the Gaussian mechanism's ``rho = s^2 / (2 std^2)``:

        >>> filt = make_filter("zcdp", 4.0, 1e-5)
        >>> filt.charge(sensitivity=1.0, noise_std=2.0), 1.0**2 / (2 * 2.0**2)
        (array([0.125]), 0.125)
        >>> filt.charge(sensitivity=[0.0, 1.0], noise_std=2.0)
        array([[0.   ],
               [0.125]])
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
        """The state after a release (rounded up). Does not check the budget: see ``admits``.

        Adding an exact zero is exact, so a release without data (charge 0) leaves the state as is.

        Parameters
        ----------
        state : numpy.ndarray
            The client's state, shape ``(..., 1)``.
        charge : numpy.ndarray
            The release's charge (``charge``), shape ``(..., 1)``.

        Returns
        -------
        numpy.ndarray
            ``state + charge`` rounded up (a new array; ``state`` is not modified).

        Examples
        --------
        >>> filt = make_filter("zcdp", 4.0, 1e-5)
        >>> state = filt.spend(filt.initial_state(), filt.charge(sensitivity=1.0, noise_std=2.0))
        >>> state
        array([0.125])
        >>> filt.spend(state, filt.charge(sensitivity=0.0, noise_std=2.0))
        array([0.125])
        """
        state, charge = self._checked("state", state), self._checked("charge", charge)
        return np.where(charge > 0, add_up(state, charge), state)

    def within_budget(self, state: np.ndarray) -> np.ndarray:
        """True where the state is within the budget (the filter says CONT).

        Parameters
        ----------
        state : numpy.ndarray
            The state, shape ``(..., 1)``.

        Returns
        -------
        numpy.ndarray of bool
            ``state <= budget``, shape ``(...)``.

        Examples
        --------
        >>> filt = make_filter("zcdp", 4.0, 1e-5)
        >>> filt.within_budget(np.array([[0.0], [1.0]]))
        array([ True, False])
        """
        return self._checked("state", state)[..., 0] <= self.budget[0]

    def admits(self, state: np.ndarray, charge: np.ndarray) -> np.ndarray:
        """True where the release keeps the client within its budget.

        Parameters
        ----------
        state : numpy.ndarray
            The state before the release, shape ``(..., 1)``.
        charge : numpy.ndarray
            The release's charge, shape ``(..., 1)``.

        Returns
        -------
        numpy.ndarray of bool
            ``within_budget(spend(state, charge))``, shape ``(...)``.

        Examples
        --------
        The zCDP budget at epsilon = 4, delta = 1e-5 is about 0.298, so two rounds at z = 2 (0.125
        each) fit and a third does not:

        >>> filt = make_filter("zcdp", 4.0, 1e-5)
        >>> c = filt.charge(sensitivity=1.0, noise_std=2.0)
        >>> bool(filt.admits(np.array([0.125]), c)), bool(filt.admits(np.array([0.25]), c))
        (True, False)
        """
        return self.within_budget(self.spend(state, charge))

    def allowance(self, state: np.ndarray, *, noise_std) -> np.ndarray:
        """The largest sensitivity still admitted at this noise (rounded down; 0 if none).

        Feldman and Zrnic 2021, Algorithm 7's ``min(C, sqrt(B_norm - sum ||g_j||^2))``, the minimum
        over C taken by the caller. Two closed-form candidates ``std * sqrt(room / w)``, each
        ``_ALLOWANCE_SLACK`` low: ``first`` with ``room = B - S`` (the allowance of earlier versions,
        bit for bit); ``second`` with ``room = down(B) - S``, which is admitted by the error bounds
        alone (its charge is at most ``room``, so the up-rounded sum stays <= B) and lands within
        about 200 ulps of B; ``first`` (never below ``second``) misses only when B - S is under
        about 1% of B. The result is ``first`` if admitted, else ``second`` if admitted, else 0:
        admitted by construction (``admits`` itself decides), and the same work whatever the state
        (both candidates are always charged and checked, no early exit), so the time it takes does
        not reveal whether the budget is spent.

        Parameters
        ----------
        state : numpy.ndarray
            The client's state, shape ``(..., 1)``.
        noise_std : float or array_like
            The noise std of the coming release.

        Returns
        -------
        numpy.ndarray
            The allowance per client, shape ``(...)``; ``admits`` accepts its charge.

        Examples
        --------
        A fresh gdp client may release a sensitivity up to ``mu_B * std``:

        >>> filt = make_filter("gdp", 4.0, 1e-5)
        >>> a = float(filt.allowance(filt.initial_state(), noise_std=10.0))
        >>> round(a, 9), round(gaussian_dp.mu_for_budget(4.0, 1e-5) * 10.0, 9)
        (9.249308977, 9.249308977)
        >>> bool(filt.admits(filt.initial_state(), filt.charge(sensitivity=a, noise_std=10.0)))
        True
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
        """Share of the budget left, in [0, 1].

        Parameters
        ----------
        state : numpy.ndarray
            The state, shape ``(..., 1)``.

        Returns
        -------
        numpy.ndarray
            ``max(budget - state, 0) / budget``, shape ``(...)``.

        Examples
        --------
        >>> filt = make_filter("gdp", 4.0, 1e-5)
        >>> float(filt.remaining_fraction(filt.budget / 4))
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
            The share of the budget, in (0, 1].

        Returns
        -------
        GaussianFilter
            Same kind, epsilon, delta, weights and orders; budget ``down(budget * fraction)``.

        Raises
        ------
        ValueError
            If ``fraction`` is not in (0, 1].

        Examples
        --------
        >>> filt = make_filter("gdp", 4.0, 1e-5)
        >>> bool(filt.scaled(0.5).budget[0] <= filt.budget[0] / 2), filt.scaled(1.0) == filt
        (True, True)
        """
        if not (math.isfinite(fraction) and 0 < fraction <= 1):
            raise ValueError(f"run quota must be a fraction in (0, 1]. Found {fraction!r}.")
        budget = self.budget if fraction == 1 else down(self.budget * fraction)
        return GaussianFilter(self.kind, self.epsilon, self.delta, self.weights, budget, self.orders)

    def epsilon_spent(self, state: np.ndarray) -> float:
        """The smallest epsilon (at this delta) whose filter of this kind admits ``state``.

        This is how much of the budget the releases so far used up, in epsilon units; the
        guarantee the client holds is its budget (a filter, not an odometer).

        Parameters
        ----------
        state : numpy.ndarray
            ONE client's state (one value).

        Returns
        -------
        float
            The epsilon, rounded up; at most ``self.epsilon`` while the state is within budget.

        Raises
        ------
        ValueError
            If ``state`` holds more than one client.

        Examples
        --------
        One round at z = 2 is 0.125-zCDP, i.e. ``rho + 2 sqrt(rho log(1/delta))``:

        >>> filt = make_filter("zcdp", 4.0, 1e-5)
        >>> state = filt.spend(filt.initial_state(), filt.charge(sensitivity=1.0, noise_std=2.0))
        >>> filt.epsilon_spent(state)
        2.524262956094046
        >>> round(0.125 + 2 * math.sqrt(0.125 * math.log(1e5)), 12)
        2.524262956094
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
    """The Gaussian-DP filter: continue while ``sum mu_t^2 <= mu_B^2``, ``mu_B`` from the exact curve.

    ``mu_B = gaussian_dp.mu_for_budget(epsilon, delta)``; its square is rounded down.

    Parameters
    ----------
    epsilon : float
        The budget's epsilon, finite and > 0.
    delta : float
        The budget's delta, in (0, 1).

    Returns
    -------
    GaussianFilter
        Kind ``"gdp"``, weight 1, budget ``mu_B^2``.

    Examples
    --------
    >>> filt = gdp_filter(4.0, 1e-5)
    >>> round(float(filt.budget[0]), 12), round(gaussian_dp.mu_for_budget(4.0, 1e-5) ** 2, 12)
    (0.855497165459, 0.855497165459)
    """
    _check_eps_delta(epsilon, delta)
    mu_b = gaussian_dp.mu_for_budget(epsilon, delta)
    return GaussianFilter("gdp", epsilon, delta, np.ones(1), np.array([down(mu_b * mu_b)]))


def zcdp_filter(epsilon: float, delta: float) -> GaussianFilter:
    """Feldman and Zrnic 2021, Theorem 4.9: continue while ``sum mu_t^2 / 2 <= B*``.

    Parameters
    ----------
    epsilon : float
        The budget's epsilon, finite and > 0.
    delta : float
        The budget's delta, in (0, 1).

    Returns
    -------
    GaussianFilter
        Kind ``"zcdp"``, weight 1/2, budget ``zcdp.zcdp_budget(epsilon, delta)``.

    Examples
    --------
    >>> bool(zcdp_filter(1.0, 1e-5).budget[0] == zcdp.zcdp_budget(1.0, 1e-5))
    True
    """
    _check_eps_delta(epsilon, delta)
    return GaussianFilter("zcdp", epsilon, delta, np.array([0.5]), np.array([zcdp.zcdp_budget(epsilon, delta)]))


def rdp_filter(epsilon: float, delta: float, orders: Sequence[float] | None = None) -> GaussianFilter:
    """Feldman and Zrnic 2021, Theorem 4.3 at the best order of the grid, at the full delta.

    Continue while ``sum mu_t^2 / 2 <= rho*`` (docs/derivations/rdp-filter.md).

    Parameters
    ----------
    epsilon : float
        The budget's epsilon, finite and > 0.
    delta : float
        The budget's delta, in (0, 1).
    orders : sequence of float, optional
        The Rényi orders (default ``renyi.DEFAULT_ORDERS``, dp_accounting's).

    Returns
    -------
    GaussianFilter
        Kind ``"rdp"``, weight 1/2, budget ``renyi.gaussian_rho_budget(orders, epsilon, delta)``.

    Examples
    --------
    >>> filt = rdp_filter(4.0, 1e-5, orders=[2.0, 8.0])
    >>> bool(filt.budget[0] == renyi.gaussian_rho_budget([2.0, 8.0], 4.0, 1e-5)), filt.orders
    (True, (2.0, 8.0))
    """
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
    so a run quota (``scaled``) keeps its lifetime filter's order.

    Parameters
    ----------
    filt : GaussianFilter
        An rdp filter.

    Returns
    -------
    float
        The order alpha*.

    Raises
    ------
    ValueError
        For a gdp or zcdp filter.

    Examples
    --------
    >>> rdp_order(rdp_filter(4.0, 1e-5))
    6.1
    >>> filt = rdp_filter(4.0, 1e-5, orders=[2.0, 8.0])
    >>> order = rdp_order(filt)
    >>> order, bool(filt.budget[0] == down(renyi.rdp_budgets([order], 4.0, 1e-5)[0] / order))
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
    """The filter named ``kind`` for one client's lifetime budget (epsilon, delta).

    A filter (Feldman and Zrnic 2021) admits a sequence of adaptively chosen Gaussian releases while their
    accumulated privacy loss stays within the budget; each client holds its own state.

    Parameters
    ----------
    kind : {"gdp", "rdp", "zcdp"}
        ``FILTER_KINDS``: Gaussian DP (fully adaptive composition of Gaussian mechanisms, the
        module docstring's references), Rényi DP over ``orders`` (Feldman and Zrnic 2021, Theorem
        4.3; the only kind that also accounts Skellam noise, so the one distributed placement
        needs), or zero-concentrated DP (ibid. Theorem 4.9).
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
    """Feldman and Zrnic 2021, Algorithm 7's per-round clip ``min(C, what the filter(s) still admit)``.

    The Flower client (one row) and the vectorised engine (one row per client) both call this,
    so they clip and charge identically. Constant work: no branch depends on the states.

    Parameters
    ----------
    filt : GaussianFilter
        The client's lifetime filter.
    state : numpy.ndarray
        Its state, shape ``(..., 1)``.
    noise_std : float or array_like
        The noise std of the coming release.
    clip : float or array_like
        The round's clip norm ``C``.
    run_filter : GaussianFilter, optional
        A per-run quota (``GaussianFilter.scaled``) the release must fit as well.
    run_state : numpy.ndarray, optional
        The quota's state; required with ``run_filter``.

    Returns
    -------
    numpy.ndarray
        The largest norm this round's update may carry, per client.

    Raises
    ------
    ValueError
        If ``run_filter`` is given without ``run_state``.

    Examples
    --------
    >>> filt = make_filter("gdp", 4.0, 1e-5)
    >>> round_allowance(filt, filt.initial_state(2), noise_std=10.0, clip=1.0)
    array([1., 1.])
    >>> spent = filt.budget.reshape(1, 1)
    >>> round_allowance(filt, spent, noise_std=10.0, clip=1.0)
    array([0.])
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
    allowance : float or array_like
        The round's allowance (``round_allowance``).
    clip : float or array_like
        The clip norm ``C``.
    exhausted_below : float
        The fraction of ``C`` at or below which an allowance counts as exhausted.

    Returns
    -------
    numpy.ndarray of bool
        ``allowance <= exhausted_below * clip``.

    Examples
    --------
    >>> exhausted(np.array([0.0, 0.5]), 1.0, 0.01)
    array([ True, False])
    """
    return np.asarray(allowance) <= exhausted_below * np.asarray(clip)
