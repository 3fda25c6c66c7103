"""Apps apart from studies: the device and coordinator code never imports ``fedfilter.simulations``.

The built-in app reaches the research tasks only through ``fedfilter/app/task.py``.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STUDIES = "fedfilter.simulations"


def _imports(path: Path) -> list[str]:
    names = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.append(node.module)
    return names


def _offenders(folder: Path) -> list[str]:
    """``file: module`` for every import of the studies under ``folder`` (also inside functions)."""
    return [
        f"{path.relative_to(folder).as_posix()}: {name}"
        for path in sorted(folder.rglob("*.py"))
        for name in _imports(path)
        if name == STUDIES or name.startswith(STUDIES + ".")
    ]


def test_client_and_coordinator_never_import_the_studies():
    for folder in ("client", "coordinator"):
        assert (ROOT / folder).is_dir()
        assert _offenders(ROOT / folder) == [], folder


def test_the_app_reaches_the_studies_only_through_task_py():
    offenders = _offenders(ROOT / "fedfilter" / "app")
    assert offenders and all(line.startswith("task.py: ") for line in offenders), offenders


def test_the_scan_sees_both_import_forms(tmp_path):
    (tmp_path / "a.py").write_text("import fedfilter.simulations.tasks\n")
    (tmp_path / "b.py").write_text("def f():\n    from fedfilter.simulations.tasks import registry\n")
    (tmp_path / "c.py").write_text("from fedfilter.simulations_extra import x\n")
    assert _offenders(tmp_path) == ["a.py: fedfilter.simulations.tasks", "b.py: fedfilter.simulations.tasks"]
