"""The engine's adaptive clipping and participation options, set from a study's ``[federation]`` table."""

from __future__ import annotations

import pytest
from helpers.tiny_study import TINY_STUDY

from fedfilter.simulations.study.config import StudyConfigError, parse_study
from fedfilter.simulations.study.groups import make_grouping
from fedfilter.simulations.study.runner import _load_task, run_one

OPTIONS = """participation = "balanced"
target_clipped_quantile = 0.5
clip_norm_lr = 0.2
clipped_count_stddev = 2.0
"""


def study_text(extra: str) -> str:
    text = TINY_STUDY.replace("fraction = 1.0", "fraction = 0.5")
    text = text.replace('noise = ["distributed"]', 'noise = ["local"]')
    return text.replace("[sweep]", extra + "\n[sweep]", 1)


def test_study_runs_with_adaptive_clipping_and_balanced_passes():
    study = parse_study(study_text(OPTIONS))
    run = study.runs()[0]
    task, full_sizes = _load_task(run.data)
    grouping = make_grouping(run.data.groups, task.train_data, task.num_classes, full_sizes)
    record = run_one(study, run, task, grouping)
    clips = record["clip_per_round"]
    assert len(clips) == 4 and clips[0] == 1.0 and len(set(clips)) > 1  # the clip moved


def test_adaptive_companions_need_the_target_quantile():
    with pytest.raises(StudyConfigError, match="federation.clip_norm_lr"):
        parse_study(study_text("clip_norm_lr = 0.2\n"))
    with pytest.raises(StudyConfigError, match="federation.participation"):
        parse_study(study_text('participation = "often"\n'))
