"""The stage profiler of the filtered path runs and names every stage (digits, a few rounds, no Ray)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "flower_stages.py"


def test_flower_stages_prints_every_stage(tmp_path):
    out = subprocess.run(
        [sys.executable, str(BENCH), "--task", "digits", "--rounds", "5", "--ledger-root", str(tmp_path)],
        check=True,
        stdout=subprocess.PIPE,
        text=True,
        timeout=300,
    ).stdout
    assert "digits: 5 rounds" in out and "mod wall time" in out
    stages = ("seal write", "roll-back anchor write", "roll-back anchor check", "transaction (BEGIN IMMEDIATE")
    for stage in (*stages, "noise (ChaCha20", "reply building", "clipping"):
        assert stage in out, out
    assert list(tmp_path.iterdir()) == []  # the device's ledger is removed afterwards
