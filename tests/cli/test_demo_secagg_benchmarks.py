"""The two benchmarks of distributed noise over SecAgg+, run as subprocesses at a tiny size.

``secagg_overhead.py`` runs Flower's SecAgg+ workflow and client mod in-process (3 clients) and
checks every unmasked sum against the clients' integer reports itself (it raises otherwise);
``secagg_accuracy.py`` runs both placements on the engine (6 clients, 2 rounds) and checks that no
client spent more than its budget. Here: they finish, and what they write says sane things.
Marked slow: each imports torch and Flower in a subprocess (35 to 55 s each on two loaded cores).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "benchmarks"

pytestmark = pytest.mark.slow


def _run(script: str, *args, timeout: float = 240) -> str:
    proc = subprocess.run(
        [sys.executable, str(BENCH / script), *map(str, args)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert proc.returncode == 0, f"{script} {args} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
    return proc.stdout


@pytest.mark.timeout(300)
def test_secagg_overhead_times_both_variants_and_checks_every_unmasked_sum(tmp_path):
    out = tmp_path / "rows.json"
    text = _run("secagg_overhead.py", "--clients", 3, "--rounds", 1, "--warmup", 0, "--json", out)
    assert "LoopbackGrid" in text and "| 3 | 2 |" in text  # 3 clients, threshold ceil(3 / 2)
    (row,) = json.loads(out.read_text())
    assert row["clients"] == 3 and row["threshold"] == 2
    assert row["plain_s_per_round"] > 0 and row["secagg_s_per_round"] > 0
    assert row["ratio"] == pytest.approx(row["secagg_s_per_round"] / row["plain_s_per_round"])
    # the product's round: Flower's four stages and the devices' consistency round
    assert row["workflow"] == "product"
    assert row["secagg_stages"] == [
        "collect_masked_vectors",
        "fedfilter_consistency_check",
        "setup",
        "share_keys",
        "unmask",
    ]
    assert row["primitive_s_per_round"]["client check_signatures"] > 0
    assert row["unmasked_sums_checked"] == 1  # the one secure round, equal to the sum of the integer reports
    assert row["primitive_s_per_round"]["client create_shares"] > 0
    assert row["primitive_s_per_round"]["server combine_shares"] > 0


@pytest.mark.timeout(300)
def test_secagg_accuracy_runs_both_placements_within_budget_and_plots(tmp_path):
    text = _run(
        "secagg_accuracy.py",
        *("--clients", 6, "--epsilons", 2, "--rounds", 2, "--eval-every", 1, "--out", tmp_path),
    )
    payload = json.loads((tmp_path / "secagg_accuracy.json").read_text())
    assert payload["distributed_mechanism"] in text
    runs = {r["placement"]: r for r in payload["runs"]}
    assert set(runs) == {"local", "distributed"}
    for run in runs.values():
        assert 0 <= run["final_accuracy"] <= 1 and len(run["accuracy"]) == 2
        assert 0 < run["max_spent_fraction"] <= 1 + 1e-9
    assert (tmp_path / "secagg_accuracy.png").stat().st_size > 1000
