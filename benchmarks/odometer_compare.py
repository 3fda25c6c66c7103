"""Filter readout against odometers on the same Gaussian spend histories (docs/results.md).

Each history is T rounds at mu = clip / noise std = 1 / noise multiplier (a device sending a full
clipped update each round). Columns, all epsilons at delta (default 1e-5):

* ``filter spent``: the gdp filter's readout ``epsilon_spent`` (exact GDP curve at sqrt(sum mu^2));
  a guarantee only as the budget of a filter fixed in advance, not for a device that stops now.
* ``gdp odometer``: ``odometer.gdp_odometer`` (valid at every round at once).
* ``rdp odometer``: ``odometer.rdp_odometer`` at alpha* of an rdp ledger enrolled with epsilon
  ``--rdp-budget`` (the one order its state keeps).
* ``Thm 6.5``: Rogers et al. (2016) Theorem 6.5 through Lemma 3.3: each round as (eps_t, delta_t)-DP on the
  Gaussian curve, eps_t the smallest with ``T * 2 delta_t / (eps_t e^eps_t) <= delta/2`` (bisection),
  and the advanced odometer at (2 eps_t) with delta/2 and ``--n``; total delta as the others.

    python benchmarks/odometer_compare.py
"""

from __future__ import annotations

import argparse
import math

from fedfilter.privacy import odometer as odo
from fedfilter.privacy.filters import rdp_filter, rdp_order
from fedfilter.privacy.gaussian_dp import epsilon_for_mu
from fedfilter.privacy.pure_dp import gaussian_as_approx_dp, lemma33_delta_charge

HISTORIES = [(1.0, 1), (1.0, 5), (2.0, 20), (5.0, 10), (5.0, 100), (10.0, 100), (10.0, 400), (20.0, 1000)]


def theorem65_via_lemma33(mu: float, rounds: int, delta: float, n: int) -> float:
    share = delta / 2

    def charge(eps_t: float) -> float:
        return rounds * lemma33_delta_charge(*gaussian_as_approx_dp(mu, eps_t))

    lo, hi = 1e-9, 50.0
    if charge(hi) > share:
        return math.inf
    for _ in range(200):  # the charge falls as eps_t grows: keep hi admissible
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if charge(mid) <= share else (mid, hi)
    eps = [hi] * rounds
    return odo.lemma33_odometer(lambda e: odo.advanced_odometer(e, delta_g=share, n=n), eps, [1e-300] * rounds, share)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--delta", type=float, default=1e-5)
    p.add_argument("--n", type=int, default=1000, help="Rogers et al. (2016) Theorem 6.5's n")
    p.add_argument("--rdp-budget", type=float, default=4.0)
    args = p.parse_args()
    filt = rdp_filter(args.rdp_budget, args.delta)
    alpha = rdp_order(filt)
    print(f"delta={args.delta:g}; rdp ledger of budget epsilon {args.rdp_budget:g} keeps order alpha*={alpha:g}")
    print(
        "| noise mult. | rounds | sum mu^2 | filter spent | gdp odometer | rdp odometer | Rogers et al. Thm 6.5 |\n"
        "|---:|---:|---:|---:|---:|---:|---:|"
    )
    for sigma, rounds in HISTORIES:
        mu = 1 / sigma
        v = rounds * mu * mu
        spent = epsilon_for_mu(math.sqrt(v), args.delta)
        gdp = odo.gdp_odometer(v, delta_g=args.delta)
        rdp = odo.rdp_odometer(alpha * v / 2, order=alpha, delta_g=args.delta)
        thm = theorem65_via_lemma33(mu, rounds, args.delta, args.n)
        print(f"| {sigma:g} | {rounds} | {v:.3g} | {spent:.3f} | {gdp:.3f} | {rdp:.3f} | {thm:.3f} |")


if __name__ == "__main__":
    main()
