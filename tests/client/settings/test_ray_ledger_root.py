"""A simulated device's ledger is never split between Ray nodes.

Two Ray nodes on 127.0.0.1 (``ray start --head`` and ``ray start --address``, each with its own
temp dir and its own device-settings file, as two machines would have), stopped by the test. Each
node runs the very function a simulated device runs to find its settings
(``with_device_settings``, which calls ``check_ledger_root``):

* partition 0: each node keeps its own ledger root (different identities) -> the second node refuses;
* partition 1: both nodes point at one shared ledger root -> both serve it;
* partition 2: node-local ledgers without a root identity, the same path on both -> refused too.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from fedfilter.client.settings.ledger_root import LedgerRootError, check_ledger_root, create_ledger_root

pytestmark = pytest.mark.slow
RAY = str(Path(sys.executable).with_name("ray"))


def free_ports(k: int) -> list[int]:
    """``k`` distinct ports, free now, all held until every one is chosen."""
    socks = [socket.socket() for _ in range(k)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


_WORKER_RANGES = iter(range(20000, 32000, 50))


def free_worker_range(width: int = 21) -> int:
    """The first port of ``width`` free ports below the kernel's ephemeral range (32768-60999), so
    the ports ``free_ports`` hands to the other node can never fall among this node's workers."""
    for first in _WORKER_RANGES:
        try:
            held = []
            for port in range(first, first + width):
                s = socket.socket()
                held.append(s)
                s.bind(("127.0.0.1", port))
            return first
        except OSError:
            continue
        finally:
            for s in held:
                s.close()
    raise AssertionError("no free worker port range below 32000")


def start_node(tmp: Path, name: str, settings: Path, head_port: int | None) -> subprocess.Popen:
    """``ray start --block`` in its own process group (stopped by group id, nothing else), with a
    short temp dir of its own (Ray's socket paths must stay under 108 bytes)."""
    temp_dir = tempfile.mkdtemp(prefix=f"ffray-{name}-", dir="/tmp")
    p = free_ports(9)
    workers = free_worker_range()
    args = [
        RAY,
        "start",
        "--block",
        "--node-ip-address=127.0.0.1",
        "--num-cpus=1",
        f"--resources={json.dumps({name: 1})}",
        f"--node-manager-port={p[0]}",
        f"--object-manager-port={p[1]}",
        f"--dashboard-agent-listen-port={p[2]}",
        f"--dashboard-agent-grpc-port={p[3]}",
        f"--metrics-export-port={p[4]}",
        f"--runtime-env-agent-port={p[5]}",
        f"--min-worker-port={workers}",
        f"--max-worker-port={workers + 20}",
        "--disable-usage-stats",
    ]
    if head_port is None:
        args += ["--head", f"--port={p[7]}", "--include-dashboard=false", f"--ray-client-server-port={p[8]}"]
    else:
        args += [f"--address=127.0.0.1:{head_port}"]
    args += [f"--temp-dir={temp_dir}"]
    env = {
        **os.environ,
        "FEDFILTER_DEVICE_SETTINGS": str(settings),
        "RAY_USAGE_STATS_ENABLED": "0",
        "OMP_NUM_THREADS": "1",
        "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "1",  # two nodes, both on 127.0.0.1
    }
    with open(tmp / f"{name}.log", "w") as log:  # the node writes to its own copy of the descriptor
        proc = subprocess.Popen(args, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    proc.head_port = p[7]  # type: ignore[attr-defined]
    proc.temp_dir = temp_dir  # type: ignore[attr-defined]
    return proc


def wait_for_port(proc: subprocess.Popen, port: int, log: Path, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while True:
        if proc.poll() is not None:
            raise AssertionError(f"ray start exited: {log.read_text()[-2000:]}")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        if time.monotonic() > deadline:
            raise AssertionError(f"ray head not listening after {timeout} s: {log.read_text()[-2000:]}")
        time.sleep(0.5)


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)  # the group this test started, by its id
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
    shutil.rmtree(proc.temp_dir, ignore_errors=True)  # type: ignore[attr-defined]


def start_head(tmp: Path, settings: Path) -> subprocess.Popen:
    """The head node, listening. Its ports are free when chosen but not held until Ray binds them, so
    on a loaded machine (other tests starting servers at the same time) one may be taken in between:
    one more attempt with fresh ports, and the node's own log if that fails too."""
    for attempt in (1, 2):
        head = start_node(tmp, "nodeA", settings, None)
        try:
            wait_for_port(head, head.head_port, tmp / "nodeA.log")  # type: ignore[attr-defined]
            return head
        except AssertionError:
            stop(head)
            if attempt == 2:
                raise
    raise AssertionError("unreachable")


def joined(ray, node: subprocess.Popen, timeout: float) -> bool:
    """Whether a second node is alive in the cluster within ``timeout`` seconds (False at once if
    its ``ray start`` exited)."""
    deadline = time.monotonic() + timeout
    while len([n for n in ray.nodes() if n["Alive"]]) < 2:
        if node.poll() is not None or time.monotonic() > deadline:
            return False
        time.sleep(0.5)
    return True


def ledger_path(root: Path, name: str) -> str:
    """Where a device's ledger lives (the check reads settings and the root, never the ledger)."""
    return str(root / name)


def test_two_ray_nodes_whose_ledger_roots_differ_are_refused(tmp_path):
    ray = pytest.importorskip("ray")
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy  # noqa: F401 (needs ray)

    from fedfilter.client.settings.simulated import with_device_settings

    root_a, root_b, shared = tmp_path / "root-a", tmp_path / "root-b", tmp_path / "shared"
    for r in (root_a, root_b, shared):
        create_ledger_root(r)
    local = tmp_path / "local"  # the same path on both nodes, no identity: node-local ledgers
    settings = {}
    for name, root in (("nodeA", root_a), ("nodeB", root_b)):
        entries = {
            "0": {"ledger-dir": ledger_path(root, "dev0"), "budget-epsilon": 1.0, "reply-hold-s": 0},
            "1": {"ledger-dir": str(shared / "dev1"), "budget-epsilon": 1.0, "reply-hold-s": 0},
            "2": {"ledger-dir": str(local / "dev2"), "budget-epsilon": 1.0, "reply-hold-s": 0},
        }
        settings[name] = tmp_path / f"{name}.json"
        settings[name].write_text(json.dumps(entries))

    head = start_head(tmp_path, settings["nodeA"])
    other = None
    try:
        ray.init(address=f"127.0.0.1:{head.head_port}", log_to_driver=False)  # type: ignore[attr-defined]
        # A loaded machine can lose the joining node's start (a port taken between choice and bind):
        # one more attempt with fresh ports, and the node's own log if that fails too.
        for attempt in (1, 2):
            other = start_node(tmp_path, "nodeB", settings["nodeB"], head.head_port)  # type: ignore[attr-defined]
            if joined(ray, other, timeout=90):
                break
            log = (tmp_path / "nodeB.log").read_text()[-3000:]
            stop(other)
            other = None
            assert attempt == 1, f"the second Ray node did not join; its log ends:\n{log}"
        settings_on = ray.remote(num_cpus=0)(with_device_settings)

        def on(node: str, pid: int):
            return settings_on.options(resources={node: 0.01}).remote({"partition-id": pid})

        # shared root: both nodes serve partition 1 from the one ledger
        assert ray.get(on("nodeA", 1))["ledger-dir"] == ray.get(on("nodeB", 1))["ledger-dir"]
        # differing roots: the first node's root is registered, the second refuses
        assert ray.get(on("nodeA", 0))["ledger-dir"] == str(root_a / "dev0")
        with pytest.raises(Exception, match="partition-id 0 was served from another ledger") as err:
            ray.get(on("nodeB", 0))
        assert "LedgerRootError" in repr(err.value) or "split between nodes" in str(err.value)
        # node-local ledgers at the same path on both nodes: refused as well
        ray.get(on("nodeB", 2))
        with pytest.raises(Exception, match="partition-id 2 was served from another ledger"):
            ray.get(on("nodeA", 2))
    finally:
        ray.shutdown()
        if other is not None:
            stop(other)
        stop(head)


def test_outside_ray_nothing_is_checked_and_ray_is_not_started(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # as if never imported
    check_ledger_root(0, tmp_path / "dev0")  # no error, no Ray
    root = tmp_path / "r"
    ident = create_ledger_root(root)
    assert create_ledger_root(root) == ident  # idempotent
    (root / "ledger-root.json").write_text('{"ledger_root_id": "not hex"}')
    from fedfilter.client.settings.ledger_root import ledger_root_id

    with pytest.raises(LedgerRootError, match="not one create_ledger_root wrote"):
        ledger_root_id(root / "dev0")
