"""The audit's files: ``audit.json`` (the result), ``audit_trials.npz`` (every trial's scores,
clipped norms and probe features, per model dtype) and ``audit.png`` (the figure)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

RESULT_FILE, TRIALS_FILE, FIGURE_FILE = "audit.json", "audit_trials.npz", "audit.png"


def trial_arrays(run: Any) -> dict[str, np.ndarray]:
    """One dtype's trials as named arrays: both worlds' scores, clipped norms, probe features."""
    from fedfilter.audit.game import probe_table, scores

    s0, s1 = scores(run)
    noise_only, contributing = probe_table(run)
    out = {"score_no_data": s0, "score_canary": s1, "clipped_norms": run.weights}
    out.update({f"noise_only_{k}": v for k, v in noise_only.items()})
    out.update({f"contributing_{k}": v for k, v in contributing.items()})
    return out


def write_outputs(result: dict, runs: dict[str, Any], out: Path) -> list[Path]:
    """Write the result, the trials of every dtype in ``runs`` and the figure into ``out``."""
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
