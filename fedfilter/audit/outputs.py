"""The audit's files: ``audit.json`` (the result), ``audit_trials.npz`` (every trial's scores,
clipped norms and probe features, per model dtype) and ``audit.png`` (the figure)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

RESULT_FILE, TRIALS_FILE, FIGURE_FILE = "audit.json", "audit_trials.npz", "audit.png"


def trial_arrays(run: Any) -> dict[str, np.ndarray]:
    """One dtype's trials as named arrays: both worlds' scores, clipped norms, probe features.

    Parameters
    ----------
    run : GameRun
        One dtype's game.

    Returns
    -------
    dict of str to numpy.ndarray
        ``score_no_data``, ``score_canary``, ``clipped_norms``, ``noise_only_<feature>``,
        ``contributing_<feature>``.

    Examples
    --------
    >>> from fedfilter.audit.game import GameConfig, GameRun, Trial
    >>> run = GameRun(GameConfig(epsilon=2.0), np.ones(3), [Trial(0.1, 0.6, {"bytes": 1.0}, {"bytes": 1.0})])
    >>> sorted(trial_arrays(run))
    ['clipped_norms', 'contributing_bytes', 'noise_only_bytes', 'score_canary', 'score_no_data']
    """
    from fedfilter.audit.game import probe_table, scores

    s0, s1 = scores(run)
    noise_only, contributing = probe_table(run)
    out = {"score_no_data": s0, "score_canary": s1, "clipped_norms": run.weights}
    out.update({f"noise_only_{k}": v for k, v in noise_only.items()})
    out.update({f"contributing_{k}": v for k, v in contributing.items()})
    return out


def write_outputs(result: dict, runs: dict[str, Any], out: Path) -> list[Path]:
    """Write the result, the trials of every dtype in ``runs`` and the figure into ``out``.

    Parameters
    ----------
    result : dict
        ``run_audit``'s result (without ``_runs``).
    runs : dict of str to GameRun
        Dtype -> its game (``run_audit(..., keep_runs=True)["_runs"]``).
    out : Path
        The folder (created if missing).

    Returns
    -------
    list of Path
        ``audit.json``, ``audit.png``, ``audit_trials.npz``.

    Examples
    --------
    >>> import tempfile
    >>> from fedfilter.audit.run import run_audit
    >>> result = run_audit(epsilon=2.0, delta=1e-5, trials=2, dtypes=["float32"], seed=0, reply_hold_s=0.0,
    ...                    keep_runs=True)
    >>> with tempfile.TemporaryDirectory() as d:
    ...     [p.name for p in write_outputs(result, result.pop("_runs"), Path(d))]
    ['audit.json', 'audit.png', 'audit_trials.npz']
    """
    from fedfilter.audit import report

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / RESULT_FILE).write_text(json.dumps(result, indent=1) + "\n")
    arrays: dict[str, Any] = {
        f"{dtype}_{key}": value for dtype, run in runs.items() for key, value in trial_arrays(run).items()
    }
    np.savez_compressed(out / TRIALS_FILE, **arrays)
    report.plot({**result, "_runs": runs}, out / FIGURE_FILE)
    return [out / RESULT_FILE, out / FIGURE_FILE, out / TRIALS_FILE]
