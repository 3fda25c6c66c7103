"""Kill -9 a process that spends in a loop, at random moments, and audit the ledger after each.

The spender releases a round, then appends the round and the charged mu^2 to ``released.log``
(fsync'd): that file is what an observer could have received. After every kill the audit checks
that the database is intact, that each released round is in the ledger with the charge that was
logged, and that the ledger's spent covers everything released and stays within the budget.
Used by tests/client/ledger/test_crash.py (50 kills) and benchmarks/crash_soak.py (as many as asked).

``crash_once`` kills the spender at one chosen point of a round instead (after the COMMIT, after the
seal, in the middle of the roll-back anchor's write, after it; client/ledger/anchor.py lists what each
must leave behind).
"""

from __future__ import annotations

import os
import random
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import fedfilter

# The folder that holds the fedfilter being run (a checkout or site-packages): the spender imports the same code.
REPO = Path(str(fedfilter.__file__)).resolve().parents[1]
# The child runs this module as harness.crash: the checkout for fedfilter, tests/ for the harness.
_PYTHONPATH = os.pathsep.join((str(REPO), str(Path(__file__).resolve().parents[1])))
EPSILON, DELTA = 50.0, 1e-5


CRASH_POINTS = ("after-commit", "after-seal", "mid-anchor", "after-anchor")
TORN_BYTES = 32  # what reaches the disk of the anchor slot being written when "mid-anchor" kills


def _die(*_args, **_kwargs):
    os.kill(os.getpid(), signal.SIGKILL)


def _crash_at(point: str) -> None:
    """Make the next spend kill this process at ``point`` (no cleanup runs: as a power cut)."""
    from fedfilter.client.ledger import budget as ledger

    if point == "after-commit":
        ledger.advance_seal = _die  # called right after COMMIT returned
    elif point == "after-seal":
        ledger.advance_anchor = _die
    elif point == "after-anchor":
        anchor = ledger.advance_anchor

        def anchor_then_die(*args, **kwargs):
            anchor(*args, **kwargs)
            _die()

        ledger.advance_anchor = anchor_then_die
    elif point == "mid-anchor":
        from fedfilter.client.ledger import anchor as anchor_module

        class TornOs:
            """``os`` for the anchor module, whose slot write stops after a few bytes (a torn write)."""

            def __getattr__(self, name):
                return getattr(os, name)

            @staticmethod
            def pwrite(fd, data, offset):
                os.pwrite(fd, data[:TORN_BYTES], offset)
                os.fdatasync(fd)
                _die()

        anchor_module.os = TornOs()  # type: ignore[assignment]
    else:
        raise ValueError(f"crash point must be one of {CRASH_POINTS}. Found {point!r}.")


def spender(directory: str, crash_point: str | None = None) -> None:
    import numpy as np

    from fedfilter.client.ledger.budget import BudgetLedger
    from fedfilter.client.release import FilteredClient
    from fedfilter.protocol.request import RoundSpec

    ledger = BudgetLedger.enrol(directory, client_id="crash", epsilon=EPSILON, delta=DELTA)
    if crash_point is not None:
        _crash_at(crash_point)
    client = FilteredClient(ledger)
    log = open(Path(directory) / "released.log", "a")
    start = len(ledger.records())
    print("ready", flush=True)
    rng = np.random.default_rng()
    for r in range(start, start + 1_000_000):
        update = [rng.normal(size=50).astype(np.float32) * 0.01]
        rel = client.release(RoundSpec("crash-run", r, 1.0, 1.0), update)
        log.write(f"{r} {rel.sensitivity!r}\n")  # released: the report has left the device
        log.flush()
        os.fsync(log.fileno())


def audit(directory: Path) -> tuple[int, int]:
    """Return (rounds released, rounds in the ledger); raise AssertionError on any violation."""
    from fedfilter.client.ledger.anchor import anchor_path, read_anchor_file
    from fedfilter.client.ledger.budget import BudgetLedger
    from fedfilter.client.ledger.schema import LEDGER_FILE

    conn = sqlite3.connect(directory / LEDGER_FILE)
    assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    conn.close()
    ledger = BudgetLedger.open(directory)
    records = {r.round_id: r for r in ledger.records()}
    released = []
    log = directory / "released.log"
    lines = log.read_text().splitlines(keepends=True) if log.exists() else []
    for line in lines:
        if not line.endswith("\n"):
            continue  # torn write at the kill: that report may or may not have left; still covered below
        round_text, sensitivity_text = line.split()
        released.append((int(round_text), float(sensitivity_text)))
    spent_released = 0.0
    for r, s in released:
        assert r in records, f"round {r} was released but the ledger lost its spend"
        assert records[r].sensitivity == s
        spent_released += s * s  # noise std is 1: mu_t^2 = s^2
    # Whatever left the device is covered by the roll-back anchor (a restore behind it is refused);
    # after a torn anchor write, by its readable slot (the torn one was never released).
    read = read_anchor_file(anchor_path(directory))
    assert read is not None, "records were committed but no roll-back anchor was written"
    anchor = read.anchor
    assert all(records[r].seq <= anchor.seq for r, _ in released), (anchor, released[-1:])
    state = ledger.state()
    assert state[0] >= spent_released * (1 - 1e-12), (state, spent_released)
    assert ledger.recomputed_state()[0] == state[0]
    assert state[0] <= ledger.filter.budget[0]
    ledger.close()
    return len(released), len(records)


def crash_once(directory: Path, point: str) -> int:
    """Run the spender until it kills itself at ``point`` of its first round; return the exit signal."""
    env = dict(os.environ, PYTHONPATH=_PYTHONPATH)
    proc = subprocess.run(
        [sys.executable, "-m", __name__, str(directory), point],
        stdout=subprocess.PIPE,
        env=env,
        cwd=REPO,
        timeout=120,
    )
    assert proc.stdout.strip() == b"ready", proc.stdout
    return -proc.returncode


def run_cycles(directory: Path, cycles: int, max_delay: float = 0.15, seed: int = 0) -> list[tuple[int, int]]:
    rnd = random.Random(seed)
    env = dict(os.environ, PYTHONPATH=_PYTHONPATH)
    history = []
    for _ in range(cycles):
        proc = subprocess.Popen(
            [sys.executable, "-m", __name__, str(directory)],
            stdout=subprocess.PIPE,
            env=env,
            cwd=REPO,
        )
        try:
            assert proc.stdout is not None
            line = proc.stdout.readline()
            assert line.strip() == b"ready", line
            time.sleep(rnd.uniform(0, max_delay))
        finally:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
            if proc.stdout is not None:
                proc.stdout.close()
        history.append(audit(directory))
    return history


if __name__ == "__main__":
    spender(sys.argv[1], *sys.argv[2:3])
