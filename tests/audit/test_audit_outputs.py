"""``fedfilter audit`` writes its three files through ``fedfilter.audit.outputs`` and names them."""

import json

import numpy as np


def test_audit_writes_result_trials_and_figure_and_names_them(tmp_path, capsys):
    from fedfilter.audit.outputs import FIGURE_FILE, RESULT_FILE, TRIALS_FILE
    from fedfilter.cli import main

    out = tmp_path / "out"
    argv = ["audit", "--epsilon", "1", "--trials", "10", "--out", str(out), "--seed", "0", "--dtype", "float32"]
    assert main(argv + ["--no-progress", "--tmp-dir", str(tmp_path)]) == 0
    printed = capsys.readouterr().out
    for name in (RESULT_FILE, FIGURE_FILE, TRIALS_FILE):
        assert str(out / name) in printed
    assert "_runs" not in json.loads((out / RESULT_FILE).read_text())
    with np.load(out / TRIALS_FILE) as trials:
        assert {"float32_score_no_data", "float32_score_canary", "float32_clipped_norms"} <= set(trials.files)
        assert trials["float32_score_no_data"].shape == trials["float32_score_canary"].shape == (10,)
        assert any(key.startswith("float32_noise_only_") for key in trials.files)
        assert any(key.startswith("float32_contributing_") for key in trials.files)
