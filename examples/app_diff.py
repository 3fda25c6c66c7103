"""The fedfilter lines of the example: a unified diff of two Flower app folders.

``quickstart-pytorch/`` is ``flower-quickstart-pytorch/`` (Flower's template, offline data) plus
fedfilter. ``python examples/app_diff.py`` prints the diff; ``--write`` stores it in
``quickstart-pytorch/FEDFILTER.diff``, the file the README shows and ``tests/test_example_app.py``
compares with the live diff, so neither can go stale.
"""

from __future__ import annotations

import difflib
import sys
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parent
BASE = EXAMPLES / "flower-quickstart-pytorch"
WITH_FEDFILTER = EXAMPLES / "quickstart-pytorch"
DIFF_FILE = WITH_FEDFILTER / "FEDFILTER.diff"
CONTEXT_LINES = 2


def app_files(app_dir: Path) -> list[str]:
    """The files that make the Flower app (what ``flwr run`` packs): pyproject and the package's code."""
    return ["pyproject.toml"] + sorted(str(p.relative_to(app_dir)) for p in app_dir.glob("pytorchexample/*.py"))


def _lines(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").splitlines(keepends=True) if path.exists() else []


def app_diff(base: Path = BASE, changed: Path = WITH_FEDFILTER) -> str:
    """``diff -u``-style text from ``base`` to ``changed``, file by file; files only on one side count whole."""
    names = sorted(set(app_files(base)) | set(app_files(changed)))
    out: list[str] = []
    for name in names:
        old, new = _lines(base / name), _lines(changed / name)
        out += difflib.unified_diff(old, new, f"{base.name}/{name}", f"{changed.name}/{name}", n=CONTEXT_LINES)
    return "".join(out)


def changed_lines(diff: str) -> int:
    """Lines added plus lines removed (a replaced line counts twice)."""
    lines = diff.splitlines()
    return sum(1 for line in lines if line[:1] in "+-" and not line.startswith(("+++ ", "--- ")))


if __name__ == "__main__":
    text = app_diff()
    if sys.argv[1:] == ["--write"]:
        DIFF_FILE.write_text(text, encoding="utf-8")
        print(f"wrote {DIFF_FILE} ({changed_lines(text)} changed lines)")
    elif sys.argv[1:]:
        sys.exit(f"usage: python {Path(__file__).name} [--write]. Found {sys.argv[1:]!r}.")
    else:
        sys.stdout.write(text)
