"""The layering and the one-place rules, checked on the source.

* Apps apart from studies: the device and coordinator code never imports ``fedfilter.simulations``;
  the built-in app reaches the research tasks only through ``fedfilter/app/task.py``.
* Flower's internals (everything outside its documented app API) are imported in one module,
  ``protocol/flower_api.py``, so a Flower upgrade is one file.
* What both sides share lives in ``protocol/`` and ``privacy/``: the coordinator (and those two) never
  import the device package ``fedfilter.client``.
* Each constant and rule is defined once, and the spend order is written once
  (``client/mechanisms/spend.py``). pyproject's ``[tool.importlinter]`` contracts (``make layers``) keep
  the whole graph layered and free of cycles; these checks run under pytest alone.
"""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ROOT = REPO / "fedfilter"  # the packages; paths below are relative to it
STUDIES = "fedfilter.simulations"


def _imports(path: Path) -> list[str]:
    names = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.append(node.module)
    return names


def _offenders(folder: Path, package: str = STUDIES) -> list[str]:
    """``file: module`` for every import of ``package`` under ``folder`` (also inside functions)."""
    return [
        f"{path.relative_to(folder).as_posix()}: {name}"
        for path in sorted(folder.rglob("*.py"))
        for name in _imports(path)
        if name == package or name.startswith(package + ".")
    ]


def test_client_and_coordinator_never_import_the_studies():
    for folder in ("client", "coordinator"):
        assert (ROOT / folder).is_dir()
        assert _offenders(ROOT / folder) == [], folder


def test_the_app_reaches_the_studies_only_through_task_py():
    offenders = _offenders(ROOT / "app")
    assert offenders and all(line.startswith("task.py: ") for line in offenders), offenders


def test_the_scan_sees_both_import_forms(tmp_path):
    (tmp_path / "a.py").write_text("import fedfilter.simulations.tasks\n")
    (tmp_path / "b.py").write_text("def f():\n    from fedfilter.simulations.tasks import registry\n")
    (tmp_path / "c.py").write_text("from fedfilter.simulations_extra import x\n")
    assert _offenders(tmp_path) == ["a.py: fedfilter.simulations.tasks", "b.py: fedfilter.simulations.tasks"]


# --- shared code apart from the device --------------------------------------------------------------


def test_the_coordinator_and_the_shared_code_never_import_the_device():
    for folder in ("coordinator", "protocol", "privacy"):
        assert (ROOT / folder).is_dir()
        assert _offenders(ROOT / folder, "fedfilter.client") == [], folder


# --- each constant and rule once ---------------------------------------------------------------------

CODE = (ROOT, REPO / "benchmarks")
# name -> the one file that defines it (a module-level assignment)
DEFINED_ONCE = {
    "PLACEMENTS": "protocol/request.py",
    "AFTER_EXHAUSTION": "protocol/request.py",
    "MAX_RUN_ID_CHARS": "protocol/request.py",
    "INT64_MAX": "protocol/request.py",
    "REQUEST_FIELDS": "protocol/wire.py",
    "REPLY_DTYPE": "protocol/wire.py",
    "CONSISTENCY_RECORD": "protocol/wire.py",
    "SECAGG_GRID_BITS": "protocol/secagg/grid.py",
    "DEFAULT_DROPOUT_RATE": "protocol/secagg/grid.py",
    "NOISE_GRID_BITS": "client/mechanisms/gaussian.py",
    "MAX_MU_SHARE": "client/mechanisms/skellam_noise.py",
    "CLIP_SLACK": "client/mechanisms/skellam.py",
    "TRAIN_KEYS": "app/config.py",
}
# names that once had a second, differently named copy: none may come back
RETIRED = ("GRID_BITS", "_MU_MAX", "_CLIP_SLACK", "_TRAIN_KEYS", "_REQUEST_TYPES")


def _files():
    """(path relative to fedfilter/, or to the repository outside it; its text) for every source file."""
    for folder in CODE:
        for path in sorted(folder.rglob("*.py")):
            if "_pb2" not in path.name and "build" not in path.parts:
                rel = path.relative_to(ROOT if path.is_relative_to(ROOT) else REPO).as_posix()
                yield rel, path.read_text(encoding="utf-8")


def _sources():
    for rel, text in _files():
        yield rel, ast.parse(text)


def _source_path(rel: str) -> Path:
    return REPO / rel if rel.startswith("benchmarks/") else ROOT / rel


def _assigned(tree: ast.Module) -> set[str]:
    names = set()
    for node in tree.body:
        targets = (
            node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
        )
        names |= {t.id for t in targets if isinstance(t, ast.Name)}
    return names


def test_each_constant_is_defined_in_one_place():
    where: dict[str, list[str]] = {}
    for rel, tree in _sources():
        for name in _assigned(tree) & (set(DEFINED_ONCE) | set(RETIRED)):
            where.setdefault(name, []).append(rel)
    assert {name: where.get(name) for name in DEFINED_ONCE} == {name: [f] for name, f in DEFINED_ONCE.items()}
    assert not {name: where[name] for name in RETIRED if name in where}


def _string_tuples(tree: ast.Module) -> list[frozenset[str]]:
    return [
        frozenset(e.value for e in node.elts)
        for node in ast.walk(tree)
        if isinstance(node, (ast.Tuple, ast.List))
        and node.elts
        and all(isinstance(e, ast.Constant) and isinstance(e.value, str) for e in node.elts)
    ]


def test_the_placements_and_modes_are_spelled_out_once():
    """Everything else names PLACEMENTS / AFTER_EXHAUSTION (a CLI choice, a config check, a loop)."""
    spelled = {frozenset({"local", "distributed"}): [], frozenset({"noise-only", "leave"}): []}
    for rel, tree in _sources():
        for values in _string_tuples(tree):
            if values in spelled:
                spelled[values].append(rel)
    assert spelled == {values: ["protocol/request.py"] for values in spelled}


def _calls(tree: ast.Module, name: str) -> int:
    return sum(
        isinstance(node, ast.Call)
        and (getattr(node.func, "attr", None) == name or getattr(node.func, "id", None) == name)
        for node in ast.walk(tree)
    )


def test_the_spend_order_is_written_once():
    """allowance -> clip/snap -> charge -> commit: only ``spend()`` strings the steps together; every
    release (the device's two placements, the engine's Gaussian and Skellam rounds) calls it."""
    steps = ("clip_and_snap", "charges", "commit")
    writers = {rel for rel, tree in _sources() if all(_calls(tree, step) for step in steps)}
    assert writers == {"client/mechanisms/spend.py"}
    callers = {rel for rel, tree in _sources() if _calls(tree, "spend") and rel != "client/mechanisms/spend.py"}
    assert {"client/release.py", "simulations/engine/core.py", "simulations/engine/distributed_round.py"} <= callers


def test_the_round_rules_are_written_once():
    texts = dict(_files())
    assert [rel for rel, t in texts.items() if 'f"flwr-{' in t] == ["protocol/rules.py"]
    assert [rel for rel, t in texts.items() if "must exceed the round timeout {" in t] == ["protocol/rules.py"]
    assert [rel for rel, t in texts.items() if "must be a finite number > 0. Found" in t] == ["checks.py"]
    assert not [rel for rel, t in texts.items() if "type(default)(" in t]


# --- Flower's internals in one module -----------------------------------------------------------------

FLOWER_API = "protocol/flower_api.py"
# Flower's documented app API: imported directly wherever it is used.
FLOWER_DOCUMENTED = {"flwr.app", "flwr.clientapp", "flwr.serverapp", "flwr.serverapp.strategy"}


def _flower_internal_imports(folder: Path) -> list[str]:
    """``file: module`` for every import of a Flower module outside its documented app API."""
    return [
        f"{path.relative_to(folder).as_posix()}: {name}"
        for path in sorted(folder.rglob("*.py"))
        if path.relative_to(folder).as_posix() != FLOWER_API
        for name in _imports(path)
        if (name == "flwr" or name.startswith("flwr.")) and name not in FLOWER_DOCUMENTED
    ]


def test_only_flower_api_imports_flowers_internals():
    assert _flower_internal_imports(ROOT) == []


def test_the_flower_scan_sees_internal_imports(tmp_path):
    (tmp_path / "a.py").write_text("from flwr.app import Message\nfrom flwr.serverapp.strategy import FedAvg\n")
    (tmp_path / "b.py").write_text("def f():\n    from flwr.common.constant import ErrorCode\n")
    (tmp_path / "c.py").write_text("import flwr.server.workflow\nfrom flwr.app.message_type import MessageType\n")
    assert _flower_internal_imports(tmp_path) == [
        "b.py: flwr.common.constant",
        "c.py: flwr.server.workflow",
        "c.py: flwr.app.message_type",
    ]


def _type_checking_imports(tree: ast.Module) -> dict[str, tuple[str, str]]:
    block = next(n for n in tree.body if isinstance(n, ast.If) and ast.unparse(n.test) == "TYPE_CHECKING")
    return {
        alias.asname or alias.name: (node.module, alias.name)
        for node in block.body
        if isinstance(node, ast.ImportFrom) and node.module
        for alias in node.names
    }


def test_flower_api_types_each_name_from_its_first_location():
    from fedfilter.protocol.flower_api import LOCATIONS

    typed = _type_checking_imports(ast.parse((ROOT / FLOWER_API).read_text(encoding="utf-8")))
    assert typed == {name: places[0] for name, places in LOCATIONS.items()}


def test_every_flower_name_resolves_under_the_installed_flower():
    from fedfilter.protocol import flower_api

    missing = []
    for name in flower_api.LOCATIONS:
        try:
            flower_api.resolve(name)
        except ImportError as error:
            missing.append(f"{name}: {error}")
    assert missing == []


def test_a_moved_flower_name_is_found_at_its_next_location_or_named_in_the_error(monkeypatch):
    from importlib.metadata import version

    import pytest

    from fedfilter.protocol import flower_api

    moved = (("flwr.nowhere", "ErrorCode"), *flower_api.LOCATIONS["ErrorCode"])
    monkeypatch.setitem(flower_api.LOCATIONS, "ErrorCodeMoved", moved)
    assert flower_api.resolve("ErrorCodeMoved") is flower_api.resolve("ErrorCode")
    monkeypatch.setitem(flower_api.LOCATIONS, "Gone", (("flwr.nowhere", "Gone"), ("flwr.common.constant", "Gone")))
    with pytest.raises(ImportError, match=f"Flower {version('flwr')} has no 'Gone'"):
        from fedfilter.protocol.flower_api import Gone  # noqa: F401


def test_a_flower_name_is_read_from_flowers_module_at_each_import(monkeypatch):
    """As a direct ``from flwr... import`` inside a function would: a replaced Flower function is seen."""
    from flwr.supernode.runtime import run_clientapp

    from fedfilter.protocol import flower_api

    assert flower_api.resolve("push_message") is run_clientapp.push_message

    def replaced(*args):
        return None

    monkeypatch.setattr(run_clientapp, "push_message", replaced)
    from fedfilter.protocol.flower_api import push_message

    assert push_message is replaced


def test_importing_flower_api_loads_no_flower():
    import subprocess
    import sys

    code = (
        "import sys; from fedfilter.protocol import flower_api; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'flwr'))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, check=True)
    assert done.stdout.strip() == "[]"


# --- the noise std in one home ------------------------------------------------------------------------


def _name(node: ast.AST) -> str | None:
    return node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else None


def _noise_std_products(tree: ast.AST) -> int:
    """Products ``noise_multiplier * clip`` (also ``z * c``, any spelling through an attribute)."""
    z_names, c_names = {"noise_multiplier", "z"}, {"clip", "c"}
    return sum(
        isinstance(node, ast.BinOp)
        and isinstance(node.op, ast.Mult)
        and {_name(node.left), _name(node.right)} in ({z, c} for z in z_names for c in c_names)
        for node in ast.walk(tree)
    )


def test_the_noise_std_is_computed_in_one_place():
    """``protocol/rules.py`` (``accounted_noise_std``) multiplies z by C; everything else calls it."""
    computing = {rel for rel, tree in _sources() if _noise_std_products(tree) and not rel.startswith("benchmarks/")}
    assert computing - {"audit/game.py"} == {"protocol/rules.py"}  # audit/game.py: still to move


def test_the_noise_std_scan_sees_the_product():
    assert _noise_std_products(ast.parse("std = spec.noise_multiplier * spec.clip\ns = z * c")) == 2
    assert _noise_std_products(ast.parse("x = clip * 2\ny = z * z")) == 0
