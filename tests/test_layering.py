"""The layering and the one-place rules, checked on the source (issue 25).

* Apps apart from studies: the device and coordinator code never imports ``fedfilter.simulations``;
  the built-in app reaches the research tasks only through ``fedfilter/app/task.py``.
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


def _sources():
    for folder in CODE:
        for path in sorted(folder.rglob("*.py")):
            if "_pb2" not in path.name and "build" not in path.parts:
                rel = path.relative_to(ROOT if path.is_relative_to(ROOT) else REPO).as_posix()
                yield rel, ast.parse(path.read_text(encoding="utf-8"))


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
    # _sources names fedfilter's files from fedfilter/ and the benchmarks' from the repository root.
    paths = {rel: ROOT / rel if (ROOT / rel).is_file() else REPO / rel for rel, _ in _sources()}
    texts = {rel: path.read_text(encoding="utf-8") for rel, path in paths.items()}
    assert [rel for rel, t in texts.items() if 'f"flwr-{' in t] == ["protocol/rules.py"]
    assert [rel for rel, t in texts.items() if "must exceed the round timeout {" in t] == ["protocol/rules.py"]
    assert [rel for rel, t in texts.items() if "must be a finite number > 0. Found" in t] == ["checks.py"]
    assert not [rel for rel, t in texts.items() if "type(default)(" in t]
