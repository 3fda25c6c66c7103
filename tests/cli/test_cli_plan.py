"""``fedfilter plan``: its JSON for the quickstart example's case, its text, and the app's parameter count."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from fedfilter.cli import main

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "quickstart-pytorch"
ISSUE_24 = ["--devices", "10", "--params", "62006", "--noise-multiplier", "1", "--clip", "1"]
BUDGET = ["--epsilon", "8", "--delta", "1e-5", "--rounds", "50"]


def _json(capsys, argv):
    assert main(["plan", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_plan_json_for_the_quickstart_and_its_recommendation(capsys):
    out = _json(capsys, ISSUE_24 + BUDGET)
    assert abs(out["mean_noise_norm"] / math.sqrt(62006 / 10) - 1) < 0.05 and out["noise_dominates"] is True
    rec = out["recommended"]
    argv = ["--devices", str(rec["devices"]), "--params", "62006", "--noise-multiplier", str(rec["noise_multiplier"])]
    again = _json(capsys, argv + ["--clip", str(rec["clip"])] + BUDGET)
    assert again["noise_dominates"] is False and again["fits_budget"] is True


def test_plan_text_gives_the_verdict_and_what_to_change(capsys):
    assert main(["plan", *ISSUE_24, *BUDGET]) == 0
    text = capsys.readouterr().out
    assert "Verdict: the released mean is mostly noise" in text
    assert "more devices per round" in text and "distributed placement" in text
    assert "fedfilter plan --devices" in text  # the recommended settings, as a command


def test_app_dir_counts_the_examples_model():
    from fedfilter.cli.plan import app_model_parameters

    # The digits CNN of examples/quickstart-pytorch, layer by layer (weights + biases).
    by_hand = (1 * 6 * 9 + 6) + (6 * 16 * 9 + 16) + (64 * 120 + 120) + (120 * 84 + 84) + (84 * 10 + 10)
    assert app_model_parameters(EXAMPLE, None) == by_hand == 19_754


def test_plan_needs_exactly_one_model_size_and_names_bad_values(capsys):
    assert main(["plan", "--devices", "3", "--noise-multiplier", "1", "--clip", "1", *BUDGET]) == 2
    assert "--params D or --app-dir DIR" in capsys.readouterr().err
    assert main(["plan", "--devices", "0", "--params", "5", "--noise-multiplier", "1", "--clip", "1", *BUDGET]) == 2
    assert "devices must be an integer >= 1. Found 0." in capsys.readouterr().err


def test_app_dir_without_a_model_says_how_to_name_it(tmp_path, capsys):
    (tmp_path / "pyproject.toml").write_text(
        '[tool.flwr.app.components]\nserverapp = "nopkg.server_app:app"\nclientapp = "nopkg.client_app:app"\n'
    )
    argv = ["plan", "--devices", "3", "--app-dir", str(tmp_path), "--noise-multiplier", "1", "--clip", "1", *BUDGET]
    assert main(argv) == 2
    assert "--model MODULE:CALLABLE" in capsys.readouterr().err


@pytest.mark.parametrize("model", ["nocolon", ":Net"])
def test_a_malformed_model_is_named(tmp_path, model):
    from fedfilter.cli.plan import app_model_parameters

    (tmp_path / "pyproject.toml").write_text("")
    with pytest.raises(ValueError, match="MODULE:CALLABLE"):
        app_model_parameters(tmp_path, model)
