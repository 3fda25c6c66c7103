"""No source file over 500 lines of code: a soft limit on what a reader must hold in mind.

Only code counts: docstrings, comments and blank lines are what explain the code, so a well-explained
module is never pushed to split by them. A file whose code grows past the limit gets split by idea.
"""

import ast
import io
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = ("fedfilter", "benchmarks", "tests", "examples")
LIMIT = 500
# Tokens that are no code: layout and comments (docstrings are found through the syntax tree).
NOT_CODE = {
    tokenize.COMMENT,
    tokenize.NL,
    tokenize.NEWLINE,
    tokenize.INDENT,
    tokenize.DEDENT,
    tokenize.ENCODING,
    tokenize.ENDMARKER,
}


def _docstring_lines(tree: ast.Module) -> set[int]:
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                if isinstance(first.value.value, str):
                    lines.update(range(first.lineno, (first.end_lineno or first.lineno) + 1))
    return lines


def code_lines(text: str) -> int:
    """The lines of ``text`` that hold code: not blank, not only a comment, not part of a docstring."""
    docstrings = _docstring_lines(ast.parse(text))
    lines: set[int] = set()
    for token in tokenize.generate_tokens(io.StringIO(text).readline):
        if token.type not in NOT_CODE:
            lines.update(n for n in range(token.start[0], token.end[0] + 1) if n not in docstrings)
    return len(lines)


def test_only_code_counts():
    text = '''"""A module
docstring."""

# a comment
import os  # a trailing comment


def f(x):
    """One line."""

    s = """a multi-line
    string is data"""
    return (x +
            1)
'''
    assert code_lines(text) == 6  # import, def, s = (2 lines), return (2 lines)
    assert code_lines("") == 0


def test_no_python_file_is_over_500_lines():
    sizes = {
        str(path.relative_to(ROOT)): code_lines(path.read_text(encoding="utf-8"))
        for folder in FOLDERS
        for path in (ROOT / folder).rglob("*.py")
        if "__pycache__" not in path.parts
    }
    assert len(sizes) > 100  # the scan found the code
    assert {name: n for name, n in sizes.items() if n > LIMIT} == {}
