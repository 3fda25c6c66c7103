"""``fedfilter odometer``: the privacy odometer of a given history (``privacy/odometer.py``).

Per-round losses in each kind's natural units: ``--epsilons`` (pure-DP epsilons, with optional
``--deltas`` through Rogers et al. (2016) Lemma 3.3) for ``basic`` and ``advanced``; ``--mus`` (Gaussian-DP
mu_t, the noise multiplier's inverse times the clipped norm) for ``gdp``; ``--rdp`` (Rényi losses
at ``--order``) for ``rdp``. The value bounds the privacy loss at every round at once with
probability ``1 - delta``, ``delta`` as printed (``--delta-g``, plus ``--delta-g-prime`` with
``--deltas``).
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Callable

from fedfilter.privacy import odometer as odo
from fedfilter.privacy.rounding import add_up, square_up

KINDS = ("advanced", "basic", "gdp", "rdp")


def _floats(name: str, text: str | None) -> list[float]:
    if text is None or text.strip() == "":
        return []
    try:
        return [float(x) for x in text.split(",")]
    except ValueError:
        raise ValueError(f"{name} must be comma-separated numbers. Found {text!r}.") from None


def _need(args: argparse.Namespace, flag: str, kind: str):
    value = getattr(args, flag.lstrip("-").replace("-", "_"))
    if value is None:
        raise ValueError(f"{flag} is required with --kind {kind}. Found none.")
    return value


def odometer_value(args: argparse.Namespace) -> dict:
    """The odometer (privacy loss so far, valid at every round at once) of the history in ``args``.

    Parameters
    ----------
    args : argparse.Namespace
        The parsed ``odometer`` options: ``kind``, ``delta_g`` and the history the kind reads
        (``epsilons``/``deltas``/``delta_g_prime``/``n``, ``mus``, or ``rdp`` with ``order``).

    Returns
    -------
    dict
        ``kind``, ``epsilon``, the ``delta`` it holds at, ``rounds`` and the kind's own totals
        (``sum_mu_sq``, ``sum_rdp``, ``branch``).

    Raises
    ------
    ValueError
        A missing or malformed option of the kind.

    Examples
    --------
    >>> parser = argparse.ArgumentParser(prog="fedfilter")
    >>> register(parser.add_subparsers(dest="command"))
    >>> out = odometer_value(parser.parse_args(["odometer", "--kind", "gdp", "--mus", "0.5,0.5", "--delta-g", "1e-5"]))
    >>> out["rounds"], round(out["epsilon"], 4)
    (2, 4.2769)
    """
    kind = args.kind
    out: dict = {"kind": kind, "delta": args.delta_g}
    if kind in ("basic", "advanced"):
        eps = _floats("--epsilons", _need(args, "--epsilons", kind))
        out["rounds"] = len(eps)
        pure: Callable[[list[float]], float] = odo.basic_odometer
        if kind == "advanced":
            n = _need(args, "--n", kind)
            out["n"] = n
            out["branch"] = odo.advanced_branch(eps if args.deltas is None else [2 * e for e in eps], n)

            def advanced(values: list[float]) -> float:
                return odo.advanced_odometer(values, delta_g=args.delta_g, n=n)

            pure = advanced

        if args.deltas is None:
            out["epsilon"] = pure(eps)
        else:  # Rogers et al. (2016) Lemma 3.3: valid at delta_g + delta_g'
            prime = _need(args, "--delta-g-prime", kind)
            out["epsilon"] = odo.lemma33_odometer(pure, eps, _floats("--deltas", args.deltas), prime)
            out["delta"] = float(add_up(args.delta_g, prime))
    elif kind == "gdp":
        mus = odo.check_losses("--mus", _floats("--mus", _need(args, "--mus", kind)))
        total = 0.0
        for mu in mus:
            total = float(add_up(total, square_up(mu)))
        out.update(rounds=len(mus), sum_mu_sq=total, epsilon=odo.gdp_odometer(total, delta_g=args.delta_g))
    elif kind == "rdp":
        losses = odo.check_losses("--rdp", _floats("--rdp", _need(args, "--rdp", kind)))
        order = _need(args, "--order", kind)
        total = 0.0
        for r in losses:
            total = float(add_up(total, r))
        out.update(
            rounds=len(losses),
            order=order,
            sum_rdp=total,
            epsilon=odo.rdp_odometer(total, order=order, delta_g=args.delta_g),
        )
    else:
        raise ValueError(f"--kind must be one of {', '.join(KINDS)}. Found {kind!r}.")
    return out


def _run(args: argparse.Namespace) -> int:
    out = odometer_value(args)
    if args.json:
        print(json.dumps(out))
        return 0
    eps = "inf (the deltas' charge exceeds --delta-g-prime)" if math.isinf(out["epsilon"]) else f"{out['epsilon']:.6g}"
    branch = f" (equation ({out['branch']}))" if "branch" in out else ""
    print(f"odometer {out['kind']}{branch}: epsilon={eps} at delta={out['delta']:g}, valid at every round at once")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``odometer`` to the ``fedfilter`` command.

    Parameters
    ----------
    sub : argparse._SubParsersAction
        The ``fedfilter`` parser's sub-commands.

    Examples
    --------
    >>> parser = argparse.ArgumentParser(prog="fedfilter")
    >>> register(parser.add_subparsers(dest="command"))
    >>> args = parser.parse_args(["odometer", "--kind", "gdp", "--mus", "0.5,0.5", "--delta-g", "1e-5"])
    >>> args.func(args)
    odometer gdp: epsilon=4.27687 at delta=1e-05, valid at every round at once
    0
    """
    p = sub.add_parser("odometer", help="the privacy odometer (loss so far, valid at any moment) of a history")
    p.add_argument(
        "--kind",
        choices=list(KINDS),
        required=True,
        help="basic/advanced: Rogers et al. (2016) Theorems 3.4/6.5 over --epsilons; gdp: --mus; rdp: --rdp at --order",
    )
    p.add_argument("--epsilons", help="basic/advanced: per-round pure-DP epsilons, comma-separated")
    p.add_argument("--deltas", help="basic/advanced: per-round deltas (Rogers et al. (2016) Lemma 3.3)")
    p.add_argument("--delta-g", type=float, required=True, help="the odometer's failure probability")
    p.add_argument("--delta-g-prime", type=float, help="with --deltas: the share for the deltas (Lemma 3.3)")
    p.add_argument("--n", type=int, help="advanced: n of Rogers et al. (2016) Theorem 6.5")
    p.add_argument("--mus", help="gdp: per-round Gaussian-DP mu_t, comma-separated")
    p.add_argument("--rdp", help="rdp: per-round Rényi losses at --order, comma-separated")
    p.add_argument("--order", type=float, help="rdp: the Rényi order alpha > 1")
    p.add_argument("--json", action="store_true", help="print the value, its delta and (advanced) the branch as JSON")
    p.set_defaults(func=_run)
