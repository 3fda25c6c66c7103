"""Feldman & Zrnic (2021, short version): private GD with and without filtering on UCI Adult.

The short version of Feldman & Zrnic (2021) reports Adult accuracies for eps in {0.3, 0.5, 1.2}
(delta = 1e-5) but gives no model or hyperparameters for Adult (neither does the full version, whose
Appendix A covers MNIST only). We use
logistic regression (``fedfilter.simulations.tasks.models.LogisticRegression``, 108 one-hot/standardised
features + bias) with one single-example client per training row (32,561), full-batch GD, and
choose (C, eta, k) per eps by the same protocol the paper describes for MNIST: tune private GD,
then give GD with filtering the same hyperparameters, ``B_norm = k C^2``, and the stopping rule
(8 training-accuracy queries, 5 steps apart, from step k). Tuning is on a validation split of the
training rows (``tune_split``), never on the test set; sigma follows from (eps, k) through
Proposition 5.1 (``k / (2 sigma^2)``-zCDP at the target eps).
"""

from __future__ import annotations

import math

import numpy as np

from fedfilter.privacy import zcdp
from fedfilter.simulations.reproduce.private_gd import (
    QUERIES,
    QUERY_EVERY,
    GDSetting,
    gdp_noise_setting,
    gdp_steps_setting,
    paper_setting,
    single_example_task,
)

DELTA = 1e-5
EPSILONS = (0.3, 0.5, 1.2)
VARIANTS = ("paper", "gdp-noise", "gdp-steps")
# Feldman & Zrnic (2021, short version) 'Adult accuracies' table, percent: (private GD, private GD w/ filtering).
PAPER_TABLE = {
    0.3: ((83.80, 0.22), (83.91, 0.12)),
    0.5: ((84.11, 0.15), (84.18, 0.10)),
    1.2: ((84.45, 0.13), (84.48, 0.15)),
}
# The grid searched by ``benchmarks/reproduce_adult.py --tune``.
GRID = {"clip": (0.5, 1.0, 2.0), "eta": (2.0, 4.0, 8.0), "k": (50, 100, 200)}


def sigma_for(epsilon: float, k: int, delta: float = DELTA) -> float:
    """The sigma at which k full-norm steps are exactly (eps, delta)-DP by Proposition 5.1 + Theorem 4.9.

    Parameters
    ----------
    epsilon : float
        The target.
    k : int
        Full-norm steps.
    delta : float, optional
        The delta.

    Returns
    -------
    float
        sigma.

    Examples
    --------
    >>> round(sigma_for(0.5, 100), 3)
    97.001
    """
    return math.sqrt(k / (2 * zcdp.zcdp_budget(epsilon, delta)))


def setting(epsilon: float, variant: str, *, clip: float, eta: float, k: int) -> GDSetting:
    """The GDSetting of one column at tuned (C, eta, k); ``variant`` in ``VARIANTS``.

    Parameters
    ----------
    epsilon : float
        The target.
    variant : str
        ``paper``, ``gdp-noise`` or ``gdp-steps``.
    clip, eta : float
        The tuned clip and step size.
    k : int
        The tuned number of steps.

    Returns
    -------
    GDSetting
        The column.

    Examples
    --------
    >>> s = setting(0.5, "paper", clip=1.0, eta=4.0, k=100)
    >>> s.k, s.filter_kind, round(s.sigma, 3)
    (100, 'zcdp', 97.001)
    """
    base = paper_setting(
        epsilon,
        "tuned",
        sigma=sigma_for(epsilon, k),
        clip=clip,
        eta=eta,
        k=k,
        delta=DELTA,
        extra_steps=(QUERIES - 1) * QUERY_EVERY,
    )
    if variant == "paper":
        return base
    return gdp_noise_setting(base) if variant == "gdp-noise" else gdp_steps_setting(base)


def adult_task(split: str = "full", seed: int = 0):
    """Single-example Adult clients: ``full`` (train -> test) or ``tune`` (80% train -> 20% validation).

    Parameters
    ----------
    split : str, optional
        ``full`` or ``tune``.
    seed : int, optional
        The seed of the tuning split.

    Returns
    -------
    Task
        One client per training row.

    Examples
    --------
    It reads the offline Adult files (``$FEDFILTER_DATA/adult``):

    >>> adult_task("tune").num_clients  # doctest: +SKIP
    26048
    """
    from functools import partial

    from torch.nn import functional as F

    from fedfilter.simulations.tasks.adult import load_adult
    from fedfilter.simulations.tasks.models import LogisticRegression

    x, y, x_test, y_test = load_adult()
    if split == "tune":
        order = np.random.default_rng(seed).permutation(len(y))
        cut = int(0.8 * len(y))
        x, y, x_test, y_test = x[order[:cut]], y[order[:cut]], x[order[cut:]], y[order[cut:]]
    return single_example_task(
        "adult", x, y, x_test, y_test, partial(LogisticRegression, x.shape[1]), F.cross_entropy, 2
    )
