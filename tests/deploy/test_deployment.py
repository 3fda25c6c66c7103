"""The Deployment Engine path: certificates, keys, process teardown, and real Flower clusters.

The slow tests start a real ``flower-superlink`` and ``flower-supernode`` processes on 127.0.0.1
with TLS and SuperNode authentication. Every wait is bounded and every process is stopped, also
when a test fails: the cluster's context manager stops them, and each test checks that nothing
it started is still running afterwards.
"""

from __future__ import annotations

import ipaddress
import json
import os
import sys
import time
from pathlib import Path

import pytest

from fedfilter.client.ledger.owner_state import owner_state_at
from fedfilter.deploy.cluster import FlowerCluster
from fedfilter.deploy.command import OWNERS_DIR, DeployOptions, build_run_config, deploy_local
from fedfilter.deploy.flower_config import toml_value, write_connection
from fedfilter.deploy.processes import DeploymentError, ManagedProcess
from fedfilter.deploy.tls import make_node_key, make_tls

REPO = Path(__file__).resolve().parents[2]


def _live_processes_with_env(prefix: str) -> list[str]:
    """Live processes (not zombies) whose FLWR_HOME lies under ``prefix``."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", encoding="utf-8", errors="replace") as handle:
                state = handle.read().rsplit(")", 1)[1].split()[0]
            environ = Path(f"/proc/{entry}/environ").read_bytes()
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ")
        except (OSError, IndexError):
            continue
        if state != "Z" and f"FLWR_HOME={prefix}".encode() in environ:
            found.append(f"{entry}: {cmdline.decode(errors='replace')}")
    return found


def _assert_nothing_left(root: Path, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while (left := _live_processes_with_env(str(root))) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert left == [], f"processes still running after teardown: {left}"


# --- fast: certificates, keys, config, process teardown -------------------------------------------


def test_tls_server_certificate_is_signed_by_the_ca_for_loopback(tmp_path):
    from cryptography import x509

    files = make_tls(tmp_path)
    ca = x509.load_pem_x509_certificate(files.ca_cert.read_bytes())
    server = x509.load_pem_x509_certificate(files.server_cert.read_bytes())
    server.verify_directly_issued_by(ca)  # raises if not signed by the CA
    names = server.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert names.get_values_for_type(x509.IPAddress) == [ipaddress.ip_address("127.0.0.1")]
    assert names.get_values_for_type(x509.DNSName) == ["localhost"]
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    assert files.server_key.stat().st_mode & 0o077 == 0
    assert not list(tmp_path.glob("ca.key*"))  # the CA key is never written


def test_node_key_is_openssh_ecdsa_p384_as_flower_loads_it(tmp_path):
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.hazmat.primitives.serialization import (
        load_ssh_private_key,
        load_ssh_public_key,
    )

    private, public = make_node_key(tmp_path / "node")
    key = load_ssh_private_key(private.read_bytes(), password=None)
    assert isinstance(key, ec.EllipticCurvePrivateKey) and key.curve.name == "secp384r1"
    assert public.read_text().startswith("ecdsa-sha2-nistp384 ")
    assert load_ssh_public_key(public.read_bytes()).public_numbers() == key.public_key().public_numbers()
    assert private.stat().st_mode & 0o077 == 0


def test_toml_values_round_trip_through_flowers_parser(tmp_path):
    import tomllib

    values = {"ledger-dir": 'a dir/with "quotes" \\ and é', "budget-epsilon": 1e-05, "partition-id": 3, "leave": False}
    text = "\n".join(f"{json.dumps(k)} = {toml_value(v)}" for k, v in values.items())
    assert tomllib.loads(text) == values
    with pytest.raises(ValueError, match="bool, int, float or str"):
        toml_value([1, 2])


@pytest.mark.parametrize("tls", [True, False])
def test_connection_is_read_back_by_flowers_cli_as_the_default(tmp_path, monkeypatch, tls):
    from flwr.cli.flower_config import read_superlink_connection

    ca = tmp_path / "ca.crt" if tls else None
    write_connection(tmp_path / "home", "fedfilter-x", "127.0.0.1:9093", root_certificates=ca)
    monkeypatch.setenv("FLWR_HOME", str(tmp_path / "home"))
    connection = read_superlink_connection()  # no name: the default
    assert (connection.name, connection.address) == ("fedfilter-x", "127.0.0.1:9093")
    assert connection.root_certificates == (str(ca) if tls else None)
    assert bool(connection.insecure) is (not tls)


def test_a_simulation_cluster_refuses_node_auth_and_supernodes(tmp_path):
    with pytest.raises(ValueError, match="node_auth"):
        FlowerCluster(tmp_path, simulation=True)
    cluster = FlowerCluster(tmp_path, tls=False, node_auth=False, simulation=True)
    with pytest.raises(DeploymentError, match="simulation"):
        cluster.start_supernode("device-0", private_key=None)
    assert not (tmp_path / "supernodes").exists()


def test_run_config_sets_rounds_and_ledger_and_refuses_unknown_keys(tmp_path):
    app_config = {"num-server-rounds": 5, "public-ledger": "x.sqlite", "local-epochs": 1}
    options = DeployOptions(clients=2, rounds=3, run_config={"local-epochs": 2})
    assert build_run_config(app_config, options, tmp_path / "l.sqlite") == {
        "num-server-rounds": 3,
        "public-ledger": str(tmp_path / "l.sqlite"),
        "local-epochs": 2,
    }
    with pytest.raises(ValueError, match="not declared"):
        build_run_config(app_config, DeployOptions(clients=2, run_config={"nope": 1}), tmp_path)
    with pytest.raises(ValueError, match="number of rounds"):
        build_run_config({}, options, tmp_path)


def test_options_report_every_problem_at_once():
    with pytest.raises(ValueError) as err:
        DeployOptions(clients=0, rounds=0, delta=2.0, after_exhaustion="x", filter_kind="y", reply_hold_s=-1.0).check()
    for name in ("--clients", "--rounds", "--delta", "--after-exhaustion", "--filter", "--reply-hold-s"):
        assert name in str(err.value)


_SPAWNER = """
import subprocess, sys, time
# a child in the same group, and a grandchild in a new session (as flower-superlink does)
subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)
print("spawned", flush=True)
time.sleep(600)
"""


def test_managed_process_stops_its_group_and_descendants_in_other_sessions(tmp_path):
    env = dict(os.environ, FLWR_HOME=str(tmp_path / "home"))
    with ManagedProcess(
        "spawner", [sys.executable, "-c", _SPAWNER], log_path=tmp_path / "spawner.log", env=env
    ) as process:
        process.wait_for_log("spawned", timeout=30)
        assert len(_live_processes_with_env(str(tmp_path))) == 3
    assert process.returncode == -15  # SIGTERM
    _assert_nothing_left(tmp_path, timeout=5)


def test_managed_process_kills_what_ignores_sigterm(tmp_path):
    stubborn = (
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
        "print('ready', flush=True); time.sleep(600)"
    )
    env = dict(os.environ, FLWR_HOME=str(tmp_path / "home"))
    process = ManagedProcess(
        "stubborn", [sys.executable, "-c", stubborn], log_path=tmp_path / "stubborn.log", env=env
    ).start()
    process.wait_for_log("ready", timeout=30)
    started = time.monotonic()
    assert process.stop(grace_s=1.0) == -9  # SIGKILL after the grace period
    assert time.monotonic() - started < 10
    assert process.stop() == -9  # a second stop changes nothing
    _assert_nothing_left(tmp_path, timeout=5)


# --- slow: real Flower clusters on 127.0.0.1 ------------------------------------------------------


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_unregistered_or_missing_supernode_key_is_refused_and_never_joins(tmp_path):
    with FlowerCluster(tmp_path, grace_s=5.0) as cluster:
        good_key, good_pub = cluster.new_key("registered")
        node_id = cluster.register(good_pub)
        stranger_key, _ = cluster.new_key("stranger")  # never registered
        good = cluster.start_supernode("registered", private_key=good_key)
        stranger = cluster.start_supernode("stranger", private_key=stranger_key)
        keyless = cluster.start_supernode("keyless", private_key=None)

        cluster.wait_online([good], timeout=60)
        assert good.node_id == node_id
        assert stranger.process.wait(60) not in (None, 0)
        assert "[code: 2004] Failed to activate SuperNode" in stranger.process.log_text()
        assert keyless.process.wait(60) not in (None, 0)
        assert "[code: 2001] SuperNode authentication is enabled" in keyless.process.log_text()
        assert "SuperNode ID" not in stranger.process.log_text() + keyless.process.log_text()

        listed = cluster.flwr("supernode", "list", cluster.connection, "--format", "json")
        nodes = json.loads(listed.stdout[listed.stdout.index("{") :]).get("nodes", [])
        assert [(int(n["node-id"]), n["status"]) for n in nodes] == [(node_id, "online")]
        assert good.process.running
    _assert_nothing_left(tmp_path)


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_simulation_superlink_listens_on_loopback_without_tls_and_answers_the_cli(tmp_path):
    lines: list[str] = []
    with FlowerCluster(tmp_path, tls=False, node_auth=False, simulation=True, grace_s=5.0, echo=lines.append) as c:
        assert c.address.startswith("127.0.0.1:") and c.tls is None
        argv = c.superlink.argv
        assert "--insecure" in argv and "--simulation" in argv and "--enable-supernode-auth" not in argv
        assert argv[argv.index("--host") + 1] == "127.0.0.1"
        assert c.flwr("ls", c.connection, "--format", "json", timeout=60).returncode == 0
        assert "no TLS" in lines[0] and "simulation" in lines[0]
    _assert_nothing_left(tmp_path)


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_deployment_run_under_tls_and_node_auth_keeps_every_device_within_budget(tmp_path):
    from fedfilter.client.ledger.budget import BudgetLedger

    out = tmp_path / "deploy"
    lines: list[str] = []
    code = deploy_local(
        DeployOptions(
            clients=2,
            rounds=2,
            out=out,
            app_dir=REPO / "fedfilter" / "app",
            budgets=(0.5, 4.0),
            reply_hold_s=0.0,  # timing protection off: a fast test (test_reply_timing.py)
            timeout_s=180.0,
            connect_timeout_s=60.0,
            grace_s=5.0,
        ),
        echo=lines.append,
    )
    log = "\n".join(lines)
    assert code == 0, log
    _assert_nothing_left(out)

    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "finished:completed"
    assert summary["rounds_completed"] >= 2, log
    assert Path(summary["public_ledger"]).is_file()
    assert [c["client_id"] for c in summary["clients"]] == ["device-0", "device-1"]
    for index, client in enumerate(summary["clients"]):
        with owner_state_at(out / OWNERS_DIR / str(index)):  # where the device's roll-back anchor is
            ledger = BudgetLedger.open(out / "devices" / str(index))
        try:
            assert ledger.enrolment.epsilon == client["budget_epsilon"] == (0.5, 4.0)[index]
            # the device answered both rounds itself, and its own record is within its budget
            assert len(ledger.records(summary["run_id"])) == 2
            assert bool(ledger.filter.within_budget(ledger.recomputed_state()))
            assert ledger.spent_epsilon() == client["spent_epsilon"]
        finally:
            ledger.close()
        # epsilon is converted from the filter state rounding up, so a budget spent exactly
        # reads a few ulp above it: the tolerance `fedfilter demo` checks too
        assert client["spent_epsilon"] <= client["budget_epsilon"] * (1 + 1e-9)


# --- distributed placement (Skellam shares over SecAgg+) -----------------------------------------


def test_distributed_placement_enrols_rdp_sets_the_threshold_and_refuses_what_would_break_it(tmp_path):
    options = DeployOptions(clients=5, placement="distributed")
    options.check()
    assert (options.filter, options.reports_needed) == ("rdp", 3)  # ceil(5 / 2)
    from fedfilter.deploy.command import device_node_config

    assert device_node_config(0, options, tmp_path)["filter"] == "rdp"
    app = {"num-rounds": 5, "placement": "local", "min-reports": 1, "min-available-nodes": 2}
    assert build_run_config(app, options, tmp_path / "l.sqlite") == {
        "num-rounds": 2,
        "min-available-nodes": 5,
        "placement": "distributed",
        "min-reports": 3,
    }
    assert build_run_config(app, DeployOptions(clients=5), tmp_path)["placement"] == "local"
    with pytest.raises(ValueError, match="declares no 'placement'"):
        build_run_config({"num-rounds": 5}, options, tmp_path)
    bad = {
        "--filter rdp": DeployOptions(clients=3, placement="distributed", filter_kind="gdp"),
        "at most --clients=3": DeployOptions(clients=3, placement="distributed", min_reports=4),
        "distributed only": DeployOptions(clients=3, min_reports=2),
        "--run-config may not set": DeployOptions(clients=3, run_config={"placement": "distributed"}),
        "--placement must be": DeployOptions(clients=3, placement="central"),
        "--clients >= 2": DeployOptions(clients=1, placement="distributed"),
    }
    for words, opts in bad.items():
        with pytest.raises(ValueError, match=words):
            opts.check()


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_distributed_rounds_under_tls_and_node_auth_release_sums_and_keep_devices_within_budget(tmp_path):
    """>= 3 SuperNodes, each its own process (its ClientApps install the cryptographic masks through
    the secure aggregation mod; the ServerApp through the strategy), 2 distributed rounds."""
    from fedfilter.client.ledger.budget import BudgetLedger
    from fedfilter.coordinator.public_ledger import PublicLedger

    out, clients, rounds = tmp_path / "deploy", 3, 2
    lines: list[str] = []
    code = deploy_local(
        DeployOptions(
            clients=clients,
            rounds=rounds,
            out=out,
            app_dir=REPO / "fedfilter" / "app",
            budgets=(2.0, 4.0, 8.0),
            placement="distributed",
            reply_hold_s=0.0,
            timeout_s=480.0,
            connect_timeout_s=60.0,
            grace_s=5.0,
        ),
        echo=lines.append,
    )
    log = "\n".join(lines)
    assert code == 0, log
    _assert_nothing_left(out)

    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "finished:completed", log
    assert summary["placement"] == "distributed" and summary["secure_aggregation"] is True
    assert summary["settings"]["tls"] and summary["settings"]["supernode_auth"]
    assert summary["settings"]["filter"] == "rdp" and summary["settings"]["min_reports"] == 2
    assert summary["rounds_completed"] == rounds and summary["released_rounds"] >= 1, log
    with PublicLedger(Path(summary["public_ledger"]), read_only=True) as public:
        records = public.records(summary["run_id"])
        config = json.loads([r for r in public.runs() if r.run_id == summary["run_id"]][0].config_json)
    assert config["placement"] == "distributed"
    for rec in records:
        assert rec.clients_sampled == clients
        assert (not rec.released) or rec.reports_received >= 2
    assert sum(bool(r.released) for r in records) == summary["released_rounds"]
    for index, client in enumerate(summary["clients"]):
        with owner_state_at(out / OWNERS_DIR / str(index)):  # where the device's roll-back anchor is
            ledger = BudgetLedger.open(out / "devices" / str(index))
        try:
            assert ledger.enrolment.filter_kind == "rdp"
            assert {r.placement for r in ledger.records(summary["run_id"])} == {"distributed"}
            assert len(ledger.records(summary["run_id"])) == rounds
            assert bool(ledger.filter.within_budget(ledger.recomputed_state()))
            assert ledger.worst_case is not None and ledger.worst_case.epsilon == client["worst_case_epsilon"]
        finally:
            ledger.close()
        assert client["spent_epsilon"] <= client["budget_epsilon"] * (1 + 1e-9)
        assert client["worst_case_spent_epsilon"] <= client["worst_case_epsilon"]
        assert "against any coordinator" in summary["guarantee"][client["client_id"]][1]
