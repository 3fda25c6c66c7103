"""The README stays short, its links resolve, and the docs site documents every module of fedfilter.

The site itself is built by `make docs` (`mkdocs build --strict`, run by `make test`): that checks
every link and anchor inside docs/. These tests check what the build cannot see: the README and
CONTRIBUTING (outside the site), and that the generated API reference lists every module on disk.
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HOOK = ROOT / "docs" / "_hooks" / "reference.py"
# [text](target) links; images too. Targets with a scheme or a bare anchor are not files.
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")


def _hook():
    spec = importlib.util.spec_from_file_location("docs_reference_hook", HOOK)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _relative_links(doc: Path) -> list[str]:
    text = re.sub(r"```.*?```", "", doc.read_text(encoding="utf-8"), flags=re.DOTALL)
    return [t for t in LINK.findall(text) if not re.match(r"^[a-z][a-z0-9+.-]*:", t) and not t.startswith("#")]


def test_readme_is_short():
    lines = (ROOT / "README.md").read_text(encoding="utf-8").count("\n")
    assert lines <= 260, f"README.md has {lines} lines: move the detail into a page under docs/"


def test_every_relative_link_in_readme_and_contributing_resolves():
    checked = 0
    for name in ("README.md", "CONTRIBUTING.md"):
        doc = ROOT / name
        for target in _relative_links(doc):
            path = (doc.parent / target.split("#", 1)[0]).resolve()
            assert path.exists(), f"{name} links to {target}, which is not in the repository"
            checked += 1
    assert checked >= 10, "the README should point into the docs"


def test_the_reference_lists_every_module_of_fedfilter():
    hook = _hook()
    on_disk = set()
    for path in (ROOT / "fedfilter").rglob("*.py"):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        on_disk.add(".".join(parts))
    skipped = {m for m in on_disk if m.endswith(("_pb2", "_pb2_grpc"))} | {"fedfilter.__main__"}
    assert set(hook.modules()) == on_disk - skipped
    rendered = "\n".join(hook.pages().values())
    for module in on_disk - skipped:
        assert f"\n::: {module}\n" in rendered, f"{module} has no ::: block in the API reference"
    # The site's index page for the reference and one page per package.
    assert all(path.startswith("reference/") for path in hook.pages())


def test_derivations_lists_every_page_in_its_folder():
    hook = _hook()
    folder = ROOT / "docs" / "derivations"
    listed = hook.derivations(ROOT / "docs")
    assert listed[0] == "derivations/index.md"
    assert sorted(listed) == sorted(f"derivations/{p.name}" for p in folder.glob("*.md"))


def test_docs_and_code_cite_no_issue_numbers_and_no_files_outside_the_repository():
    # A reader of the repository has neither the tracker nor the folder the papers and the design
    # brief were handed over in: the docs and the code cite papers by their authors.
    docs = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *sorted((ROOT / "docs").rglob("*.md"))]
    docs = [d for d in docs if not d.relative_to(ROOT).as_posix().startswith("docs/results_")]
    code = [
        p
        for folder in ("fedfilter", "tests", "benchmarks", "examples")
        for p in sorted((ROOT / folder).rglob("*"))
        if p.suffix in (".py", ".md", ".toml", ".proto") and p.resolve() != Path(__file__).resolve()
    ]
    assert len(code) > 300  # the scan found the code
    docs += code
    pattern = re.compile(r"\bissues? \d+|\.\./shared|DESIGN\.md|\bDESIGN section|papers/00\d", flags=re.IGNORECASE)
    found = [
        f"{doc.relative_to(ROOT)}:{n}: {line.strip()}"
        for doc in docs
        for n, line in enumerate(doc.read_text(encoding="utf-8").splitlines(), 1)
        if pattern.search(line)
    ]
    assert not found, "\n".join(found)
