"""Benchmark scripts, each run as a subprocess at a tiny size: it finishes and what it prints says sane things.

One parametrized test; a case is a script, its small arguments and a check of what it printed (some
checks run the script once more, e.g. to reprint a table from the results the first run wrote).
What a script computes is tested in the library it calls (e.g. the MNIST driver in
tests/simulations/reproduce/test_reproduce_mnist.py); here only that the script, as a user runs it, works.
Sizes are the ones the scripts' own tests used before they were gathered here.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from helpers.tiny_study import TINY_STUDY

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "benchmarks"


def run(script: str, *args, timeout: float = 240) -> str:
    """The script's stdout; its return code must be 0 (stdout and stderr in the failure otherwise)."""
    proc = subprocess.run(
        [sys.executable, str(BENCH / script), *map(str, args)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert proc.returncode == 0, f"{script} {args} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
    return proc.stdout


def rows_of(text: str) -> list[list[str]]:
    """The body rows of every markdown table in ``text`` (header and |---| lines dropped), as cells."""
    lines = [l for l in text.splitlines() if l.startswith("|")]
    body = [
        l
        for i, l in enumerate(lines)
        if not set(l) <= set("|-") and not (i + 1 < len(lines) and set(lines[i + 1]) <= set("|-"))
    ]
    return [[c.strip() for c in l.strip().strip("|").split("|")] for l in body]


def mean_n(cell: str) -> tuple[float, int]:
    """``'76.52 ± 0.00 (n=1)'`` or ``'18.86 (n=1)'`` -> (76.52, 1)."""
    m = re.fullmatch(r"(-?\d+\.\d+)(?: ± \d+\.\d+)? \(n=(\d+)\)", cell)
    assert m, f"not 'mean [± std] (n=N)': {cell!r}"
    return float(m.group(1)), int(m.group(2))


# --- one check per case: (tmp_path) -> None, running the script itself ------------------------------
def study_dropout(tmp_path: Path) -> None:
    cfg = tmp_path / "tiny.toml"
    cfg.write_text(TINY_STUDY)
    out = tmp_path / "study"
    text = run("study_dropout.py", "--config", cfg, "--out", out, "--no-progress")
    assert text.startswith("machine: ")
    wall = re.search(r"^wall time: (\d+\.\d) s \(of which (\d+\.\d) s the runs", text, re.M)
    assert wall and 0 < float(wall.group(2)) <= float(wall.group(1)) + 0.1
    for name in ("results.json", "report.md"):
        assert (out / name).is_file()

    rows = rows_of(text)
    assert len(rows) == 2  # one per run: noise-only and leave
    assert [r[0] for r in rows] == ["1", "2"]
    results = json.loads((out / "results.json").read_text())
    assert [r[1] for r in rows] == [run["label"] for run in results["runs"]]
    for r in rows:
        assert len(r) == 12 and int(r[2]) == 12  # clients
        with_budget, contributing, seen = int(r[4]), int(r[5]), int(r[6])
        assert 0 <= contributing <= seen <= 12 and with_budget <= 12
        released, rounds = map(int, r[8].split("/"))
        assert rounds == 4 and 0 <= released <= rounds
        accs = [float(a) for a in r[9].split(" / ")]
        assert len(accs) == 3 and all(0.0 <= a <= 1.0 for a in accs)
        assert accs[1] >= max(accs[0], accs[2])  # peak
    # Budgets: two-level draws at level 0.5 are 0.5 and 20; nobody spends more than their own.
    assert [r[3] for r in rows] == ["0.5 [0.5, 20]"] * 2
    m = re.search(
        r"^budgets: max share of a budget spent (\d+\.\d+) \(<= 1\); "
        r"every client within its budget in (\d+)/(\d+) runs$",
        text,
        re.M,
    )
    assert m and 0 < float(m.group(1)) <= 1.0 + 1e-9 and m.group(2) == m.group(3) == "2"

    again = run("study_dropout.py", "--from", out)
    assert again.splitlines()[0] == text.splitlines()[0]  # the machine, recorded beside results.json
    table = lambda t: t[t.index(f"study {results['study']}") :]
    assert table(again) == table(text)  # --from prints the same table, from results.json alone


def reproduce_mnist(tmp_path: Path) -> None:
    """The script is the driver's command line (fedfilter.simulations.reproduce.mnist_runs, tested
    in process by tests/simulations/reproduce/test_reproduce_mnist.py)."""
    usage = run("reproduce_mnist.py", "--help")
    assert "Section 5.1 (MNIST" in usage and all(flag in usage for flag in ("--park", "--todo", "--write-table"))


def reproduce_adult(tmp_path: Path) -> None:
    # Stand-in tuning results: one grid point per eps (k = 3 steps), so --run needs no --tune.
    tune = [
        {"epsilon": eps, "clip": 1.0, "eta": 2.0, "k": 3, "sigma": 0.0, "seed": 0, "val_accuracy": 0.8, "seconds": 0.0}
        for eps in (0.3, 0.5, 1.2)
    ]
    (tmp_path / "adult_tune.jsonl").write_text("".join(json.dumps(r) + "\n" for r in tune))
    log = run("reproduce_adult.py", "--run", "--trials", 1, "--n-train", 1000, "--results", tmp_path)
    assert log.count(" trial 0: GD ") == 9  # 3 eps x 3 variants
    runs = [json.loads(l) for l in (tmp_path / "adult.jsonl").read_text().splitlines()]
    assert len(runs) == 9
    for r in runs:
        assert r["n_train"] == 1000 and r["setting"]["k"] >= 3
        assert r["max_spent_epsilon"] <= r["setting"]["filter_epsilon"]
        assert 0.0 <= r["gd_test_accuracy"] <= 1.0 and 0.0 <= r["filtered_test_accuracy"] <= 1.0

    text = run("reproduce_adult.py", "--table", "--results", tmp_path)
    rows = rows_of(text)
    assert [r[0] for r in rows] == ["0.3", "0.5", "1.2"]
    for r in rows:
        m = re.fullmatch(r"1, 2, 3 \((\d+\.\d)\)", r[1])
        assert m and float(m.group(1)) > 0  # the chosen (C, eta, k) and its sigma
        for cell in (r[4], r[5]):
            acc, n = mean_n(cell)
            assert n == 1 and 0.0 <= acc <= 100.0
        k_a, gd_a, f_a = r[6].split(" / ")
        assert int(k_a) >= 3 and all(0.0 <= mean_n(c)[0] <= 100.0 for c in (gd_a, f_a))
        sigma_b, gd_b, f_b = r[7].split(" / ")
        assert float(sigma_b) > 0 and all(0.0 <= mean_n(c)[0] <= 100.0 for c in (gd_b, f_b))


def engine_throughput(tmp_path: Path) -> None:
    text = run(
        "engine_throughput.py", "--clients", 300, "--steps", 1, "--warmup", 0, "--threads", 1, "--chunk-size", 128
    )
    assert re.search(r"^machine: .*; 300 clients, chunk 128, 1 reps$", text, re.M)
    rows = rows_of(text)
    assert [r[0] for r in rows] == [
        "plain batched forward + backward",
        "per-example gradients, torch.func",
        "engine step, norms=fast",
        "engine step, norms=vectorised",
        "engine step, norms=device",
    ]
    for r in rows:
        seconds, per_60000, ratio = float(r[1]), float(r[2]), float(r[3])
        assert seconds >= 0 and per_60000 == pytest.approx(seconds * 200, abs=0.01 * 200 + 1e-9) and ratio > 0
    assert rows[0][3] == "1.00"
    assert re.search(r"^fastest engine mode: \w+, \d+\.\d+ x batched", text, re.M)


def engine_throughput_json(tmp_path: Path) -> None:
    args = ("--clients", 256, "--steps", 1, "--threads", 1, "--chunk-size", 128, "--modes", "fast", "vectorised")
    doc = json.loads(run("engine_throughput.py", *args, "--json"))
    assert set(doc["seconds_per_step"]) == {"batched", "torch.func", "engine[fast]", "engine[vectorised]"}
    assert doc["ratio_to_batched"] == min(doc["ratios"]["engine[fast]"], doc["ratios"]["engine[vectorised]"])
    assert doc["ratio_to_batched"] > 0 and doc["clients"] == 256 and doc["threads"] == 1
    assert doc["fallback"] == {}


def worst_case_epsilon(tmp_path: Path) -> None:
    """One device, two distributed rounds: both accounts spent, the worst case within m x epsilon."""
    out = run("worst_case_epsilon.py", "--epsilons", "8", "--min-reports", "10", "--dim", "100", "--max-rounds", "2")
    last = [line for line in out.splitlines() if line.startswith("|")][-1]  # one row, after |---:| lines
    eps, m, worst, rounds, _main, alone, _stopped = (c.strip() for c in last.strip("|").split("|"))
    assert (eps, m, worst, rounds) == ("8", "10", "80", "2")
    assert 0 < float(alone) <= 80


def flower_stages(tmp_path: Path) -> None:
    """The stage profiler of the filtered path names every stage (digits, a few rounds, no Ray); a
    stage whose function is gone or no longer called stops the script, so this fails with its name."""
    out = run("flower_stages.py", "--task", "digits", "--rounds", 5, "--ledger-root", tmp_path, timeout=300)
    assert "digits: 5 rounds" in out and "mod wall time" in out
    stages = ("seal write", "roll-back anchor write", "roll-back anchor check", "transaction (BEGIN IMMEDIATE")
    for stage in (*stages, "noise (ChaCha20", "reply building", "clipping"):
        assert stage in out, out
    assert list(tmp_path.iterdir()) == []  # the device's ledger is removed afterwards


def sparse_queries(tmp_path: Path) -> None:
    out = run("sparse_queries.py", "--users", 200, "--days", 40, "--seeds", 1, timeout=60)
    assert "answered: worst case" in out
    assert out.count("\n| ") >= 7


def odometer_compare(tmp_path: Path) -> None:
    """docs/results.md shows what the script prints; every row: filter readout <= each odometer, and
    Rogers et al. (2016) Theorem 6.5 (pure-DP steps through Lemma 3.3) above the gdp one."""
    out = run("odometer_compare.py", timeout=120)
    assert out.strip() in (ROOT / "docs" / "results.md").read_text()
    rows = [line.split("|")[1:-1] for line in out.splitlines() if line.startswith("| ") and line[2].isdigit()]
    assert len(rows) == 8
    for row in rows:
        spent, gdp, rdp, thm = (float(x) for x in row[3:])
        assert spent < gdp < thm and spent < rdp


def secagg_overhead(tmp_path: Path) -> None:
    """Flower's SecAgg+ workflow and client mod in-process (3 clients); the script checks every
    unmasked sum against the clients' integer reports itself (it raises otherwise)."""
    out, prof = tmp_path / "rows.json", tmp_path / "round.prof"
    text = run("secagg_overhead.py", "--clients", 3, "--rounds", 1, "--warmup", 0, "--json", out, "--profile", prof)
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
    assert row["primitive_s_per_round"]["client check_tags"] > 0
    assert row["unmasked_sums_checked"] == 2  # the timed and the profiled round, each equal to the reports' sum
    assert row["primitive_s_per_round"]["client create_shares"] > 0
    assert row["primitive_s_per_round"]["server combine_shares"] > 0
    # --profile: the extra secure round's stats, and its own time split by where the code lives
    assert prof.stat().st_size > 0 and "one secure round under cProfile" in text
    assert re.search(r"#\s+\d+\.\d+ s\s+\d+\.\d% {2}Flower records", text)


def secagg_accuracy(tmp_path: Path) -> None:
    """Both placements on the engine (6 clients, 2 rounds): no client spent more than its budget."""
    text = run(
        "secagg_accuracy.py",
        *("--clients", 6, "--epsilons", 2, "--rounds", 2, "--eval-every", 1, "--out", tmp_path),
    )
    payload = json.loads((tmp_path / "secagg_accuracy.json").read_text())
    assert payload["distributed_mechanism"] in text
    runs = {r["placement"]: r for r in payload["runs"]}
    assert set(runs) == {"local", "distributed"}
    for one in runs.values():
        assert 0 <= one["final_accuracy"] <= 1 and len(one["accuracy"]) == 2
        assert 0 < one["max_spent_fraction"] <= 1 + 1e-9
    assert (tmp_path / "secagg_accuracy.png").stat().st_size > 1000


@dataclass(frozen=True)
class Case:
    check: Callable[[Path], None]
    slow: bool = False  # imports torch and Flower in a subprocess: 35 to 55 s on two loaded cores


def fl_vs_flower_dp_noise(tmp_path: Path) -> None:
    """Every client asked and the noise removed: Flower's DP wrapper (a) and the engine's central placement
    (f) release the same models (the same test loss to 1e-6); (b), snapped to the SecAgg+ grid, nearly."""
    settings = ("--smoke", "--clients-per-round", 10, "--budgets", "equal", "--eval-every", 1, "--rounds", 3)
    text = run("fl_vs_flower_dp_noise.py", "--noise-free", "--arms", "abf", "--", *settings)
    (a, b, f) = rows_of(text)
    assert [a[1][:3], b[1][:3], f[1][:3]] == ["(a)", "(b)", "(f)"]
    loss_a, loss_b, loss_f = (float(row[3]) for row in (a, b, f))
    assert loss_f == pytest.approx(loss_a, rel=1e-6) and a[4] == f[4]
    assert loss_b == pytest.approx(loss_f, rel=0.05)
    scaled = rows_of(run("fl_vs_flower_dp_noise.py", "--f-scale", 2, "--", *settings))
    assert len(scaled) == 1 and scaled[0][1].startswith("(f)") and float(scaled[0][3]) != loss_f
    draws = rows_of(run("fl_vs_flower_dp_noise.py", "--draws", 2, "--arms", "af", "--", *settings))
    assert [row[1].split(",")[1].strip() for row in draws] == ["fl-vs-flower-draw-1", "fl-vs-flower-draw-2"] * 2
    assert len({row[3] for row in draws[:2]}) == 2 and len({row[3] for row in draws[2:]}) == 2  # other draws


def mnist_population(tmp_path: Path) -> None:
    """300 single-example devices, every one asked, each sampling itself at epsilon 8: the plan's z is
    one SecAgg+'s range admits (and 1% more is refused by the device's check), no device overspends,
    and the table reprints the run."""
    from helpers.secagg_range import device_admits

    out = tmp_path / "population"
    args = ("--population", 300, "--epsilon", 8, "--steps", 4, "--eval-every", 2, "--out", out)
    text = run("mnist_population.py", "--arm", "sampled", *args)
    assert re.search(r"^step 4/4: test \d\.\d{4}, kept \d+ a step", text, re.M), text
    (row,) = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert row["asked"] == 300 and row["asks"] == 4 and 0 < row["rate"] <= 1
    assert 0 < row["mean_kept"] <= 300 and row["max_spent_epsilon"] <= 8.0 * (1 + 1e-9)
    assert row["noise_multiplier"] <= row["secagg_limit"]
    limit, m = row["secagg_limit"], row["min_reports"]
    assert device_admits(limit, asked=300, min_reports=m) and not device_admits(limit * 1.01, asked=300, min_reports=m)
    *_, cells = rows_of(run("mnist_population.py", "--table", "--out", out))  # the last row: the run
    assert cells[:3] == ["8", "sampled", "300"] and cells[-1] == "0.97"


CASES = [
    Case(mnist_population),
    Case(study_dropout),
    Case(reproduce_mnist),
    Case(reproduce_adult),
    Case(engine_throughput),
    Case(engine_throughput_json),
    Case(worst_case_epsilon),
    Case(flower_stages),
    Case(sparse_queries),
    Case(odometer_compare),
    Case(secagg_overhead, slow=True),
    Case(secagg_accuracy, slow=True),
    Case(fl_vs_flower_dp_noise, slow=True),
]


@pytest.mark.timeout(600)
@pytest.mark.parametrize(
    "case", [pytest.param(c, id=c.check.__name__, marks=[pytest.mark.slow] if c.slow else []) for c in CASES]
)
def test_benchmark_script_runs_small(case: Case, tmp_path):
    case.check(tmp_path)
