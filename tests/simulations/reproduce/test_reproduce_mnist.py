"""The MNIST reproduction's driver (``fedfilter.simulations.reproduce.mnist_runs``, the command line of
benchmarks/reproduce_mnist.py), called in process on a 300-client cell: it stores a row per cell,
tabulates, plots and rewrites a document's marked table, lists what is left, parks and resumes a
cell, keeps fast-mode rows apart and skips a cell another worker holds.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import re
import shutil

import pytest

from fedfilter.simulations.reproduce.mnist_report import privacy_check, table
from fedfilter.simulations.reproduce.mnist_runs import done_keys, main


def driver(*args) -> str:
    """What ``python benchmarks/reproduce_mnist.py ARGS`` prints, run in this process."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        main([str(a) for a in args])
    return out.getvalue()


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


SMALL_CELL = ["--n-train", "300", "--cells", "0.3:subopt-clip:paper", "--threads", "1"]


@pytest.fixture(scope="module")
def small_mnist_cell(tmp_path_factory):
    """One straight run of a 300-client cell through the driver: ``(results JSONL, driver log)``.
    Read-only for the tests that share it (the cell is 84 steps; running it once saves ~10 s)."""
    out = tmp_path_factory.mktemp("mnist_small") / "mnist.jsonl"
    return out, driver(*SMALL_CELL, "--out", out)


def test_reproduce_mnist_small_cell_and_table(small_mnist_cell, tmp_path):
    out, log = small_mnist_cell
    assert log.startswith("machine: ") and "=== done: GD" in log
    (row,) = [json.loads(l) for l in out.read_text().splitlines()]
    assert row["n_train"] == 300 and row["setting"]["regime"] == "subopt-clip"
    assert row["max_spent_epsilon"] <= row["setting"]["filter_epsilon"]
    assert all(0.0 <= a <= 1.0 for a in (row["gd_test_accuracy"], row["filtered_test_accuracy"]))

    assert not list((out.parent / "checkpoints").glob("*.npz"))  # deleted once the row is stored

    text = driver("--table", "--n-table", 300, "--out", out)
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
    assert driver("--plot", png, "--n-table", 300, "--out", out).startswith("wrote ")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000

    # --write-table replaces exactly the marked block of a document, and nothing around it.
    doc = tmp_path / "results.md"
    start, end = "<!-- mnist-table: python benchmarks/reproduce_mnist.py --table -->", "<!-- /mnist-table -->"
    doc.write_text(f"before\n{start}\nstale table\n{end}\nafter\n")
    driver("--write-table", doc, "--n-table", 300, "--out", out)
    written = doc.read_text()
    assert written.startswith(f"before\n{start}\n") and written.endswith(f"\n{end}\nafter\n")
    assert "stale table" not in written and text.strip() in written

    # --todo lists every run the issue asks for (3 trials of the paper's columns at eps 0.3, 1 of
    # every other column: 9 + 6 + 18 = 33) except the one stored, and sums the steps left.
    todo = driver("--todo", "--n-table", 300, "--out", out, "--step-seconds", 10, "--workers", 1)
    runs = _rows(todo)
    assert len(runs) == 32 and ["0.3", "subopt-clip", "paper", "0"] not in [r[:4] for r in runs]
    assert ["0.3", "subopt-clip", "paper", "1"] in [r[:4] for r in runs]
    left = sum(int(r[5]) for r in runs)
    assert f"32 runs, {left} steps left: about {left * 10 / 3600:.1f} h" in todo


class _Stop(Exception):
    pass


def test_a_parked_cell_resumes_in_a_fresh_work_tree_with_the_same_row(small_mnist_cell, tmp_path, monkeypatch, capsys):
    """A cell stopped halfway and parked (--park), then run again after its working checkpoints are
    gone (a new session's fresh work tree): it resumes from the parked step and stores the same row
    as a run that was never stopped; the parked file goes once the row is stored."""
    import fedfilter.simulations.reproduce.private_gd as private_gd

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
        main([*cell, "--out", str(parked)])
    monkeypatch.setattr(private_gd, "run_cell", real)
    assert not parked.exists()
    capsys.readouterr()
    main(["--park", "--out", str(parked)])
    (name,) = [p.name for p in (parked.parent / "parked").glob("*.npz")]
    assert f"parked {parked.parent / 'parked' / name} at step 6" in capsys.readouterr().out
    main(["--park", "--out", str(parked)])  # parking again copies nothing
    assert "already at step 6" in capsys.readouterr().out

    shutil.rmtree(parked.parent / "checkpoints")  # what a fresh work tree lacks
    main(["--todo", "--n-table", "300", "--out", str(parked)])  # counts the parked steps as done
    assert "| 0.3 | subopt-clip | paper | 0 | 84 | 78 | step 6," in capsys.readouterr().out
    main([*cell, "--out", str(parked)])
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
    log = driver(*SMALL_CELL, "--norms", "fast", "--out", out)
    assert "=== done: GD" in log and "skip" not in log
    assert out.read_text().startswith(before)  # the old row untouched
    old, new = [json.loads(l) for l in out.read_text().splitlines()]
    assert (
        old.get("norms", "vectorised") == "vectorised" and new["norms"] == "fast" and new["setting"] == old["setting"]
    )
    assert new["max_spent_epsilon"] <= new["setting"]["filter_epsilon"] and new["prefix_max_clip_deficit"] == 0.0
    assert abs(new["gd_test_accuracy"] - old["gd_test_accuracy"]) <= 0.02
    # stored, skipped and tabulated apart
    args = lambda norms: argparse.Namespace(out=out, n_table=300, norms=norms)
    assert (0.3, "subopt-clip", "paper", 0, 300, "fast") in done_keys(out)
    fast_rows = [r for r in _rows(table(args("fast"))) if r[3] != "-"]
    assert len(fast_rows) == 1 and abs(_mean_n(fast_rows[0][3])[0] - 100 * new["gd_test_accuracy"]) < 0.006
    assert "in all 1 runs" in table(args("vectorised"))  # the default table: the vectorised row only


def test_reproduce_mnist_write_table_refuses_a_document_without_markers(tmp_path):
    doc = tmp_path / "results.md"
    doc.write_text("no markers here\n")
    with pytest.raises(SystemExit, match="no '<!-- mnist-table"):
        driver("--write-table", doc, "--out", tmp_path / "none.jsonl")
    assert doc.read_text() == "no markers here\n"  # untouched


def test_reproduce_mnist_skips_a_cell_another_worker_holds(tmp_path):
    import fcntl

    out = tmp_path / "mnist.jsonl"
    lock = tmp_path / "checkpoints" / "mnist_0.3_subopt-clip_paper_t0_n300_relu.lock"
    lock.parent.mkdir()
    with open(lock, "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        log = driver("--n-train", 300, "--cells", "0.3:subopt-clip:paper", "--out", out, "--threads", 1)
    assert "skip 0.3 subopt-clip paper trial 0: running in another process" in log
    assert "=== done" not in log and not out.exists()


def test_reproduce_mnist_privacy_check_names_a_run_over_budget():
    row = lambda spent, deficit, trial: {
        "setting": {"epsilon": 0.3, "regime": "tuned", "variant": "paper", "filter_epsilon": 0.3},
        "trial": trial,
        "max_spent_epsilon": spent,
        "prefix_max_clip_deficit": deficit,
    }
    assert privacy_check([row(0.3, 0.0, 0)]).startswith("Privacy check: in all 1 runs")
    failed = privacy_check([row(0.3, 0.0, 0), row(0.30000000000000004, 0.0, 1), row(0.2, 1e-9, 2)])
    assert failed.startswith("**Privacy check FAILED**")
    assert "['eps 0.3 tuned paper #1']" in failed and "['eps 0.3 tuned paper #2']" in failed
    assert "#0" not in failed
