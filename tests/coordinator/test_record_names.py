"""Every record or key name the coordinator sends or reads is defined once, in ``protocol/wire.py``:
no coordinator module assigns a module-level string constant that spells one of wire's names."""

from __future__ import annotations

import ast
from pathlib import Path

from fedfilter.protocol import wire

COORDINATOR = Path(wire.__file__).resolve().parents[1] / "coordinator"


def _string_constants(path: Path) -> dict[str, str]:
    out = {}
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            out.update({t.id: node.value.value for t in node.targets if isinstance(t, ast.Name)})
    return out


def test_the_coordinator_reads_record_names_from_the_wire_module():
    names = {
        value for name, value in vars(wire).items() if name.isupper() and name.endswith(("_RECORD", "_ROUND", "_STAGE"))
    }
    assert {"config", "current_round", "parameters", "fedfilter.secagg", "fedfilter.request"} <= names
    spelled = {
        f"{path.relative_to(COORDINATOR)}:{name}": value
        for path in sorted(COORDINATOR.rglob("*.py"))
        for name, value in _string_constants(path).items()
        if value in names
    }
    assert spelled == {}
