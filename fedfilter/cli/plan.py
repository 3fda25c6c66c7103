"""``fedfilter plan``: will this federation learn, and can its devices pay for it?

The figures come from ``fedfilter.planning.federation`` (the expected noise norm of the
released mean against the clip, and the device's own filter for the rounds); this module only
reads the arguments, counts a model's parameters (``--app-dir``) and prints. In distributed placement
it adds the device's worst-case account (``budget_options.worst_case_plan``): the worst-case-epsilon
the wanted rounds need, each report read alone, and with ``--worst-case-epsilon`` the rounds it admits.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from fedfilter.cli.budget_options import table, worst_case_plan, worst_case_rows
from fedfilter.client.settings.policy import ClientPolicy
from fedfilter.planning.federation import TARGET_NOISE_TO_CLIP, plan_federation
from fedfilter.planning.strategy_plan import (
    DEFAULT_ABORT_PROBABILITY,
    DEFAULT_PLAN_QUANTILE,
    PARTICIPATIONS,
    plan_strategy,
)
from fedfilter.privacy.filters import FILTER_KINDS
from fedfilter.protocol.request import PLACEMENTS

DEFAULT_MIN_Z = ClientPolicy.min_noise_multiplier  # a device's min-noise-multiplier unless its owner sets one


def count_parameters(model: Any) -> int:
    """The floating-point coordinates a device releases for ``model``.

    Integer buffers are never released (their update is zero, ``client/filter_mod.py``).

    Parameters
    ----------
    model : torch.nn.Module or sequence of array_like
        A torch module (its ``state_dict`` is counted), or the arrays themselves.

    Returns
    -------
    int
        The number of floating-point coordinates.

    Examples
    --------
    >>> count_parameters([np.zeros((3, 2)), np.zeros(4, dtype=np.int64)])  # the integer buffer is not released
    6
    """
    arrays = model.state_dict().values() if hasattr(model, "state_dict") else model
    total = 0
    for a in arrays:
        a = a.detach().cpu().numpy() if hasattr(a, "detach") else np.asarray(a)
        if np.issubdtype(a.dtype, np.floating):
            total += int(a.size)
    return total


def app_model_parameters(app_dir: Path, model: str | None) -> int:
    r"""Count the parameters of a Flower app's model, imported from the app directory.

    Parameters
    ----------
    app_dir : Path
        A Flower app directory (it has a ``pyproject.toml``).
    model : str or None
        The model as ``MODULE:CALLABLE``; None: the ServerApp package's ``task:Net``, as in Flower's
        templates.

    Returns
    -------
    int
        ``count_parameters`` of what the callable returns.

    Raises
    ------
    FileNotFoundError
        ``app_dir`` is not a Flower app.
    ValueError
        The model cannot be loaded.

    Examples
    --------
    >>> import tempfile
    >>> with tempfile.TemporaryDirectory() as d:
    ...     app = Path(d)
    ...     components = '[tool.flwr.app.components]\nserverapp = "tinyapp.server_app:app"\n'
    ...     _ = (app / "pyproject.toml").write_text(components)
    ...     (app / "tinyapp").mkdir()
    ...     _ = (app / "tinyapp" / "__init__.py").write_text("")
    ...     _ = (app / "tinyapp" / "task.py").write_text("import numpy\ndef Net():\n    return [numpy.zeros(7)]\n")
    ...     app_model_parameters(app, None)
    7
    """
    app_dir = Path(app_dir).resolve()
    pyproject = app_dir / "pyproject.toml"
    if not pyproject.is_file():
        raise FileNotFoundError(f"--app-dir {str(app_dir)!r} has no pyproject.toml (not a Flower app).")
    if model is None:
        components = tomllib.loads(pyproject.read_text())["tool"]["flwr"]["app"]["components"]
        package = components["serverapp"].split(":", 1)[0].rsplit(".", 1)[0]
        model = f"{package}.task:Net"
    module_name, _, attr = model.partition(":")
    if not module_name or not attr:
        raise ValueError(f"--model must be MODULE:CALLABLE (e.g. pytorchexample.task:Net). Found {model!r}.")
    sys.path.insert(0, str(app_dir))
    try:
        try:
            factory = getattr(importlib.import_module(module_name), attr)
        except (ImportError, AttributeError) as err:
            raise ValueError(
                f"--model {model!r} cannot be loaded from {str(app_dir)!r} ({err}); name the model with "
                "--model MODULE:CALLABLE, or give --params."
            ) from None
        return count_parameters(factory())
    finally:
        sys.path.remove(str(app_dir))


def _settings_line(s: dict[str, Any]) -> str:
    extra = f" --min-reports {s['min_reports']}" if s["placement"] == "distributed" else ""
    return (
        f"--devices {s['devices']} --params {s['dim']} --placement {s['placement']}{extra} "
        f"--noise-multiplier {s['noise_multiplier']:g} --clip {s['clip']:g} --epsilon {s['epsilon']:g} "
        f"--delta {s['delta']:g} --rounds {s['rounds']} --filter {s['filter']}"
    )


def _option(name: str, o: dict[str, Any]) -> list[str]:
    if not o:
        return []
    placement = o["placement"] + (f", min-reports {o['min_reports']}" if o["placement"] == "distributed" else "")
    return [
        f"  {name}: {o['devices']:,} devices per round ({placement}), noise multiplier {o['noise_multiplier']:g}, "
        f"clip {o['clip']:g}",
        f"    noise norm {o['mean_noise_norm']:.4g} ({o['noise_to_clip']:.2g} x clip); "
        f"{o['rounds']} rounds need epsilon {o['epsilon_needed']:.4g} (delta {o['delta']:g}, {o['filter']} filter); "
        f"a device with epsilon {o['epsilon']:g} affords {o['rounds_afforded']} full-clip rounds",
    ] + (
        [
            f"    devices refuse a noise multiplier below their min-noise-multiplier ({DEFAULT_MIN_Z:g} unless "
            "their owners lower it)"
        ]
        if o["noise_multiplier"] < DEFAULT_MIN_Z
        else []
    )


def _epsilons(text: str) -> list[float]:
    """``--epsilon``: one budget, or the tiers' budgets comma-separated (the smallest is planned for)."""
    try:
        return [float(x) for x in text.split(",")]
    except ValueError:
        msg = f"--epsilon must be a number or numbers separated by commas. Found {text!r}."
        raise argparse.ArgumentTypeError(msg) from None


def _strategy_plan(args: argparse.Namespace, dim: int) -> dict[str, Any]:
    fixed = args.fixed_clip or args.sampling  # devices that sample themselves keep a fixed clip
    if fixed and args.clip is None:
        flag = "--fixed-clip" if args.fixed_clip else "--sampling"
        raise ValueError(f"--clip must be given with {flag}: a fixed clip has no default. Found none.")
    return plan_strategy(
        devices=args.devices,
        rounds=args.rounds,
        dim=dim,
        epsilons=args.epsilon,
        delta=args.delta,
        population=args.population,
        placement=args.placement,
        filter=args.filter,
        participation=args.participation,
        plan_quantile=args.plan_quantile,
        dropout_rate=args.dropout_rate,
        abort_probability=args.abort_probability,
        clip=args.clip,
        noise_multiplier=args.noise_multiplier,
        adaptive=not fixed,
        target_clipped_quantile=args.target_clipped_quantile,
        clip_norm_lr=args.clip_norm_lr,
        clipped_count_stddev=args.clipped_count_stddev,
        seed=args.seed,
        min_reports=args.min_reports,
        sampling=args.sampling,
        progress=_search_progress() if args.sampling else None,
    )


def _search_progress() -> Callable[[int, int], None] | None:
    """A bar on stderr for the sampling plan's search (tens of seconds): tqdm's, shown on a terminal
    only (never in --json's stdout); None without tqdm (the ``app`` extra)."""
    try:
        from tqdm import tqdm
    except ImportError:
        return None
    bar = None

    def progress(done: int, total: int) -> None:
        nonlocal bar
        if bar is None:
            bar = tqdm(total=total, desc="fedfilter plan: each budget's rate at each z", disable=None, leave=False)
        bar.update(done - bar.n)
        if done >= total:
            bar.close()

    return progress


def _plan(args: argparse.Namespace) -> int:
    if (args.params is None) == (args.app_dir is None):
        raise ValueError("give the model's size with exactly one of --params D or --app-dir DIR.")
    dim = args.params if args.params is not None else app_model_parameters(args.app_dir, args.model)
    strategy = _strategy_plan(args, dim)
    p = plan_federation(
        devices=args.devices,
        dim=dim,
        noise_multiplier=strategy["noise_multiplier"],
        clip=strategy["clip"],
        epsilon=min(args.epsilon),
        delta=args.delta,
        rounds=strategy["participation"]["asks_planned"],  # a device pays for the rounds it is asked
        placement=args.placement,
        min_reports=strategy["min_reports"],
        filter=strategy["filter"],  # the plan's (rdp when devices sample themselves)
        sampling=strategy["sampling"],
    )
    if p["placement"] == "distributed":
        p["worst_case"] = worst_case_plan(
            rounds=p["rounds"],
            main_rounds=p["rounds_afforded"],
            worst_case_epsilon=args.worst_case_epsilon,
            epsilon=p["epsilon"],
            delta=p["delta"],
            noise_multiplier=p["noise_multiplier"],
            clip=p["clip"],
            min_reports=p["min_reports"],
            dim=p["dim"],
            kind=p["filter"],
        )
    p["strategy"] = strategy
    if args.json:
        print(json.dumps(p))
        return 0
    where = f"placement {p['placement']}" + (
        f", min-reports {p['min_reports']}" if p["placement"] == "distributed" else ""
    )
    part, sa = strategy["participation"], strategy["sampling"]
    wanted = f"{part['rounds']} rounds wanted" + (
        f", each device asked at most {part['asks_planned']} times ({part['mode']}; the rounds below count its asks)"
        if part["asks_planned"] != part["rounds"]
        else ""
    )
    asked = (
        f"{p['devices']:,} devices asked per round, {p['expected_contributions']:.4g} of them contributing on average "
        f"(devices that sample themselves, mean rate {p['expected_rate']:.4g})"
        if sa is not None
        else f"{p['devices']:,} devices per round"
    )
    lines = [
        f"Federation: {asked}, {p['dim']:,} parameters, {where}, noise multiplier "
        f"{p['noise_multiplier']:g}, clip {p['clip']:g}; a typical device's budget epsilon {p['epsilon']:g}, "
        f"delta {p['delta']:g} ({p['filter']} filter); {wanted}",
        "",
        f"noise in the released mean   norm {p['mean_noise_norm']:.4g}  (std {p['mean_noise_std']:.4g} per coordinate"
        + ("; every asked device's noise, over the contributions expected)" if sa is not None else ")"),
        f"signal's bound (the clip)    {p['clip']:g}   -> noise / clip = {p['noise_to_clip']:.3g}",
    ]
    if sa is None:
        lines.append(
            f"rounds a device affords      {p['rounds_afforded']} full-clip rounds (the {p['rounds']} wanted need "
            f"epsilon {p['epsilon_needed']:.4g})"
        )
    else:
        each = "; ".join(
            f"epsilon {e:g}: rate {q:.3g}, {q * sa['planned_asks']:.3g} contributions expected"
            for e, q in zip(sa["budgets"], sa["rates"])
        )
        lines.append(f"each budget's rate           over the {sa['planned_asks']} planned asks: {each}")
    if "worst_case" in p:
        lines += ["", table(worst_case_rows(p["worst_case"], p["rounds"], p["min_reports"]))]
        if sa is not None:  # the account's order comes from its own budget, and sampling only lowers a charge
            lines.append(
                "            (counted for devices that contribute at every ask; at their rates they pay at most "
                "this: the worst-case account holds the order its own budget picks, where a subsampled release "
                "costs at most the full one)"
            )
    lines += [
        "",
        f"Verdict: {p['verdict']}.",
    ]
    if p["changes"]:
        lines += ["", "What to change:"] + [f"  - {c}" for c in p["changes"]]
    every_ask = "; devices that contribute at every ask" if sa is not None else ""
    lines += [
        "",
        f"Settings that learn (noise norm at most {TARGET_NOISE_TO_CLIP:g} x clip, checked by this planner"
        f"{every_ask}):",
    ]
    if p["recommended"]:
        lines += _option("recommended", p["recommended"]) + [f"    ({p['recommended_why']})"]
        lines += [f"    fedfilter plan {_settings_line(p['recommended'])}"]
    else:
        lines += [f"  none: {p['recommended_why']}"]
    lines += _option("at these devices", p["at_these_devices"])
    if "distributed" in p:
        lines += _option("distributed placement", p["distributed"])
    lines += ["", *strategy_lines(strategy)]
    print("\n".join(lines))
    return 0


def add_strategy_options(p: argparse.ArgumentParser) -> None:
    """The options of the plan the strategy takes (participation, drop-outs, adaptive clipping).

    Parameters
    ----------
    p : argparse.ArgumentParser
        The ``plan`` parser.

    Examples
    --------
    >>> parser = argparse.ArgumentParser()
    >>> add_strategy_options(parser)
    >>> args = parser.parse_args(["--population", "1000", "--dropout-rate", "0.1"])
    >>> args.population, args.dropout_rate, args.abort_probability, args.fixed_clip
    (1000, 0.1, 0.01, False)
    """
    g = p.add_argument_group("the plan the strategy takes (IndividualFilterStrategy.from_plan)")
    g.add_argument("--population", type=int, default=None, help="devices in the federation (public)")
    g.add_argument(
        "--participation",
        choices=PARTICIPATIONS,
        default=None,
        help="how devices are asked: balanced passes (default with --population), uniform sampling, or every round",
    )
    g.add_argument(
        "--plan-quantile",
        type=float,
        default=None,
        help=f"uniform: pay for this quantile of a device's asks (default {DEFAULT_PLAN_QUANTILE})",
    )
    g.add_argument("--dropout-rate", type=float, default=0.0, help="the chance a device asked does not reply")
    g.add_argument(
        "--abort-probability",
        type=float,
        default=DEFAULT_ABORT_PROBABILITY,
        help="distributed: the chance a round may abort for too few replies (chooses min-reports)",
    )
    g.add_argument("--fixed-clip", action="store_true", help="no adaptive clipping: --clip stays")
    g.add_argument("--target-clipped-quantile", type=float, default=0.5, help="adaptive: the unclipped fraction wanted")
    g.add_argument("--clip-norm-lr", type=float, default=0.2, help="adaptive: the clip's geometric step")
    g.add_argument(
        "--clipped-count-stddev",
        type=float,
        default=None,
        help="adaptive: the noise std on the sum of the bits (default devices / 20)",
    )
    g.add_argument("--seed", type=int, default=0, help="balanced: the public seed of the passes' shuffles")
    g.add_argument(
        "--sampling",
        action="store_true",
        help="devices sample themselves (rdp filter, a fixed clip: implies --fixed-clip): the z with the most "
        "expected signal over noise that spends every budget, each budget's rate and the rdp order its owner enrols at",
    )


def _participation_line(part: dict[str, Any]) -> str:
    k, r, a = part["devices_per_round"], part["rounds"], part["asks_planned"]
    if part["mode"] == "balanced":
        return (
            f"balanced passes over a population of {part['population']:,} (public seed {part['seed']}), {k:,} per "
            f"round: each device asked at most {a} times in {r} rounds"
        )
    if part["mode"] == "uniform":
        return (
            f"uniform sampling of {k:,} of {part['population']:,} per round: each device's plan pays for {a} asks "
            f"(the {part['plan_quantile']:g} quantile of Binomial({r}, {k / part['population']:.4g})); a given device "
            f"is asked more often with probability {part['p_asked_more']:.4g}"
        )
    return f"every round (population unknown): each device's plan pays for all {r} rounds"


def strategy_lines(st: dict[str, Any]) -> list[str]:
    """The plan's fields as lines, by their JSON names (``--json`` prints the same under ``"strategy"``).

    Parameters
    ----------
    st : dict
        ``plan_strategy``'s document.

    Examples
    --------
    >>> from fedfilter.planning.strategy_plan import plan_strategy
    >>> plan = plan_strategy(devices=100, population=1000, rounds=50, dim=1000, epsilons=[4.0], delta=1e-5)
    >>> for line in strategy_lines(plan)[:3]:
    ...     print(line)  # doctest: +ELLIPSIS
    Plan for IndividualFilterStrategy.from_plan (the fields --json prints under "strategy"):
      noise_multiplier   2.42 (accounted: the adaptive clip's bit included; the update's z 2.49414)
      clip               0.1 (initial)
    """
    b, part, drop, ad = st["budget"], st["participation"], st["dropout"], st["adaptive_clipping"]
    eps = min(b["epsilons"])
    pays = "yes" if b["pays_for_planned_asks"] else "NO: raise z, or plan fewer asks"
    afforded = ", ".join(f"epsilon {e:g}: {n}" for e, n in zip(b["epsilons"], b["asks_afforded"]))
    what = "accounted: the adaptive clip's bit included; " if ad else "accounted; "
    lines = [
        'Plan for IndividualFilterStrategy.from_plan (the fields --json prints under "strategy"):',
        f"  noise_multiplier   {st['noise_multiplier']:g} ({what}the update's z {st['update_noise_multiplier']:.6g})",
        f"  clip               {st['clip']:g} ({'initial' if ad else 'fixed'})",
    ]
    if ad:
        lines += [
            f"  adaptive_clipping  target_clipped_quantile {ad['target_clipped_quantile']:g}, clip_norm_lr "
            f"{ad['clip_norm_lr']:g}, clipped_count_stddev {ad['clipped_count_stddev']:.4g} (Andrew et al. 2021; the "
            f"unclipped fraction's noise std {ad['fraction_noise_std']:.3g}); noise-free, the clip moves tenfold in "
            f"{ad['rounds_per_decade']} rounds at the least: start nearer the update norms with --clip",
        ]
    lines += [
        f"  placement          {st['placement']}, filter {st['filter']}, dim {st['dim']:,}",
        f"  min_reports        {st['min_reports']}: a round aborts (fewer than min_reports of the "
        f"{part['devices_per_round']:,} asked reply) with probability {drop['abort_probability']:.4g} (target "
        f"{drop['abort_probability_target']:g}), assuming each drops out independently with probability "
        f"{drop['dropout_rate']:g}",
        f"  participation      {_participation_line(part)}",
        f"  budget             full-clip asks a device affords at this z{', unsampled' if st.get('sampling') else ''}: "
        f"{afforded} (delta {b['delta']:g}, "
        f"{st['filter']} filter); pays for the {part['asks_planned']} planned asks at epsilon {eps:g}: {pays}. "
        "Assumes each device enrolled that budget in that filter and accepts these settings; its filter stops it "
        "at its budget whatever the plan",
        f"  mean_noise_to_clip {st['mean_noise_to_clip']:.3g} (the expected noise norm of the mean of "
        f"{drop['expected_reports']:.4g} expected reports"
        + (
            f", their sum divided by the {drop['expected_reports'] * st['sampling']['expected_rate']:.4g} "
            "contributions expected"
            if st.get("sampling")
            else ""
        )
        + ", over the clip)",
    ]
    if (sa := st.get("sampling")) is not None:
        tiers = "; ".join(
            f"epsilon {e:g}: rate {q:.3g}, rdp-order {a:g}" for e, q, a in zip(sa["budgets"], sa["rates"], sa["orders"])
        )
        lines.append(
            f"  sampling           planned_asks {sa['planned_asks']}, expected_rate {sa['expected_rate']:.4g} "
            f"(each device puts its update in a reply with its own rate; {tiers}; owners enrol at that rdp-order)"
        )
    lines += [f"  note: {n}" for n in st["notes"]]
    if st["update_noise_multiplier"] < DEFAULT_MIN_Z:
        lines.append(
            f"  note: devices refuse an update noise multiplier below their min-noise-multiplier ({DEFAULT_MIN_Z:g} "
            "unless their owners lower it)"
        )
    return lines


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``plan`` (will a federation learn) to the ``fedfilter`` command.

    Parameters
    ----------
    sub : argparse._SubParsersAction
        The ``fedfilter`` parser's sub-commands.

    Examples
    --------
    >>> parser = argparse.ArgumentParser(prog="fedfilter")
    >>> register(parser.add_subparsers(dest="command"))
    >>> args = parser.parse_args(["plan", "--devices", "100", "--params", "1000", "--noise-multiplier", "1",
    ...                           "--clip", "1", "--epsilon", "8", "--delta", "1e-5", "--rounds", "10"])
    >>> args.func(args)  # doctest: +ELLIPSIS
    Federation: 100 devices per round, 1,000 parameters, placement local, noise multiplier 1, clip 1; ...
    <BLANKLINE>
    noise in the released mean   norm 3.161  (std 0.1 per coordinate)
    ...
    0
    """
    p = sub.add_parser(
        "plan",
        help="will a federation learn: the noise in the released mean against the clip, and the rounds devices afford",
        description=(
            "Plan a federation: the expected norm of the noise in each round's released mean against the "
            "clip (the most the devices' signal can be), the full-clip rounds a typical device affords, a "
            "verdict with what to change, and settings that learn."
        ),
    )
    p.add_argument("--devices", type=int, required=True, help="devices that report in each round")
    size = p.add_argument_group("the model's size (one of)")
    size.add_argument("--params", type=int, default=None, help="floating-point parameters the devices release")
    size.add_argument("--app-dir", type=Path, default=None, help="a Flower app directory: count its model's parameters")
    size.add_argument(
        "--model",
        default=None,
        help="with --app-dir: the model as MODULE:CALLABLE (default: the ServerApp package's task:Net)",
    )
    p.add_argument(
        "--placement",
        choices=PLACEMENTS,
        default="local",
        help="local: each device adds all the noise; distributed: the noise is split among min-reports (SecAgg+)",
    )
    p.add_argument(
        "--min-reports",
        type=int,
        default=None,
        help="distributed: reports a sum needs (default: the most whose round aborts at most --abort-probability)",
    )
    p.add_argument(
        "--noise-multiplier",
        type=float,
        default=None,
        help="z, accounted: the noise std is z * C (default: the least the smallest budget pays for the planned asks)",
    )
    p.add_argument(
        "--clip",
        type=float,
        default=None,
        help="C: the (initial) clip norm of each device's update (default 0.1 when adaptive; required with "
        "--fixed-clip or --sampling)",
    )
    p.add_argument(
        "--epsilon",
        type=_epsilons,
        required=True,
        help="the devices' budget epsilon, or the tiers' comma-separated (the smallest is planned for)",
    )
    p.add_argument("--delta", type=float, required=True, help="a typical device's budget delta")
    p.add_argument("--rounds", type=int, required=True, help="the rounds you want to run")
    p.add_argument(
        "--filter",
        choices=list(FILTER_KINDS),
        default=None,
        help="the devices' filter (default gdp; rdp if distributed)",
    )
    p.add_argument(
        "--worst-case-epsilon",
        type=float,
        default=None,
        help="placement distributed: a typical device's worst-case budget (each report read alone); show its rounds",
    )
    add_strategy_options(p)
    p.add_argument(
        "--json",
        action="store_true",
        help="print one JSON object (keys include mean_noise_norm, noise_dominates and strategy, the plan)",
    )
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    return _plan(args)
