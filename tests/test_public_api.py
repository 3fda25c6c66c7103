"""The short public API at ``fedfilter``: every name resolves, is documented, and importing it stays light."""

import importlib
import inspect
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import fedfilter

REPO = Path(fedfilter.__file__).resolve().parents[1]
NAMES = sorted(set(fedfilter.__all__) - {"__version__"})


@pytest.mark.parametrize("name", NAMES)
def test_every_public_name_is_defined_in_fedfilter(name):
    value = getattr(fedfilter, name)
    assert value.__module__.startswith("fedfilter."), value.__module__
    assert getattr(importlib.import_module(value.__module__), name) is value  # defined there, not re-exported


def test_dir_lists_exactly_the_public_names():
    assert sorted(dir(fedfilter)) == sorted(fedfilter.__all__)
    assert isinstance(fedfilter.__version__, str)


def _has_section(doc: str, title: str) -> bool:
    return re.search(rf"^\s*{title}\n\s*{'-' * len(title)}\s*$", doc, re.M) is not None


@pytest.mark.parametrize("name", NAMES)
def test_every_public_name_is_documented(name):
    # numpy style: a class documents its constructor's parameters in the class docstring.
    doc = inspect.getdoc(getattr(fedfilter, name)) or ""
    missing = [title for title in ("Parameters", "Examples") if not _has_section(doc, title)]
    assert not missing, f"fedfilter.{name}'s docstring has no {' or '.join(missing)} section"


def test_the_section_check_can_fail():
    assert _has_section("Run it.\n\nParameters\n----------\nx : int\n", "Parameters")
    assert not _has_section("Run it.\n\nParameters: x\n", "Parameters")
    assert not _has_section("Run it.\n\nExamples\n---\n", "Examples")


def test_unknown_name_is_an_attribute_error():
    with pytest.raises(AttributeError, match="no_such_thing"):
        fedfilter.no_such_thing  # noqa: B018


def test_import_fedfilter_loads_neither_flower_nor_torch():
    code = "import sys, fedfilter; print(' '.join(m for m in ('flwr', 'torch', 'numpy') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == ""


def test_the_checkout_exposes_only_fedfilter():
    # A checkout run with PYTHONPATH=<checkout> imports fedfilter's own folders and nothing else of the
    # checkout (tests, benchmarks, ...) under fedfilter.
    folders = sorted(p.name for p in REPO.iterdir() if p.is_dir() and p.name.isidentifier() and p.name != "fedfilter")
    assert "tests" in folders
    code = (
        "import importlib, sys\n"
        "for name in sys.argv[1:]:\n"
        "    try:\n"
        "        importlib.import_module('fedfilter.' + name)\n"
        "    except ModuleNotFoundError:\n"
        "        continue\n"
        "    print(name)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run(
        [sys.executable, "-c", code, *folders], cwd=REPO, env=env, capture_output=True, text=True, check=True
    )
    assert done.stdout.split() == [], done.stdout


def test_a_copy_of_the_checkout_imports_its_own_code(tmp_path):
    # The mutation benchmark and git worktrees run a copy of the sources: its fedfilter.client must be
    # the copy's client/, not the editable install's.
    import shutil

    shutil.copytree(REPO / "fedfilter", tmp_path / "fedfilter", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO / "pyproject.toml", tmp_path / "pyproject.toml")
    code = (
        "import fedfilter.client.ledger.budget as m, fedfilter.coordinator.strategy as s; print(m.__file__, s.__file__)"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, check=True)
    assert out.stdout.split() == [
        str(tmp_path / "fedfilter" / "client" / "ledger" / "budget.py"),
        str(tmp_path / "fedfilter" / "coordinator" / "strategy.py"),
    ]
