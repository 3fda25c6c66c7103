"""The README's planning lines, run as written: the plan command, the strategy built from its plan,
and every number the README quotes beside them, read back from the plan itself."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

from flwr.serverapp.strategy import FedAvg

from fedfilter import IndividualFilterStrategy

README = Path(__file__).resolve().parents[2] / "README.md"


def _section() -> str:
    text = README.read_text(encoding="utf-8")
    start = text.index("### Plan the federation; let the clip adapt")
    return text[start : text.index("\n## ", start)]


def _blocks(section: str, language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", section, flags=re.S)


def test_the_readme_plan_runs_as_written_and_its_numbers_are_the_plans(tmp_path):
    section = _section()
    (command,) = _blocks(section, "bash")
    argv = shlex.split(command.replace("\\\n", " "))
    assert argv[0] == "fedfilter" and argv[-2:] == [">", "plan.json"]
    done = subprocess.run(
        [sys.executable, "-m", "fedfilter", *argv[1:-2]], cwd=tmp_path, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    (tmp_path / "plan.json").write_text(done.stdout, encoding="utf-8")
    plan = json.loads(done.stdout)["strategy"]

    (code,) = _blocks(section, "python")
    namespace = {"IndividualFilterStrategy": IndividualFilterStrategy, "FedAvg": FedAvg}
    cwd = Path.cwd()
    try:
        os.chdir(tmp_path)
        exec(code, namespace)  # noqa: S102 - the README's own line
    finally:
        os.chdir(cwd)
    strategy = namespace["strategy"]
    assert strategy.noise_multiplier == plan["noise_multiplier"]
    assert strategy.min_reports == plan["min_reports"] and strategy.placement == plan["placement"]
    assert strategy.adaptive_clipping is not None
    assert strategy.participation is not None and strategy.participation.mode == "balanced"

    prose = " ".join(section.split())
    asks = plan["participation"]["asks_planned"]
    assert f"at most {asks} times in {plan['participation']['rounds']} rounds" in prose
    assert f"at noise multiplier {plan['noise_multiplier']:g}" in prose
    assert f"at least {plan['min_reports']} reports" in prose
    assert f"probability {plan['dropout']['abort_probability']:.2g}" in prose
    assert plan["budget"]["pays_for_planned_asks"] is True
