"""The owner's command in a real local deployment (``fedfilter deploy-local``): a hostile app is
refused by devices whose owners approved only the built-in app, with no module of it imported and
nothing spent; approved, the same app runs only inside the device's filter.

The app (tests/apps/hostile_reader) lists no fedfilter mod, answers train with the device's node config
and raw weights and query with the node config, and leaves a marker file when its client module is
imported. One test, two deploy-local runs of one round each (about two minutes under load).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from flwr.cli.build import build_fab_from_disk

from fedfilter.deploy.command import DeployOptions, deploy_local

REPO = Path(__file__).resolve().parents[2]
HOSTILE = REPO / "tests" / "apps" / "hostile_reader"
BUILTIN = REPO / "fedfilter" / "app"


def _deploy(out: Path, approve: Path) -> tuple[int, str, dict, dict]:
    lines: list[str] = []
    code = deploy_local(
        DeployOptions(
            clients=2,
            rounds=1,
            out=out,
            app_dir=HOSTILE,
            approve_apps=(approve,),
            reply_hold_s=0.0,
            timeout_s=240.0,
            connect_timeout_s=90.0,
            grace_s=5.0,
        ),
        echo=lines.append,
    )
    summary = json.loads((out / "summary.json").read_text())
    markers = Path(out.parent / "markers")
    (server,) = [json.loads(p.read_text()) for p in markers.glob("server-*.json")]
    for p in markers.glob("server-*.json"):
        p.unlink()
    return code, "\n".join(lines), summary, server


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_devices_run_only_approved_apps_and_always_inside_their_filter(tmp_path, monkeypatch):
    markers = tmp_path / "markers"
    markers.mkdir()
    monkeypatch.setenv("FEDFILTER_TEST_MARKER_DIR", str(markers))
    fab_hash = hashlib.sha256(build_fab_from_disk(HOSTILE)).hexdigest()

    # 1. The owners approved only the built-in app: every device refuses, before any import.
    code, log, summary, server = _deploy(tmp_path / "refused", approve=BUILTIN)
    assert code == 0, log  # the hostile ServerApp itself ran to its end
    assert list(markers.glob("imported-*")) == [], log  # no module of the app was imported on a device
    assert summary["refused_apps"] == {"device-0": [fab_hash], "device-1": [fab_hash]}, log
    assert f"device-0 refused app {fab_hash}: not approved by its owner" in log
    for kind in ("train", "query"):
        assert len(server[kind]) == 2
        for reply in server[kind]:
            assert fab_hash in reply["error"] and "fedfilter apps approve" in reply["error"], reply
    assert [c["spent_epsilon"] for c in summary["clients"]] == [0.0, 0.0]
    assert not list((tmp_path / "refused" / "supernodes").glob("*/flwr-home/fedfilter-approved-apps"))

    # 2. The same app, approved by its owners: it runs, inside the device's filter.
    code, log, summary, server = _deploy(tmp_path / "approved", approve=HOSTILE)
    assert code == 0, log
    assert summary["refused_apps"] == {}, log
    assert len(list(markers.glob("imported-*"))) == 2  # once per device: kept loaded for the run
    for reply in server["train"]:
        assert reply == {"records": ["arrays", "fedfilter.status"]}  # the node config it read never left
    for reply in server["query"]:
        assert "refused" in reply["error"] and "budget" not in reply["error"]
    for client in summary["clients"]:
        assert 0 < client["spent_epsilon"] <= client["budget_epsilon"] * (1 + 1e-9)
