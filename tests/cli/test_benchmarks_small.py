"""Every benchmark script, run as a subprocess at a tiny size: it finishes and its table says sane things.

The sparse-query benchmark has its own (tests/simulations/test_sparse_queries.py::test_benchmark_prints_table).
Sizes are chosen so that the four together take well under a minute on two loaded cores.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.tiny_study import TINY_STUDY

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "benchmarks"


def _run(script: str, *args, timeout: float = 120) -> str:
    proc = subprocess.run(
        [sys.executable, str(BENCH / script), *map(str, args)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert proc.returncode == 0, f"{script} {args} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
    return proc.stdout


def _rows(text: str) -> list[list[str]]:
    """The body rows of every markdown table in ``text`` (header and |---| lines dropped), as cells."""
    lines = [l for l in text.splitlines() if l.startswith("|")]
    body = [
        l
        for i, l in enumerate(lines)
        if not set(l) <= set("|-") and not (i + 1 < len(lines) and set(lines[i + 1]) <= set("|-"))
    ]
    return [[c.strip() for c in l.strip().strip("|").split("|")] for l in body]


def _mean_n(cell: str) -> tuple[float, int]:
    """``'76.52 ± 0.00 (n=1)'`` or ``'18.86 (n=1)'`` -> (76.52, 1)."""
    m = re.fullmatch(r"(-?\d+\.\d+)(?: ± \d+\.\d+)? \(n=(\d+)\)", cell)
    assert m, f"not 'mean [± std] (n=N)': {cell!r}"
    return float(m.group(1)), int(m.group(2))


def test_study_dropout_prints_the_runs_table_and_reprints_it_from_results(tmp_path):
    cfg = tmp_path / "tiny.toml"
    cfg.write_text(TINY_STUDY)
    out = tmp_path / "study"
    text = _run("study_dropout.py", "--config", cfg, "--out", out, "--no-progress")
    assert text.startswith("machine: ")
    wall = re.search(r"^wall time: (\d+\.\d) s \(of which (\d+\.\d) s the runs", text, re.M)
    assert wall and 0 < float(wall.group(2)) <= float(wall.group(1)) + 0.1
    for name in ("results.json", "report.md"):
        assert (out / name).is_file()

    rows = _rows(text)
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

    again = _run("study_dropout.py", "--from", out)
    assert again.splitlines()[0] == text.splitlines()[0]  # the machine, recorded beside results.json
    table = lambda t: t[t.index(f"study {results['study']}") :]
    assert table(again) == table(text)  # --from prints the same table, from results.json alone


SMALL_CELL = ["--n-train", "300", "--cells", "0.3:subopt-clip:paper", "--threads", "1"]


@pytest.fixture(scope="module")
def small_mnist_cell(tmp_path_factory):
    """One straight run of a 300-client cell through the driver: ``(results JSONL, driver log)``.
    Read-only for the tests that share it (the cell is 84 steps; running it once saves ~10 s)."""
    out = tmp_path_factory.mktemp("mnist_small") / "mnist.jsonl"
    return out, _run("reproduce_mnist.py", *SMALL_CELL, "--out", out)


def test_reproduce_mnist_small_cell_and_table(small_mnist_cell, tmp_path):
    out, log = small_mnist_cell
    assert log.startswith("machine: ") and "=== done: GD" in log
    (row,) = [json.loads(l) for l in out.read_text().splitlines()]
    assert row["n_train"] == 300 and row["setting"]["regime"] == "subopt-clip"
    assert row["max_spent_epsilon"] <= row["setting"]["filter_epsilon"]
    assert all(0.0 <= a <= 1.0 for a in (row["gd_test_accuracy"], row["filtered_test_accuracy"]))

    assert not list((out.parent / "checkpoints").glob("*.npz"))  # deleted once the row is stored

    text = _run("reproduce_mnist.py", "--table", "--n-table", 300, "--out", out)
    rows = _rows(text)
    assert len(rows) == 9  # 3 regimes x 3 eps
    filled = [r for r in rows if r[3] != "-"]
    assert len(filled) == 1 and filled[0][0] == "0.3"
    assert text.index("**subopt-clip**") < text.index(filled[0][3]) < text.index("**subopt-noise**")
    gd, n = _mean_n(filled[0][3])
    assert n == 1 and 0.0 <= gd <= 100.0 and abs(gd - 100 * row["gd_test_accuracy"]) < 0.006
    assert abs(_mean_n(filled[0][4])[0] - 100 * row["filtered_test_accuracy"]) < 0.006
    assert "Privacy check: in all 1 runs every client's spent epsilon is at most its filter's budget" in text
    for r in rows:  # the paper's columns are always there
        assert all(0 < _paper <= 100 for _paper in (float(r[1].split(" ± ")[0]), float(r[2].split(" ± ")[0])))

    png = tmp_path / "mnist.png"
    assert _run("reproduce_mnist.py", "--plot", png, "--n-table", 300, "--out", out).startswith("wrote ")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000

    # --write-table replaces exactly the marked block of a document, and nothing around it.
    doc = tmp_path / "results.md"
    start, end = "<!-- mnist-table: python benchmarks/reproduce_mnist.py --table -->", "<!-- /mnist-table -->"
    doc.write_text(f"before\n{start}\nstale table\n{end}\nafter\n")
    _run("reproduce_mnist.py", "--write-table", doc, "--n-table", 300, "--out", out)
    written = doc.read_text()
    assert written.startswith(f"before\n{start}\n") and written.endswith(f"\n{end}\nafter\n")
    assert "stale table" not in written and text.strip() in written

    # --todo lists every run the issue asks for (3 trials of the paper's columns at eps 0.3, 1 of
    # every other column: 9 + 6 + 18 = 33) except the one stored, and sums the steps left.
    todo = _run("reproduce_mnist.py", "--todo", "--n-table", 300, "--out", out, "--step-seconds", 10, "--workers", 1)
    runs = _rows(todo)
    assert len(runs) == 32 and ["0.3", "subopt-clip", "paper", "0"] not in [r[:4] for r in runs]
    assert ["0.3", "subopt-clip", "paper", "1"] in [r[:4] for r in runs]
    left = sum(int(r[5]) for r in runs)
    assert f"32 runs, {left} steps left: about {left * 10 / 3600:.1f} h" in todo


class _Stop(Exception):
    pass


def _driver():
    import importlib.util

    spec = importlib.util.spec_from_file_location("reproduce_mnist_driver", BENCH / "reproduce_mnist.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_a_parked_cell_resumes_in_a_fresh_work_tree_with_the_same_row(small_mnist_cell, tmp_path, monkeypatch, capsys):
    """A cell stopped halfway and parked (--park), then run again after its working checkpoints are
    gone (a new session's fresh work tree): it resumes from the parked step and stores the same row
    as a run that was never stopped; the parked file goes once the row is stored."""
    import fedfilter.simulations.reproduce.private_gd as private_gd

    driver = _driver()
    cell = [*SMALL_CELL, "--checkpoint-every", "2"]
    straight, parked = small_mnist_cell[0], tmp_path / "mnist.jsonl"

    real = private_gd.run_cell

    def stopped_at_step_7(*a, log=None, **kw):
        def stop(message):
            if message.startswith("step 7/"):
                raise _Stop

        return real(*a, log=stop, **kw)

    monkeypatch.setattr(private_gd, "run_cell", stopped_at_step_7)
    with pytest.raises(_Stop):
        driver.main([*cell, "--out", str(parked)])
    monkeypatch.setattr(private_gd, "run_cell", real)
    assert not parked.exists()
    capsys.readouterr()
    driver.main(["--park", "--out", str(parked)])
    (name,) = [p.name for p in (parked.parent / "parked").glob("*.npz")]
    assert f"parked {parked.parent / 'parked' / name} at step 6" in capsys.readouterr().out
    driver.main(["--park", "--out", str(parked)])  # parking again copies nothing
    assert "already at step 6" in capsys.readouterr().out

    shutil.rmtree(parked.parent / "checkpoints")  # what a fresh work tree lacks
    driver.main(["--todo", "--n-table", "300", "--out", str(parked)])  # counts the parked steps as done
    assert "| 0.3 | subopt-clip | paper | 0 | 84 | 78 | step 6," in capsys.readouterr().out
    driver.main([*cell, "--out", str(parked)])
    log = capsys.readouterr().out
    assert "resume 0.3 subopt-clip paper trial 0 from " in log and "(step 6)" in log
    assert "resumed from " in log and "after step 6" in log
    assert not list((parked.parent / "parked").glob("*.npz"))  # served: removed with the row stored
    (a,), (b,) = ([json.loads(l) for l in p.read_text().splitlines()] for p in (straight, parked))
    varies = ("seconds", "seconds_per_step", "machine", "finished_at")
    assert {k: v for k, v in a.items() if k not in varies} == {k: v for k, v in b.items() if k not in varies}


def test_reproduce_mnist_fast_mode_is_its_own_row(small_mnist_cell, tmp_path):
    """--norms fast reruns a stored cell as a separate row, leaves the old row as it was, and is
    tabulated apart; on the same noise seed it lands next to the vectorised run."""
    src, _ = small_mnist_cell
    out = tmp_path / "mnist.jsonl"
    shutil.copyfile(src, out)
    before = out.read_text()
    log = _run("reproduce_mnist.py", *SMALL_CELL, "--norms", "fast", "--out", out)
    assert "=== done: GD" in log and "skip" not in log
    assert out.read_text().startswith(before)  # the old row untouched
    old, new = [json.loads(l) for l in out.read_text().splitlines()]
    assert (
        old.get("norms", "vectorised") == "vectorised" and new["norms"] == "fast" and new["setting"] == old["setting"]
    )
    assert new["max_spent_epsilon"] <= new["setting"]["filter_epsilon"] and new["prefix_max_clip_deficit"] == 0.0
    assert abs(new["gd_test_accuracy"] - old["gd_test_accuracy"]) <= 0.02
    # in process from here (each driver start costs seconds): stored, skipped and tabulated apart
    driver = _driver()
    args = lambda norms: driver.argparse.Namespace(out=out, n_table=300, norms=norms)
    assert (0.3, "subopt-clip", "paper", 0, 300, "fast") in driver.done_keys(out)
    fast_rows = [r for r in _rows(driver.table(args("fast"))) if r[3] != "-"]
    assert len(fast_rows) == 1 and abs(_mean_n(fast_rows[0][3])[0] - 100 * new["gd_test_accuracy"]) < 0.006
    assert "in all 1 runs" in driver.table(args("vectorised"))  # the default table: the vectorised row only


def test_reproduce_mnist_write_table_refuses_a_document_without_markers(tmp_path):
    doc = tmp_path / "results.md"
    doc.write_text("no markers here\n")
    proc = subprocess.run(
        [
            sys.executable,
            str(BENCH / "reproduce_mnist.py"),
            "--write-table",
            str(doc),
            "--out",
            str(tmp_path / "none.jsonl"),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert proc.returncode != 0 and "no '<!-- mnist-table" in proc.stderr
    assert doc.read_text() == "no markers here\n"  # untouched


def test_reproduce_adult_small_run_and_table(tmp_path):
    # Stand-in tuning results: one grid point per eps (k = 3 steps), so --run needs no --tune.
    tune = [
        {"epsilon": eps, "clip": 1.0, "eta": 2.0, "k": 3, "sigma": 0.0, "seed": 0, "val_accuracy": 0.8, "seconds": 0.0}
        for eps in (0.3, 0.5, 1.2)
    ]
    (tmp_path / "adult_tune.jsonl").write_text("".join(json.dumps(r) + "\n" for r in tune))
    log = _run("reproduce_adult.py", "--run", "--trials", 1, "--n-train", 1000, "--results", tmp_path)
    assert log.count(" trial 0: GD ") == 9  # 3 eps x 3 variants
    runs = [json.loads(l) for l in (tmp_path / "adult.jsonl").read_text().splitlines()]
    assert len(runs) == 9
    for r in runs:
        assert r["n_train"] == 1000 and r["setting"]["k"] >= 3
        assert r["max_spent_epsilon"] <= r["setting"]["filter_epsilon"]
        assert 0.0 <= r["gd_test_accuracy"] <= 1.0 and 0.0 <= r["filtered_test_accuracy"] <= 1.0

    text = _run("reproduce_adult.py", "--table", "--results", tmp_path)
    rows = _rows(text)
    assert [r[0] for r in rows] == ["0.3", "0.5", "1.2"]
    for r in rows:
        m = re.fullmatch(r"1, 2, 3 \((\d+\.\d)\)", r[1])
        assert m and float(m.group(1)) > 0  # the chosen (C, eta, k) and its sigma
        for cell in (r[4], r[5]):
            acc, n = _mean_n(cell)
            assert n == 1 and 0.0 <= acc <= 100.0
        k_a, gd_a, f_a = r[6].split(" / ")
        assert int(k_a) >= 3 and all(0.0 <= _mean_n(c)[0] <= 100.0 for c in (gd_a, f_a))
        sigma_b, gd_b, f_b = r[7].split(" / ")
        assert float(sigma_b) > 0 and all(0.0 <= _mean_n(c)[0] <= 100.0 for c in (gd_b, f_b))


def test_engine_throughput_small():
    text = _run(
        "engine_throughput.py", "--clients", 300, "--steps", 1, "--warmup", 0, "--threads", 1, "--chunk-size", 128
    )
    assert re.search(r"^machine: .*; 300 clients, chunk 128, 1 reps$", text, re.M)
    rows = _rows(text)
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


def test_engine_throughput_json():
    doc = json.loads(
        _run(
            "engine_throughput.py",
            "--clients",
            256,
            "--steps",
            1,
            "--threads",
            1,
            "--chunk-size",
            128,
            "--modes",
            "fast",
            "vectorised",
            "--json",
        )
    )
    assert set(doc["seconds_per_step"]) == {"batched", "torch.func", "engine[fast]", "engine[vectorised]"}
    assert doc["ratio_to_batched"] == min(doc["ratios"]["engine[fast]"], doc["ratios"]["engine[vectorised]"])
    assert doc["ratio_to_batched"] > 0 and doc["clients"] == 256 and doc["threads"] == 1
    assert doc["fallback"] == {}


def test_reproduce_mnist_skips_a_cell_another_worker_holds(tmp_path):
    import fcntl

    out = tmp_path / "mnist.jsonl"
    lock = tmp_path / "checkpoints" / "mnist_0.3_subopt-clip_paper_t0_n300_relu.lock"
    lock.parent.mkdir()
    with open(lock, "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        log = _run(
            "reproduce_mnist.py", "--n-train", 300, "--cells", "0.3:subopt-clip:paper", "--out", out, "--threads", 1
        )
    assert "skip 0.3 subopt-clip paper trial 0: running in another process" in log
    assert "=== done" not in log and not out.exists()


def test_reproduce_mnist_privacy_check_names_a_run_over_budget():
    import importlib.util

    spec = importlib.util.spec_from_file_location("reproduce_mnist_report", BENCH / "reproduce_mnist_report.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    row = lambda spent, deficit, trial: {
        "setting": {"epsilon": 0.3, "regime": "tuned", "variant": "paper", "filter_epsilon": 0.3},
        "trial": trial,
        "max_spent_epsilon": spent,
        "prefix_max_clip_deficit": deficit,
    }
    assert mod.privacy_check([row(0.3, 0.0, 0)]).startswith("Privacy check: in all 1 runs")
    failed = mod.privacy_check([row(0.3, 0.0, 0), row(0.30000000000000004, 0.0, 1), row(0.2, 1e-9, 2)])
    assert failed.startswith("**Privacy check FAILED**")
    assert "['eps 0.3 tuned paper #1']" in failed and "['eps 0.3 tuned paper #2']" in failed
    assert "#0" not in failed


def test_worst_case_epsilon_small():
    """One device, two distributed rounds: both accounts spent, the worst case within m x epsilon."""
    out = _run("worst_case_epsilon.py", "--epsilons", "8", "--min-reports", "10", "--dim", "100", "--max-rounds", "2")
    last = [line for line in out.splitlines() if line.startswith("|")][-1]  # one row, after |---:| lines
    eps, m, worst, rounds, _main, alone, _stopped = (c.strip() for c in last.strip("|").split("|"))
    assert (eps, m, worst, rounds) == ("8", "10", "80", "2")
    assert 0 < float(alone) <= 80
