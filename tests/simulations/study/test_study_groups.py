"""Groups of clients in a dropout study: shares, accuracies and exhaustion rounds, by hand."""

import numpy as np
import pytest

from fedfilter.simulations.study.groups import make_grouping


def _client(labels):
    y = np.asarray(labels, dtype=np.int64)
    return np.zeros((len(y), 2), np.float32), y


def test_label_groups_weigh_each_class_by_its_examples():
    data = [_client([0, 0, 0, 1]), _client([1, 1]), _client([0, 2])]
    g = make_grouping("label", data, num_classes=4)
    assert g.names == ["0", "1", "2"]  # class 3 has no training data
    alive = np.array([False, True, True])
    # class 0: 3 of its 4 examples are held by client 0, who is out -> 1/4 left
    assert g.share(alive) == pytest.approx([1 / 4, 2 / 3, 1.0])
    assert g.accuracy({"0": 0.5, "1": 0.25, "2": 1.0, "3": 0.0}, ["a", "b", "c"]) == {"0": 0.5, "1": 0.25, "2": 1.0}


def test_size_groups_are_quartiles_of_the_uncapped_data():
    capped = [_client([0] * 5) for _ in range(8)]  # the study trains on at most 5 examples each
    full = [10, 20, 30, 40, 50, 60, 70, 80]
    g = make_grouping("size", capped, num_classes=1, full_sizes=full)
    assert g.names == ["Q1 (10-20 examples)", "Q2 (30-40 examples)", "Q3 (50-60 examples)", "Q4 (70-80 examples)"]
    assert g.engine_group_by == "client"
    ids = [f"w{i}" for i in range(8)]
    acc = g.accuracy({f"w{i}": i / 10 for i in range(8)}, ids)
    assert acc["Q1 (10-20 examples)"] == pytest.approx(0.05)  # equal capped sizes: plain mean
    assert g.share(np.arange(8) % 2 == 0) == pytest.approx([0.5] * 4)


def test_exhaustion_summary_first_and_weighted_median():
    data = [_client([0] * 3), _client([0]), _client([0]), _client([1])]
    g = make_grouping("label", data, num_classes=2)
    s = g.exhaustion_summary(np.array([2, 5, -1, -1]), rounds=10)
    # class 0 weights 3, 1, 1: exhaustion rounds 2, 5, never -> first 2, weighted median 2
    assert s["0"] == {"first_exhausted_round": 2, "median_exhausted_round": 2, "weight": 5.0, "clients": 3}
    assert s["1"]["first_exhausted_round"] is None and s["1"]["median_exhausted_round"] is None
