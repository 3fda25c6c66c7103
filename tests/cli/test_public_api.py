"""The short public API at ``fedfilter``: every name resolves, and importing it stays light."""

import subprocess
import sys

import pytest

import fedfilter


@pytest.mark.parametrize("name", sorted(fedfilter._PUBLIC))
def test_every_public_name_resolves_to_its_module(name):
    import importlib

    value = getattr(fedfilter, name)
    assert value is getattr(importlib.import_module(fedfilter._PUBLIC[name]), name)


def test_all_lists_exactly_the_public_names():
    assert sorted(fedfilter.__all__) == sorted([*fedfilter._PUBLIC, "__version__"])


def test_unknown_name_is_an_attribute_error():
    with pytest.raises(AttributeError, match="no_such_thing"):
        fedfilter.no_such_thing  # noqa: B018


def test_import_fedfilter_loads_neither_flower_nor_torch():
    code = "import sys, fedfilter; print(' '.join(m for m in ('flwr', 'torch', 'numpy') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == ""


def test_a_copy_of_the_checkout_imports_its_own_code(tmp_path):
    # The mutation benchmark and git worktrees run a copy of the sources: its fedfilter.client must be
    # the copy's client/, not the editable install's.
    import shutil
    from pathlib import Path

    root = Path(fedfilter.__file__).resolve().parents[1]
    for name in ("fedfilter", "client", "coordinator", "privacy", "protocol", "protos", "simulations"):
        shutil.copytree(root / name, tmp_path / name, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(root / "pyproject.toml", tmp_path / "pyproject.toml")
    code = (
        "import fedfilter.client.ledger.budget as m, fedfilter.coordinator.strategy as s; print(m.__file__, s.__file__)"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, check=True)
    assert out.stdout.split() == [
        str(tmp_path / "client" / "ledger" / "budget.py"),
        str(tmp_path / "coordinator" / "strategy.py"),
    ]
