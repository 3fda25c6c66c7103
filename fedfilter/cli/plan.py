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
from pathlib import Path
from typing import Any

import numpy as np

from fedfilter.cli.budget_options import table, worst_case_plan, worst_case_rows
from fedfilter.client.settings.policy import ClientPolicy
from fedfilter.planning.federation import TARGET_NOISE_TO_CLIP, plan_federation
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


def _plan(args: argparse.Namespace) -> int:
    if (args.params is None) == (args.app_dir is None):
        raise ValueError("give the model's size with exactly one of --params D or --app-dir DIR.")
    dim = args.params if args.params is not None else app_model_parameters(args.app_dir, args.model)
    p = plan_federation(
        devices=args.devices,
        dim=dim,
        noise_multiplier=args.noise_multiplier,
        clip=args.clip,
        epsilon=args.epsilon,
        delta=args.delta,
        rounds=args.rounds,
        placement=args.placement,
        min_reports=args.min_reports,
        filter=args.filter,
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
    if args.json:
        print(json.dumps(p))
        return 0
    where = f"placement {p['placement']}" + (
        f", min-reports {p['min_reports']}" if p["placement"] == "distributed" else ""
    )
    lines = [
        f"Federation: {p['devices']:,} devices per round, {p['dim']:,} parameters, {where}, noise multiplier "
        f"{p['noise_multiplier']:g}, clip {p['clip']:g}; a typical device's budget epsilon {p['epsilon']:g}, "
        f"delta {p['delta']:g} ({p['filter']} filter); {p['rounds']} rounds wanted",
        "",
        f"noise in the released mean   norm {p['mean_noise_norm']:.4g}  (std {p['mean_noise_std']:.4g} per coordinate)",
        f"signal's bound (the clip)    {p['clip']:g}   -> noise / clip = {p['noise_to_clip']:.3g}",
        f"rounds a device affords      {p['rounds_afforded']} full-clip rounds (the {p['rounds']} wanted need "
        f"epsilon {p['epsilon_needed']:.4g})",
    ]
    if "worst_case" in p:
        lines += ["", table(worst_case_rows(p["worst_case"], p["rounds"], p["min_reports"]))]
    lines += [
        "",
        f"Verdict: {p['verdict']}.",
    ]
    if p["changes"]:
        lines += ["", "What to change:"] + [f"  - {c}" for c in p["changes"]]
    lines += ["", f"Settings that learn (noise norm at most {TARGET_NOISE_TO_CLIP:g} x clip, checked by this planner):"]
    if p["recommended"]:
        lines += _option("recommended", p["recommended"]) + [f"    ({p['recommended_why']})"]
        lines += [f"    fedfilter plan {_settings_line(p['recommended'])}"]
    else:
        lines += [f"  none: {p['recommended_why']}"]
    lines += _option("at these devices", p["at_these_devices"])
    if "distributed" in p:
        lines += _option("distributed placement", p["distributed"])
    print("\n".join(lines))
    return 0


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
    p.add_argument("--min-reports", type=int, default=None, help="distributed: reports a sum needs (default --devices)")
    p.add_argument("--noise-multiplier", type=float, required=True, help="z: the noise std is z * C")
    p.add_argument("--clip", type=float, required=True, help="C: the clip norm of each device's update")
    p.add_argument("--epsilon", type=float, required=True, help="a typical device's budget epsilon")
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
    p.add_argument(
        "--json", action="store_true", help="print one JSON object (keys include mean_noise_norm, noise_dominates)"
    )
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    if args.min_reports is None:
        args.min_reports = args.devices if args.placement == "distributed" else 1
    return _plan(args)
