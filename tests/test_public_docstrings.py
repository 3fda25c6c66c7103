"""Every public name of fedfilter (no leading underscore: functions, classes, their public methods) has
a numpydoc docstring with an ``Examples`` section and, where it takes parameters, a ``Parameters``
section (a class documents its constructor's, or a dataclass's fields, under ``Parameters`` or
``Attributes``). The API reference is generated from these docstrings, and the doctests run with the
suite, so this keeps the reference whole."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "fedfilter"


def _parameters(node: ast.AST) -> list[str]:
    if isinstance(node, ast.ClassDef):
        init = next((b for b in node.body if isinstance(b, ast.FunctionDef) and b.name == "__init__"), None)
        if init is None:  # a dataclass: its annotated fields
            return [b.target.id for b in node.body if isinstance(b, ast.AnnAssign) and isinstance(b.target, ast.Name)]
        node = init
    assert isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
    args = node.args
    return [a.arg for a in args.posonlyargs + args.args + args.kwonlyargs if a.arg not in ("self", "cls")]


def undocumented(source: str) -> list[str]:
    """The public names in ``source`` whose docstring lacks Examples, or Parameters where needed."""
    missing = []

    def visit(nodes: list[ast.stmt], prefix: str = "") -> None:
        for node in nodes:
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                continue
            if node.name.startswith("_"):
                continue
            doc = ast.get_docstring(node) or ""
            has_examples = "Examples" in doc and ">>>" in doc
            has_parameters = not _parameters(node) or "Parameters" in doc or "Attributes" in doc
            if not (has_examples and has_parameters):
                missing.append(prefix + node.name)
            if isinstance(node, ast.ClassDef):
                visit(node.body, node.name + ".")

    visit(ast.parse(source).body)
    return missing


def test_every_public_name_has_parameters_and_an_example():
    found = {}
    count = 0
    for path in sorted(PACKAGE.rglob("*.py")):
        if "_pb2" in path.name or path.name == "__main__.py":
            continue
        source = path.read_text(encoding="utf-8")
        count += source.count("\ndef ") + source.count("\nclass ")
        names = undocumented(source)
        if names:
            found[str(path.relative_to(PACKAGE))] = names
    assert count > 300  # the scan saw the package
    assert found == {}


def test_the_check_sees_a_missing_section():
    example = '"""Examples\n    --------\n    >>> 1\n    1\n    """\n'
    assert undocumented('def f(x):\n    """No sections."""\n') == ["f"]
    assert undocumented("def f():\n    " + example) == []
    assert undocumented("def f(x):\n    " + example) == ["f"]
    assert undocumented("class C:\n    " + example + "    def m(self, y): ...\n") == ["C.m"]
    assert undocumented("def _private(x): ...\n") == []
