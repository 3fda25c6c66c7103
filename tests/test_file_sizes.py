"""No source file over 500 lines: a file that grows past it gets split by idea."""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = ("fedfilter", "benchmarks", "tests", "examples")
LIMIT = 500


def test_no_python_file_is_over_500_lines():
    sizes = {
        str(path.relative_to(ROOT)): len(path.read_text(encoding="utf-8").splitlines())
        for folder in FOLDERS
        for path in (ROOT / folder).rglob("*.py")
        if "__pycache__" not in path.parts
    }
    assert len(sizes) > 100  # the scan found the code
    assert {name: n for name, n in sizes.items() if n > LIMIT} == {}
