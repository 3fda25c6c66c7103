"""The AST mutation operators of ``benchmarks/mutation.py``: which small wrong changes a target file
gets (``find_mutants``), how one is written into the source (``apply_mutant``), and the survivors-file
line that names it (``survivor_key``).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass

_CMP_SWAPS = {
    ast.Lt: [ast.LtE],
    ast.LtE: [ast.Lt],
    ast.Gt: [ast.GtE],
    ast.GtE: [ast.Gt],
    ast.Eq: [ast.NotEq],
    ast.NotEq: [ast.Eq],
    ast.Is: [ast.IsNot],
    ast.IsNot: [ast.Is],
    ast.In: [ast.NotIn],
    ast.NotIn: [ast.In],
}
_BIN_SWAPS = {
    ast.Add: [ast.Sub],
    ast.Sub: [ast.Add],
    ast.Mult: [ast.Div],
    ast.Div: [ast.Mult],
    ast.Pow: [ast.Mult],
    ast.FloorDiv: [ast.Div],
    ast.Mod: [ast.Mult],
}
# Function names swapped for another (rounding direction, extremum, quantifier) or for plain numpy.
_NAME_SWAPS = {
    "up": ["down"],
    "down": ["up"],
    "add_up": ["np.add"],
    "sub_down": ["np.subtract"],
    "mul_up": ["np.multiply"],
    "div_up": ["np.divide"],
    "square_up": ["np.square"],
    "min": ["max"],
    "max": ["min"],
}
_ATTR_SWAPS = {"minimum": "maximum", "maximum": "minimum", "any": "all", "all": "any", "ceil": "floor", "floor": "ceil"}


@dataclass(frozen=True)
class Mutant:
    path: str
    index: int  # position of the node in ast.walk order (stable across deep copies)
    kind: str
    arg: object
    line: int
    description: str
    ordinal: int = 0  # position among the file's mutants: tells apart equal mutations on one line


def _skip_nodes(tree: ast.AST) -> set[int]:
    """Nodes never mutated: annotations, docstrings, f-strings, log calls and error messages."""
    skip: set[int] = set()

    def mark(node):
        for n in ast.walk(node):
            skip.add(id(n))

    for node in ast.walk(tree):
        for field in ("annotation", "returns"):
            if getattr(node, field, None) is not None:
                mark(getattr(node, field))
        if isinstance(node, ast.JoinedStr):
            mark(node)
        if isinstance(node, ast.Call):
            f = node.func
            name = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", "")
            if (
                name in {"debug", "info", "warning", "error", "exception", "append"}
                and isinstance(f, ast.Attribute)
                and getattr(f.value, "id", "") in {"log", "problems", "logging"}
            ):
                mark(node)
        if isinstance(node, ast.Raise) and node.exc is not None:
            mark(node.exc)  # the message; the raise itself can still be removed
    return skip


def _call_name(node: ast.Call) -> str:
    f = node.func
    if isinstance(f, ast.Name):
        return f.id
    if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name):
        return f"{f.value.id}.{f.attr}"
    return ""


def find_mutants(path: str, source: str) -> list[Mutant]:
    tree = ast.parse(source)
    skip = _skip_nodes(tree)
    lines = source.splitlines()
    out: list[Mutant] = []

    def add(i, node, kind, arg, desc):
        out.append(Mutant(path, i, kind, arg, getattr(node, "lineno", 0), desc))

    for i, node in enumerate(ast.walk(tree)):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Compare):
            for k, op in enumerate(node.ops):
                for new in _CMP_SWAPS.get(type(op), []):
                    add(i, node, "cmp", (k, new), f"{_op(op)} -> {_op(new())}")
        elif isinstance(node, ast.BinOp):
            for new in _BIN_SWAPS.get(type(node.op), []):
                add(i, node, "binop", new, f"{_op(node.op)} -> {_op(new())}")
        elif isinstance(node, ast.AugAssign):
            for new in _BIN_SWAPS.get(type(node.op), []):
                add(i, node, "binop", new, f"{_op(node.op)}= -> {_op(new())}=")
        elif isinstance(node, ast.BoolOp):
            new = ast.Or if isinstance(node.op, ast.And) else ast.And
            add(i, node, "boolop", new, f"{_op(node.op)} -> {_op(new())}")
        elif isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.Not)):
            add(i, node, "unwrap_unary", None, f"drop unary {_op(node.op)}")
        elif isinstance(node, ast.Constant) and not isinstance(node.value, str):
            v = node.value
            if isinstance(v, bool):
                add(i, node, "const", not v, f"{v} -> {not v}")
            elif isinstance(v, int):
                add(i, node, "const", v + 1, f"{v} -> {v + 1}")
                add(i, node, "const", v - 1, f"{v} -> {v - 1}")
            elif isinstance(v, float):
                add(i, node, "const", v * 1.1, f"{v!r} -> {v * 1.1!r} (x1.1)")
                add(i, node, "const", v + 1, f"{v!r} -> {v + 1!r} (+1)")
        elif isinstance(node, ast.Call):
            name = _call_name(node)
            for new in _NAME_SWAPS.get(name, []):
                add(i, node, "rename", new, f"{name}(...) -> {new}(...)")
            if isinstance(node.func, ast.Attribute) and node.func.attr in _ATTR_SWAPS:
                add(i, node, "attr", _ATTR_SWAPS[node.func.attr], f"{name} -> ...{_ATTR_SWAPS[node.func.attr]}")
            if name.endswith("nextafter") and len(node.args) == 2:
                add(i, node, "nextafter", None, "nextafter direction flipped")
            if len(node.args) == 1 and not node.keywords and name not in {"range", "len", "isinstance"}:
                add(i, node, "unwrap_call", None, f"{name or 'call'}(x) -> x")
        if isinstance(node, (ast.Raise, ast.Assert, ast.AugAssign)) or (
            isinstance(node, ast.Expr) and isinstance(node.value, ast.Call) and id(node.value) not in skip
        ):
            add(i, node, "remove_stmt", None, f"statement removed ({type(node).__name__.lower()})")
    # A description with the source line makes the survivor list readable on its own.
    return [
        Mutant(
            m.path,
            m.index,
            m.kind,
            m.arg,
            m.line,
            f"{m.description}   | {lines[m.line - 1].strip() if 0 < m.line <= len(lines) else ''}",
            k,
        )
        for k, m in enumerate(out)
    ]


def survivor_key(m: Mutant) -> str:
    """One survivors-file line; the node index tells apart equal mutations on the same line."""
    return f"{m.path}:{m.line}: [#{m.ordinal}] {m.description}"


def _op(op) -> str:
    return {
        ast.Lt: "<",
        ast.LtE: "<=",
        ast.Gt: ">",
        ast.GtE: ">=",
        ast.Eq: "==",
        ast.NotEq: "!=",
        ast.Is: "is",
        ast.IsNot: "is not",
        ast.In: "in",
        ast.NotIn: "not in",
        ast.Add: "+",
        ast.Sub: "-",
        ast.Mult: "*",
        ast.Div: "/",
        ast.Pow: "**",
        ast.FloorDiv: "//",
        ast.Mod: "%",
        ast.And: "and",
        ast.Or: "or",
        ast.USub: "-",
        ast.Not: "not",
    }.get(type(op), type(op).__name__)


def _expr(text: str) -> ast.expr:
    return ast.parse(text, mode="eval").body


def apply_mutant(source: str, m: Mutant) -> str:
    tree = ast.parse(source)
    nodes = list(ast.walk(tree))
    node = nodes[m.index]
    parents = {}
    for p in nodes:
        for field, value in ast.iter_fields(p):
            if isinstance(value, list):
                for k, child in enumerate(value):
                    parents[id(child)] = (p, field, k)
            elif isinstance(value, ast.AST):
                parents[id(value)] = (p, field, None)

    def replace(new):
        p, field, k = parents[id(node)]
        if k is None:
            setattr(p, field, new)
        else:
            getattr(p, field)[k] = new

    if m.kind == "cmp":
        k, new = m.arg
        node.ops[k] = new()
    elif m.kind in ("binop", "boolop"):
        node.op = m.arg()
    elif m.kind == "unwrap_unary":
        replace(node.operand)
    elif m.kind == "const":
        node.value = m.arg
    elif m.kind == "rename":
        node.func = _expr(m.arg)
    elif m.kind == "attr":
        node.func.attr = m.arg
    elif m.kind == "nextafter":
        d = node.args[1]
        node.args[1] = (
            d.operand
            if isinstance(d, ast.UnaryOp) and isinstance(d.op, ast.USub)
            else ast.UnaryOp(op=ast.USub(), operand=d)
        )
    elif m.kind == "unwrap_call":
        replace(node.args[0])
    elif m.kind == "remove_stmt":
        replace(ast.Pass())
    else:  # pragma: no cover
        raise ValueError(f"unknown mutation kind {m.kind!r}")
    return ast.unparse(ast.fix_missing_locations(tree))
