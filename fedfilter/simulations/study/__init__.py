"""Dropout studies: how clients run out of their individual budgets, and what it does to the model.

``fedfilter study dropout --config FILE.toml --out DIR`` (``fedfilter/cli/study.py``) loads a study
file (``config.load_study``: every problem reported at once), runs every point of its sweep through
the vectorised engine (``runner.run_study``) and writes ``DIR/results.json``, ``DIR/report.md`` and
PNG plots (``report.write_outputs``). Example files: ``simulations/configs/smoke.toml`` (minutes) and
``simulations/configs/dropout_full.toml``.
"""

from fedfilter.simulations.study.config import StudyConfigError, load_study, parse_study
from fedfilter.simulations.study.specs import StudyConfig

__all__ = ["StudyConfig", "StudyConfigError", "load_study", "parse_study"]
