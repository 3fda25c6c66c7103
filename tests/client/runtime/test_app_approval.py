"""The owner's approved apps: what is approved, by what, and what a hostile coordinator cannot change.

The FAB hash is checked against an independent computation (SHA-256 of the bytes Flower's own
builder makes, the builder ``flwr run`` calls), and every FAB here is built with Flower's builder.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import zipfile
from pathlib import Path

import pytest
from flwr.cli.build import build_fab_from_disk

from fedfilter.client.runtime import approval as app_approval
from fedfilter.client.runtime.approval import (
    APPROVE_HINT,
    ApprovalError,
    approvals_path,
    approve,
    decide,
    fab_hash,
    load_approved,
    revoke,
)

REPO = Path(__file__).resolve().parents[3]
BUILTIN = REPO / "fedfilter" / "app"
HOSTILE = REPO / "tests" / "apps" / "hostile_reader"
QUICKSTART = REPO / "examples" / "quickstart-pytorch"


@pytest.fixture
def approvals(tmp_path) -> Path:
    return tmp_path / "owner" / "approved_apps.json"


def test_the_hash_is_flowers_and_the_build_is_deterministic(tmp_path, approvals):
    copy = tmp_path / "copy"
    shutil.copytree(HOSTILE, copy)
    first = build_fab_from_disk(copy)
    os.utime(copy / "hostile_reader" / "client_app.py", (1, 1))  # file dates do not enter the FAB
    assert build_fab_from_disk(copy) == first
    entry = approve(copy, approvals)
    assert entry.hash == hashlib.sha256(first).hexdigest() == fab_hash(first)
    assert entry.clientapp is None  # the FAB carries its component: approved by hash only
    (copy / "hostile_reader" / "client_app.py").write_text("app = None\n")  # changed code, new hash
    assert decide(build_fab_from_disk(copy), load_approved(approvals)).approved is False


def test_a_fab_file_is_approved_by_the_hash_of_its_bytes(tmp_path, approvals):
    fab = tmp_path / "app.fab"
    fab.write_bytes(build_fab_from_disk(HOSTILE))
    entry = approve(fab, approvals)
    assert entry.hash == hashlib.sha256(fab.read_bytes()).hexdigest()
    assert decide(fab.read_bytes(), load_approved(approvals)).by == "hash"


def test_the_builtin_app_is_approved_by_the_installed_component_it_names(approvals):
    entry = approve(BUILTIN, approvals)
    assert entry.clientapp == "fedfilter.app.client_app:app"
    decision = decide(build_fab_from_disk(BUILTIN), load_approved(approvals))
    assert (decision.approved, decision.by, decision.clientapp) == (True, "component", entry.clientapp)


def _fab_with(files: dict[str, bytes | str]) -> bytes:
    """A FAB as Flower builds it, from in-memory files."""
    from flwr.cli.build import build_fab_from_files

    return build_fab_from_files({k: v.encode() if isinstance(v, str) else v for k, v in files.items()})[0]


def _pyproject(clientapp: str, extra: str = "") -> str:
    return (
        '[project]\nname = "x"\nversion = "1.0.0"\ndependencies = []\n'
        '[tool.flwr.app]\npublisher = "p"\n'
        f'[tool.flwr.app.components]\nserverapp = "srv:app"\nclientapp = "{clientapp}"\n'
        f"[tool.flwr.app.config]\nnum-rounds = 1\n{extra}"
    )


def test_nothing_in_the_fab_approves_it(approvals):
    """Attack: FAB metadata and run config that claim approval, with the owner's list empty or other."""
    approve(BUILTIN, approvals)
    fab = _fab_with(
        {
            "pyproject.toml": _pyproject(
                "hostile.client_app:app",
                f'approved = true\nfedfilter-approved-hash = "{"0" * 64}"\nfedfilter-approved-component = '
                '"fedfilter.app.client_app:app"\n',
            ),
            "hostile/__init__.py": "",
            "hostile/client_app.py": "app = None\n",
            "approved_apps.json": json.dumps(
                {"version": 1, "apps": [{"hash": "x", "clientapp": "hostile.client_app:app"}]}
            ),
        }
    )
    decision = decide(fab, load_approved(approvals))
    assert not decision.approved and decision.fab_hash == fab_hash(fab)
    reason = decision.refusal()
    assert decision.fab_hash in reason and APPROVE_HINT in reason and "nothing was installed" in reason


def test_a_component_approval_never_uses_the_fabs_own_files(approvals):
    """Attack: a FAB naming the approved component that carries its own copy (or a shadowing module):
    it is approved by component and the component comes from the installed package, not the FAB."""
    approve(BUILTIN, approvals)
    fab = _fab_with(
        {
            "pyproject.toml": _pyproject("fedfilter.app.client_app:app"),
            "fedfilter/__init__.py": "",
            "fedfilter/app/__init__.py": "",
            "fedfilter/app/client_app.py": "raise SystemExit('shadow imported')\n",
            "numpy.py": "raise SystemExit('shadow imported')\n",
        }
    )
    decision = decide(fab, load_approved(approvals))
    assert (decision.approved, decision.by) == (True, "component")
    from fedfilter.app.client_app import app
    from fedfilter.client.runtime.runner import load_component

    assert load_component(decision.clientapp) is app


@pytest.mark.parametrize("component", ["os:system", "../x:app", "fedfilter.app.client_app", "a:b:c", ""])
def test_a_component_that_is_no_clientapp_reference_is_refused_before_import(component):
    from fedfilter.client.runtime.runner import load_component

    with pytest.raises(ValueError, match="component"):
        load_component(component)


def test_revoke_by_prefix_and_its_errors(approvals):
    one, two = approve(BUILTIN, approvals), approve(HOSTILE, approvals)
    assert {a.hash for a in load_approved(approvals)} == {one.hash, two.hash}
    with pytest.raises(ApprovalError, match="at least 8 hex digits"):
        revoke(one.hash[:7], approvals)
    with pytest.raises(ApprovalError, match="no approved app"):
        revoke("f" * 64 if not one.hash.startswith("f") else "e" * 64, approvals)
    assert revoke(one.hash[:8], approvals)[0].hash == one.hash
    assert [a.hash for a in load_approved(approvals)] == [two.hash]
    assert decide(build_fab_from_disk(BUILTIN), load_approved(approvals)).approved is False
    assert approvals.stat().st_mode & 0o077 == 0  # the owner's file only


def test_a_damaged_list_approves_nothing_and_says_where(approvals):
    approvals.parent.mkdir(parents=True)
    approvals.write_text("{not json")
    with pytest.raises(ApprovalError, match="damaged"):
        load_approved(approvals)
    approvals.write_text(json.dumps({"version": 99, "apps": []}))
    with pytest.raises(ApprovalError, match="version"):
        load_approved(approvals)


def test_bad_paths_are_named(tmp_path, approvals):
    with pytest.raises(ApprovalError, match="app directory or a .fab file"):
        approve(tmp_path / "missing", approvals)
    (tmp_path / "empty").mkdir()
    with pytest.raises(ApprovalError, match="cannot build a FAB"):
        approve(tmp_path / "empty", approvals)


def test_the_list_lives_in_the_owners_state_directory(tmp_path):
    assert approvals_path({"FEDFILTER_STATE_DIR": str(tmp_path)}) == tmp_path / app_approval.APPROVED_FILE
    assert approvals_path({"XDG_STATE_HOME": str(tmp_path)}) == tmp_path / "fedfilter" / app_approval.APPROVED_FILE


def test_the_fab_pyproject_is_read_in_memory(tmp_path):
    fab = build_fab_from_disk(HOSTILE)
    with zipfile.ZipFile(io.BytesIO(fab)) as archive:
        assert "hostile_reader/client_app.py" in archive.namelist()
    assert app_approval.fab_components(fab)["clientapp"] == "hostile_reader.client_app:app"
    with pytest.raises(ApprovalError, match="pyproject"):
        app_approval.fab_components(b"not a zip")


def test_a_pyproject_bomb_is_refused_before_it_is_decompressed():
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("pyproject.toml", b"#" * (app_approval.MAX_PYPROJECT_BYTES + 1))
    with pytest.raises(ApprovalError, match="bytes, above"):
        app_approval.fab_components(buffer.getvalue())
    assert decide(buffer.getvalue(), []).approved is False
