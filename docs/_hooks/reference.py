"""MkDocs hook: the API reference and the Derivations section, generated from what is on disk.

Every module under ``fedfilter/`` gets a ``::: fedfilter.<module>`` block (mkdocstrings renders its
docstrings), one page per top-level package, so a new module cannot be left out of the reference;
``tests/cli/test_docs.py`` checks the list against the files. Every page in ``docs/derivations/``
is listed under "Derivations" in the order of its file name (``index.md`` first).
"""

from __future__ import annotations

from pathlib import Path

from mkdocs.structure.files import File

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "fedfilter"
# Generated protobuf code (no docstrings of its own) and the `python -m fedfilter` entry point.
SKIP_SUFFIXES = ("_pb2.py", "_pb2_grpc.py")
SKIP_MODULES = {"fedfilter.__main__"}


def modules() -> list[str]:
    """Every importable module of fedfilter the reference documents, sorted by dotted name."""
    names = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(ROOT).with_suffix("")
        parts = list(rel.parts)
        if path.name.endswith(SKIP_SUFFIXES) or "__pycache__" in parts:
            continue
        if parts[-1] == "__init__":
            parts = parts[:-1]
        name = ".".join(parts)
        if name in SKIP_MODULES:
            continue
        names.append(name)
    return sorted(names)


def pages() -> dict[str, str]:
    """The reference pages: path under docs/ -> Markdown, one page per top-level package."""
    groups: dict[str, list[str]] = {}
    for name in modules():
        parts = name.split(".")
        top = "fedfilter" if len(parts) == 1 or (PACKAGE / f"{parts[1]}.py").exists() else parts[1]
        groups.setdefault(top, []).append(name)
    out = {}
    for top, names in sorted(groups.items()):
        title = "fedfilter (public API and top-level modules)" if top == "fedfilter" else f"fedfilter.{top}"
        blocks = "\n\n".join(f"## `{n}`\n\n::: {n}\n    options:\n      show_root_heading: false" for n in names)
        out[f"reference/{top}.md"] = f"# {title}\n\nGenerated from the docstrings.\n\n{blocks}\n"
    return out


def derivations(docs_dir: Path) -> list[str]:
    folder = docs_dir / "derivations"
    files = sorted(p.name for p in folder.glob("*.md"))
    files.sort(key=lambda n: (n != "index.md", n))
    return [f"derivations/{n}" for n in files]


def on_config(config):
    docs_dir = Path(config["docs_dir"])
    reference = list(pages())
    reference.sort(key=lambda p: (p != "reference/fedfilter.md", p))
    for i, item in enumerate(config["nav"]):
        if isinstance(item, dict) and "API reference" in item:
            config["nav"][i] = {"API reference": ["reference/index.md", *reference]}
        if isinstance(item, dict) and "Derivations" in item:
            config["nav"][i] = {"Derivations": derivations(docs_dir)}
    return config


def contributing() -> str:
    """CONTRIBUTING.md as a page of the site (its links into docs/ rewritten to the site's pages)."""
    text = (ROOT / "CONTRIBUTING.md").read_text(encoding="utf-8")
    return text.replace("](docs/", "](").replace("](README.md)", "](index.md)")


def tables() -> dict[str, str]:
    """Tables built from the code itself, so the pages cannot drift from it."""
    import sys

    sys.path.insert(0, str(ROOT))  # this checkout, not another one installed in the environment
    from fedfilter.client.settings.node_config import NODE_CONFIG_KEYS
    from fedfilter.protocol.refusals import REFUSALS

    codes = "\n".join(f"| `{code}` | {text.replace('|', '/')} |" for code, text in REFUSALS.items())
    keys = ", ".join(f"`{key}`" for key in NODE_CONFIG_KEYS)
    return {
        "{{ refusal_codes }}": "| code | what it means, and the fix |\n|---|---|\n" + codes,
        "{{ node_config_keys }}": keys,
    }


def on_files(files, config):
    for path, text in pages().items():
        files.append(File.generated(config, path, content=text))
    files.append(File.generated(config, "contributing.md", content=contributing()))
    return files


def on_page_markdown(markdown, page, config, files):
    if "{{ " in markdown:
        for marker, text in tables().items():
            markdown = markdown.replace(marker, text)
    return markdown
