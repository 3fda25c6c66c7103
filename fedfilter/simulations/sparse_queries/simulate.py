"""Continual counting with sparse users: worst-case accounting vs the individual filter.

The setting of Feldman & Zrnic (2021) (Feldman and Zrnic, NeurIPS 2021), Section 4.2 and Theorem 1.2: each of
``n`` users is active (``x[i, t] = 1``) on few days, and every day the analyst asks for the count
of active users through the Gaussian mechanism. Worst-case accounting charges every user a full
release every day, so all filters halt together after ``s`` days; the individual filter charges a
user only on its active days (its own sensitivity ``x[i, t]``) and answers every query, leaving out
of ``S_t`` a user whose filter would not admit today's release. Both use the real filter from
``fedfilter.privacy.filters``. The noise is Corollary 4.7's ``sigma^2 = s / (2 kappa)``, and the
accuracy claim checked is Theorem 1.2 part 2, ``P(|a_t - sum_{S_t} x[i, t]| > sqrt(s log(1/beta) /
kappa)) <= beta`` (T1.2).

Derivation: docs/derivations/sparse_queries.md.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

import numpy as np

from fedfilter.checks import finite, is_int, positive_finite
from fedfilter.privacy.filters import FILTER_KINDS, GaussianFilter, make_filter

# (T1.2) holds for every beta <= exp(-1/pi) = 0.727 (docs/derivations/sparse_queries.md);
# accept failure probabilities up to 0.5, well inside that range.
MAX_FAILURE_PROB = 0.5


@dataclass(frozen=True)
class SparseQueryConfig:
    """One continual-monitoring scenario.

    Users are of two kinds: a ``1 - heavy_share`` majority active on each day with probability
    ``light_rate`` and a ``heavy_share`` minority active with probability ``heavy_rate``.

    Parameters
    ----------
    n_users : int, optional
        Users.
    days : int, optional
        Days (one counting query each).
    sparsity : int, optional
        s: active days the budget pays for (Theorem 1.2).
    light_rate, heavy_rate : float, optional
        Daily activity probability of the two kinds of users.
    heavy_share : float, optional
        The share of heavy users.
    epsilon, delta : float, optional
        Every user's budget.
    filter : str, optional
        The filter kind.
    failure_prob : float, optional
        beta in (T1.2), at most ``MAX_FAILURE_PROB``.
    seed : int, optional
        Seed of the activity and the noise.

    Examples
    --------
    >>> SparseQueryConfig(n_users=200, days=60, sparsity=5).validate().sparsity
    5
    """

    n_users: int = 10_000
    days: int = 365
    sparsity: int = 10  # s: active days the budget pays for (Theorem 1.2)
    light_rate: float = 0.01
    heavy_rate: float = 0.10
    heavy_share: float = 0.10
    epsilon: float = 1.0  # every user's budget (epsilon, delta)
    delta: float = 1e-6
    filter: str = "zcdp"
    failure_prob: float = 0.05  # beta in (T1.2)
    seed: int = 0

    def problems(self) -> list[str]:
        """Every invalid field, each naming the field and its value.

        Returns
        -------
        list of str
            One sentence per problem (empty when the config is valid).

        Examples
        --------
        >>> SparseQueryConfig(days=0).problems()
        ['days must be an integer >= 1. Found 0.']
        """
        out = []

        def need(ok: bool, name: str, what: str) -> None:
            if not ok:
                out.append(f"{name} must be {what}. Found {getattr(self, name)!r}.")

        def is_num(v) -> bool:
            return finite(v) is not None

        need(is_int(self.n_users) and self.n_users >= 1, "n_users", "an integer >= 1")
        need(is_int(self.days) and self.days >= 1, "days", "an integer >= 1")
        need(is_int(self.sparsity) and self.sparsity >= 1, "sparsity", "an integer >= 1")
        for name in ("light_rate", "heavy_rate", "heavy_share"):
            need(is_num(getattr(self, name)) and 0 <= getattr(self, name) <= 1, name, "a number in [0, 1]")
        if problem := positive_finite("epsilon", self.epsilon):
            out.append(problem)
        need(is_num(self.delta) and 0 < self.delta < 1, "delta", "a number in (0, 1)")
        need(self.filter in FILTER_KINDS, "filter", f"one of {', '.join(FILTER_KINDS)}")
        need(
            is_num(self.failure_prob) and 0 < self.failure_prob <= MAX_FAILURE_PROB,
            "failure_prob",
            f"a number in (0, {MAX_FAILURE_PROB}]",
        )
        need(is_int(self.seed) and self.seed >= 0, "seed", "an integer >= 0")
        return out

    def validate(self) -> SparseQueryConfig:
        """The config itself, or ``ValueError`` listing every problem.

        Returns
        -------
        SparseQueryConfig
            ``self``.

        Raises
        ------
        ValueError
            Some field is invalid.

        Examples
        --------
        >>> SparseQueryConfig(failure_prob=0.9).validate()
        Traceback (most recent call last):
            ...
        ValueError: invalid sparse-query config: failure_prob must be a number in (0, 0.5]. Found 0.9.
        """
        problems = self.problems()
        if problems:
            raise ValueError("invalid sparse-query config: " + " ".join(problems))
        return self


def kappa_of(filt: GaussianFilter) -> float:
    """The zCDP level ``kappa`` the filter enforces on a sequence of Gaussian releases.

    A filter continues while ``w_j sum (s_t / std_t)^2 <= B_j`` for some coordinate ``j``, i.e. while
    ``sum s_t^2 / (2 std_t^2) <= B_j / (2 w_j)``: that is ``kappa``-zCDP with ``kappa = B / (2 w)``
    (Bun and Steinke 2016, Proposition 1.6). For ``gdp`` and ``zcdp`` this is the filter's whole
    guarantee (Feldman & Zrnic (2021) Theorem 1.2 part 1); for ``rdp`` it holds at the best order only.

    Parameters
    ----------
    filt : GaussianFilter
        The filter.

    Returns
    -------
    float
        kappa.

    Examples
    --------
    >>> round(kappa_of(make_filter("zcdp", 1.0, 1e-6)), 6)
    0.017469
    """
    return float(np.max(filt.budget / (2.0 * filt.weights)))


def noise_for_sparsity(filt: GaussianFilter, sparsity: int) -> float:
    """Corollary 4.7's noise ``sigma = sqrt(B_norm / (2 kappa))`` with ``B_norm = sparsity``.

    The filter rounds every charge up, so exactly ``sparsity`` unit releases may overshoot its budget
    by a few ulps; ``sigma`` is raised in relative steps of 2^-40 until the filter itself admits
    them (a change far below anything the error bound can see, and reported in the result).

    Parameters
    ----------
    filt : GaussianFilter
        The filter.
    sparsity : int
        The unit releases the budget must pay for.

    Returns
    -------
    float
        sigma.

    Raises
    ------
    RuntimeError
        No sigma close to the formula's fits.

    Examples
    --------
    >>> round(noise_for_sparsity(make_filter("zcdp", 1.0, 1e-6), 5), 4)
    11.9629
    """
    sigma = math.sqrt(sparsity / (2.0 * kappa_of(filt)))
    for _ in range(10_000):
        charge = filt.charge(sensitivity=1.0, noise_std=sigma)
        state = filt.initial_state()
        ok = True
        for _ in range(sparsity):
            ok = ok and bool(filt.admits(state, charge))
            state = filt.spend(state, charge)
        if ok:
            return sigma
        sigma *= 1 + 2.0**-40
    raise RuntimeError(f"could not fit {sparsity} unit releases in the {filt.kind} filter")


def theorem_bound(*, sparsity: int, kappa: float, failure_prob: float) -> float:
    """Feldman & Zrnic (2021) Theorem 1.2 part (2): ``sqrt(s log(1/beta) / kappa)``.

    Parameters
    ----------
    sparsity : int
        s.
    kappa : float
        The filter's zCDP level.
    failure_prob : float
        beta.

    Returns
    -------
    float
        The error bound.

    Examples
    --------
    >>> round(theorem_bound(sparsity=5, kappa=0.017469, failure_prob=0.05), 2)
    29.28
    """
    return math.sqrt(sparsity * math.log(1.0 / failure_prob) / kappa)


def gaussian_bound(*, sigma: float, failure_prob: float) -> float:
    """The same bound in terms of the noise actually added: ``sigma sqrt(2 log(1/beta))``.

    Parameters
    ----------
    sigma : float
        The noise std.
    failure_prob : float
        beta.

    Returns
    -------
    float
        The error bound.

    Examples
    --------
    >>> round(gaussian_bound(sigma=1.0, failure_prob=0.05), 4)
    2.4477
    """
    return sigma * math.sqrt(2.0 * math.log(1.0 / failure_prob))


def exact_exceed_probability(failure_prob: float) -> float:
    """``P(|N(0, sigma^2)| > sigma sqrt(2 log(1/beta)))`` = ``erfc(sqrt(log(1/beta)))``.

    Parameters
    ----------
    failure_prob : float
        beta.

    Returns
    -------
    float
        The probability (at most beta for the betas accepted).

    Examples
    --------
    >>> round(exact_exceed_probability(0.05), 4)
    0.0144
    """
    return math.erfc(math.sqrt(math.log(1.0 / failure_prob)))


def activity(config: SparseQueryConfig, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """``(x, heavy)``: the ``(n_users, days)`` 0/1 indicators and which users are heavy.

    Parameters
    ----------
    config : SparseQueryConfig
        The scenario.
    rng : numpy.random.Generator
        The source of randomness.

    Returns
    -------
    tuple of numpy.ndarray
        ``x`` (float 0/1, users x days) and ``heavy`` (bool per user).

    Examples
    --------
    >>> x, heavy = activity(SparseQueryConfig(n_users=200, days=60), np.random.default_rng(0))
    >>> x.shape, heavy.dtype.name
    ((200, 60), 'bool')
    """
    heavy = rng.random(config.n_users) < config.heavy_share
    rate = np.where(heavy, config.heavy_rate, config.light_rate)
    x = (rng.random((config.n_users, config.days)) < rate[:, None]).astype(np.float64)
    return x, heavy


@dataclass
class MethodRun:
    """What one accounting method answered, day by day (NaN where it answered nothing).

    Parameters
    ----------
    name : str
        ``worst_case`` or ``individual``.
    answers : numpy.ndarray
        a_t.
    truth_active : numpy.ndarray
        The sum over S_t (the quantity Theorem 1.2 bounds the error against).
    truth_all : numpy.ndarray
        The sum over every user.
    users_admitted : numpy.ndarray
        Per day, the users whose filter still admits a unit release.
    state : numpy.ndarray
        The final filter state per user.

    Examples
    --------
    >>> run = MethodRun("m", np.array([1.0, np.nan]), np.ones(2), np.ones(2), np.array([3, 0]), np.zeros((3, 1)))
    >>> run.answered
    1
    """

    name: str
    answers: np.ndarray  # a_t
    truth_active: np.ndarray  # sum over S_t (the quantity Theorem 1.2 bounds the error against)
    truth_all: np.ndarray  # sum over every user
    users_admitted: np.ndarray  # |S_t|-eligible users: whose filter still admits a unit release
    state: np.ndarray = field(repr=False)  # final filter state per user

    @property
    def answered(self) -> int:
        """The days the method answered.

        Returns
        -------
        int
            Days whose answer is not NaN.

        Examples
        --------
        >>> simulate(SparseQueryConfig(n_users=200, days=60, sparsity=5)).individual.answered
        60
        """
        return int(np.sum(~np.isnan(self.answers)))


@dataclass
class SparseQueryResult:
    """Both methods' runs on the same users, with the noise and the bound they were checked against.

    Parameters
    ----------
    config : SparseQueryConfig
        The scenario.
    sigma : float
        The noise std used.
    kappa : float
        The filter's zCDP level.
    bound : float
        (T1.2) evaluated at the sigma actually used.
    theorem_bound : float
        (T1.2) as printed, sigma^2 = s / (2 kappa) exactly.
    worst_case, individual : MethodRun
        The two methods' runs.
    heavy : numpy.ndarray
        Which users are heavy.
    active_days : numpy.ndarray
        Per user, its active days.
    paid_days : numpy.ndarray
        Per user, the active days counted under the filter.
    max_spent_fraction : float, optional
        Max over users of state / budget (the coordinate with most room).
    max_epsilon_spent : float, optional
        That user's epsilon spent.

    Examples
    --------
    >>> result = simulate(SparseQueryConfig(n_users=200, days=60, sparsity=5))
    >>> result.worst_case.answered, result.individual.answered
    (5, 60)
    """

    config: SparseQueryConfig
    sigma: float
    kappa: float
    bound: float  # (T1.2) evaluated at the sigma actually used
    theorem_bound: float  # (T1.2) as printed, sigma^2 = s / (2 kappa) exactly
    worst_case: MethodRun
    individual: MethodRun
    heavy: np.ndarray = field(repr=False)
    active_days: np.ndarray = field(repr=False)  # per user
    paid_days: np.ndarray = field(repr=False)  # per user: active days counted under the filter
    max_spent_fraction: float = 0.0  # max over users of state / budget (the coordinate with most room)
    max_epsilon_spent: float = 0.0

    def summary(self) -> dict:
        """Plain numbers for tables and JSON.

        Returns
        -------
        dict
            The config, sigma, kappa, the bounds, and per method what it answered and its errors.

        Examples
        --------
        >>> s = simulate(SparseQueryConfig(n_users=200, days=60, sparsity=5)).summary()
        >>> s["worst_case"]["answered"], s["individual"]["answered"]
        (5, 60)
        """
        b = self.bound
        out = {
            "config": asdict(self.config),
            "sigma": self.sigma,
            "kappa": self.kappa,
            "bound": b,
            "theorem_bound": self.theorem_bound,
            "expected_exceed_rate": exact_exceed_probability(self.config.failure_prob),
        }
        for run in (self.worst_case, self.individual):
            ans = ~np.isnan(run.answers)
            err_active = np.abs(run.answers[ans] - run.truth_active[ans])
            err_all = np.abs(run.answers[ans] - run.truth_all[ans])
            out[run.name] = {
                "answered": run.answered,
                "exceed_rate": float(np.mean(err_active > b)) if ans.any() else 0.0,
                "within_bound_vs_all_users": int(np.sum(err_all <= b)),
                "mean_abs_error_vs_all_users": float(np.mean(err_all)) if ans.any() else float("nan"),
                "users_admitted_at_end": int(run.users_admitted[-1]),
                # days answered before any active user was left out of S_t (answers exact in law)
                "days_with_everyone": int(np.argmin(np.append(run.truth_active == run.truth_all, False)))
                if ans.all()
                else run.answered,
            }
        out["users"] = {
            "heavy": int(self.heavy.sum()),
            "over_sparsity": int(np.sum(self.active_days > self.config.sparsity)),
            "max_paid_days": int(self.paid_days.max(initial=0)),
            "max_spent_fraction": self.max_spent_fraction,
            "max_epsilon_spent": self.max_epsilon_spent,
        }
        return out


def _run_worst_case(x: np.ndarray, filt: GaussianFilter, sigma: float, rng: np.random.Generator) -> MethodRun:
    """Every user pays a full-sensitivity release every day; stop when the filters refuse it."""
    n, days = x.shape
    state = filt.initial_state(n)
    unit = filt.charge(sensitivity=np.ones(n), noise_std=sigma)
    answers = np.full(days, np.nan)
    admitted = np.zeros(days, dtype=np.int64)
    truth_all = x.sum(axis=0)
    stopped = False
    for t in range(days):
        ok = filt.admits(state, unit)
        admitted[t] = int(ok.sum()) if not stopped else 0
        if stopped or not ok.all():  # every user has the same state: they stop together
            stopped = True
            continue
        state = filt.spend(state, unit)
        answers[t] = truth_all[t] + rng.normal(0.0, sigma)
    return MethodRun("worst_case", answers, truth_all.copy(), truth_all, admitted, state)


def _run_individual(x: np.ndarray, filt: GaussianFilter, sigma: float, rng: np.random.Generator) -> MethodRun:
    """Feldman & Zrnic 2021, Algorithm 3: each user pays ``(x[i, t] / sigma)^2``; refused users leave S_t."""
    n, days = x.shape
    state = filt.initial_state(n)
    answers = np.empty(days)
    truth_active = np.empty(days)
    admitted = np.empty(days, dtype=np.int64)
    unit = filt.charge(sensitivity=np.ones(n), noise_std=sigma)
    for t in range(days):
        charge = filt.charge(sensitivity=x[:, t], noise_std=sigma)
        in_s = filt.admits(state, charge)  # S_t: the filter continues with today's loss
        charge = np.where(in_s[:, None], charge, 0.0)  # rho_t^(i) <- rho_t^(i) 1{X_i in S_t}
        state = filt.spend(state, charge)
        truth_active[t] = float(np.sum(x[:, t] * in_s))
        answers[t] = truth_active[t] + rng.normal(0.0, sigma)
        admitted[t] = int(filt.admits(state, unit).sum())
    return MethodRun("individual", answers, truth_active, x.sum(axis=0), admitted, state)


def simulate(config: SparseQueryConfig) -> SparseQueryResult:
    """Run both accounting methods on the same users (separate, seeded noise streams).

    Parameters
    ----------
    config : SparseQueryConfig
        The scenario (validated here).

    Returns
    -------
    SparseQueryResult
        Both runs.

    Raises
    ------
    ValueError
        An invalid config.

    Examples
    --------
    >>> result = simulate(SparseQueryConfig(n_users=200, days=60, sparsity=5))
    >>> round(result.sigma, 4), result.individual.users_admitted.shape
    (11.9629, (60,))
    """
    config.validate()
    data_rng, wc_rng, ind_rng = (np.random.default_rng(s) for s in np.random.SeedSequence(config.seed).spawn(3))
    filt = make_filter(config.filter, config.epsilon, config.delta)
    x, heavy = activity(config, data_rng)
    kappa = kappa_of(filt)
    sigma = noise_for_sparsity(filt, config.sparsity)
    worst = _run_worst_case(x, filt, sigma, wc_rng)
    indiv = _run_individual(x, filt, sigma, ind_rng)
    paid = np.rint(indiv.state[:, 0] / filt.charge(sensitivity=1.0, noise_std=sigma)[0]).astype(np.int64)
    # The filter holds while *some* coordinate is within its budget: a user's share spent is read
    # on the coordinate with the most room (the only one for gdp and zcdp).
    spent = 1.0 - filt.remaining_fraction(indiv.state)
    worst_user = int(np.argmax(spent))
    return SparseQueryResult(
        config=config,
        sigma=sigma,
        kappa=kappa,
        bound=gaussian_bound(sigma=sigma, failure_prob=config.failure_prob),
        theorem_bound=theorem_bound(sparsity=config.sparsity, kappa=kappa, failure_prob=config.failure_prob),
        worst_case=worst,
        individual=indiv,
        heavy=heavy,
        active_days=x.sum(axis=1).astype(np.int64),
        paid_days=paid,
        max_spent_fraction=float(spent[worst_user]),
        max_epsilon_spent=float(filt.epsilon_spent(indiv.state[worst_user])),
    )
