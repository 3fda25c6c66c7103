"""``benchmarks/fl_vs_flower_dp_long.py --summary``: the MNIST study's table reads each arm's finished
seeds from disk, and the gaps the study is judged by are paired over the seeds both arms finished (mean,
standard error and each seed), checked here against numpy on a made-up study."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import fl_vs_flower_dp_long as long_runs  # noqa: E402


def _write(root: Path, job: str, arm: str, accuracies: dict[float, float]) -> None:
    path = root / job / "results.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    doc = json.loads(path.read_text()) if path.exists() else {"results": []}
    for eps, acc in accuracies.items():
        entry = next((e for e in doc["results"] if e["epsilon"] == eps), None)
        if entry is None:
            doc["results"].append(entry := {"epsilon": eps, "arms": {}})
        entry["arms"][arm] = {"accuracy": acc}
    path.write_text(json.dumps(doc))


def test_the_summary_pairs_each_gap_over_the_seeds_both_arms_finished(tmp_path, monkeypatch):
    monkeypatch.setattr(long_runs, "LONG", tmp_path)
    h = {0: 0.873, 1: 0.846, 2: 0.861}  # seed 2 of (g) has not finished: it is left out of the gap
    g = {0: 0.854, 1: 0.864, 3: 0.871}
    for seed, acc in h.items():
        _write(tmp_path, f"mnist-seed{seed}-sampled", "h", {1.0: acc})
    for seed, acc in g.items():
        _write(tmp_path, f"mnist-seed{seed}", "g", {1.0: acc})
    table = long_runs.summary().splitlines()
    head = [c.strip() for c in table[0].strip("|").split("|")]
    (row,) = [line for line in table[2:] if line.startswith("| 1 |")]
    cells = dict(zip(head, (c.strip() for c in row.strip("|").split("|"))))
    gaps = np.array([h[0] - g[0], h[1] - g[1]])
    mean, se = gaps.mean(), gaps.std(ddof=1) / np.sqrt(len(gaps))
    want = f"**{mean:+.3f}** ± {se:.3f} (2: {gaps[0]:+.3f} / {gaps[1]:+.3f})"
    assert cells["(h) - (g): paired mean ± s.e. (seeds: each)"] == want
    # Each arm's own column averages every seed it finished, paired or not.
    assert cells["(h) fedfilter, devices sample"].startswith(f"**{np.mean(list(h.values())):.3f}** (3: ")
    assert cells["(g) trusted, amplified"].startswith(f"**{np.mean(list(g.values())):.3f}** (3: ")
    assert cells["(h) - (g) everyone: paired mean ± s.e. (seeds: each)"] == "-"  # no seed of that arm
    # One paired seed has no standard error: the gap alone.
    _write(tmp_path, "mnist-seed0-g-everyone", "g", {1.0: 0.88})
    (row,) = [line for line in long_runs.summary().splitlines()[2:] if line.startswith("| 1 |")]
    assert row.rstrip(" |").endswith(f"{h[0] - 0.88:+.3f}")


def test_the_summary_plot_draws_every_finished_seed_and_refuses_an_empty_study(tmp_path, monkeypatch):
    monkeypatch.setattr(long_runs, "LONG", tmp_path / "long")
    with pytest.raises(FileNotFoundError, match="no finished run of the MNIST study"):
        long_runs.summary_plot(tmp_path / "none.png")
    drawn = []
    import matplotlib.axes

    original = matplotlib.axes.Axes.plot
    monkeypatch.setattr(matplotlib.axes.Axes, "plot", lambda ax, *a, **k: drawn.append(a) or original(ax, *a, **k))
    for seed, acc in {0: 0.873, 1: 0.846}.items():
        _write(tmp_path / "long", f"mnist-seed{seed}-sampled", "h", {1.0: acc, 2.0: acc + 0.03})
    long_runs.summary_plot(tmp_path / "study.png")
    assert (tmp_path / "study.png").stat().st_size > 10_000
    # One line of the means, then each epsilon's seeds as dots.
    line, dots_1, dots_2 = drawn
    assert list(line[0]) == [1.0, 2.0] and np.allclose(line[1], [np.mean([0.873, 0.846]), np.mean([0.903, 0.876])])
    assert sorted(dots_1[1]) == [0.846, 0.873] and np.allclose(sorted(dots_2[1]), [0.876, 0.903])
    # With the trusted server's seeds, the second panel puts each seed's paired gap as a dot.
    for seed, acc in {0: 0.854, 1: 0.864}.items():
        _write(tmp_path / "long", f"mnist-seed{seed}", "g", {1.0: acc})
    drawn.clear()
    long_runs.summary_plot(tmp_path / "study.png")
    gaps = [list(a[1]) for a in drawn if len(a) >= 2 and len(a[1]) == 2 and min(a[1]) < 0.5]
    assert any(np.allclose(g, [0.873 - 0.854, 0.846 - 0.864]) for g in gaps), gaps
