"""What an inner strategy means once wrapped: refused unless its aggregate is a weighted mean, and said.

The wrapper hands the inner strategy one reply per round (the released plain mean, weight 1), so a
strategy that aggregates by anything but a weighted mean (median, trimmed mean, Krum, ...) would run
silently as a plain-mean step. Each Flower strategy is classified here by reading what it does.
"""

from __future__ import annotations

import inspect
import logging
from pathlib import Path

import pytest
from flwr.common.logger import FLOWER_LOGGER
from flwr.serverapp import strategy as flwr_strategies
from flwr.serverapp.strategy import FedAdam, FedAvg, FedAvgM, FedProx, FedYogi

from fedfilter.coordinator.inner_strategy import MEAN_STRATEGIES, NOT_A_MEAN
from fedfilter.coordinator.strategy import IndividualFilterStrategy


def _wrap(inner, **kw):
    return IndividualFilterStrategy(inner, noise_multiplier=1.0, clip=1.0, **kw)


def _inner(name: str):
    cls = getattr(flwr_strategies, name)
    if name.startswith("DifferentialPrivacy"):
        kwargs = {"noise_multiplier": 0.1, "num_sampled_clients": 10}
        if "Fixed" in name:
            kwargs["clipping_norm"] = 1.0
        return cls(FedAvg(), **kwargs)
    if name == "QFedAvg":
        return cls(client_learning_rate=0.1)
    return cls()


class _Lines(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.lines: list[tuple[int, str]] = []

    def emit(self, record):
        self.lines.append((record.levelno, record.getMessage()))


@pytest.fixture
def flwr_log():
    handler = _Lines()
    FLOWER_LOGGER.addHandler(handler)
    yield handler
    FLOWER_LOGGER.removeHandler(handler)


def test_every_flower_strategy_is_classified():
    # A strategy a new Flower release adds must be judged (mean or not) before it can be wrapped silently.
    names = {
        n for n, c in vars(flwr_strategies).items() if inspect.isclass(c) and issubclass(c, flwr_strategies.Strategy)
    }
    assert names - {"Strategy"} <= set(NOT_A_MEAN) | set(MEAN_STRATEGIES), (
        names - set(NOT_A_MEAN) - set(MEAN_STRATEGIES)
    )


@pytest.mark.parametrize("name", sorted(n for n in NOT_A_MEAN if hasattr(flwr_strategies, n)))
def test_an_inner_strategy_that_is_not_a_mean_is_refused_with_why_and_what_to_use(name):
    with pytest.raises(ValueError) as err:
        _wrap(_inner(name))
    text = str(err.value)
    assert name in text and NOT_A_MEAN[name] in text and "wrap FedAvg" in text


def test_a_subclass_of_a_refused_strategy_is_refused_too():
    class MyMedian(flwr_strategies.FedMedian):
        pass

    with pytest.raises(ValueError, match="MyMedian takes the coordinate-wise median"):
        _wrap(MyMedian())


@pytest.mark.parametrize("inner", [FedAvg(), FedAvgM(), FedProx(), FedAdam(), FedYogi()])
def test_mean_strategies_are_wrapped_without_a_warning(inner, flwr_log):
    _wrap(inner)
    assert not [m for level, m in flwr_log.lines if level >= logging.WARNING]


def test_a_custom_aggregate_is_wrapped_with_a_warning_that_says_what_it_gets(flwr_log):
    class Custom(FedAvg):
        def aggregate_train(self, server_round, replies):
            return super().aggregate_train(server_round, replies)

    _wrap(Custom())
    warnings = [m for level, m in flwr_log.lines if level >= logging.WARNING]
    assert len(warnings) == 1 and "Custom" in warnings[0] and "one reply per round" in warnings[0]


def test_the_summary_says_no_example_weights_and_refuses_client_evaluation_once_at_start(tmp_path, flwr_log):
    strategy = _wrap(FedAvg(fraction_evaluate=1.0), public_ledger="relative.db")
    strategy.summary()
    text = "\n".join(m for _, m in flwr_log.lines)
    assert "num-examples" not in text and "Weighted by: nothing" in text
    assert "Minimum available nodes" in text  # the rest of the inner summary is kept
    refusals = [(lvl, m) for lvl, m in flwr_log.lines if "client-side evaluation is refused" in m]
    assert len(refusals) == 1 and refusals[0][0] == logging.WARNING and "fraction_evaluate=1.0" in refusals[0][1]
    # Where the app writes its public ledger, as an absolute path (deploy-local reads it from the log).
    assert f"Public ledger: {Path('relative.db').resolve()}" in text
    assert strategy.configure_evaluate(1, None, None, None) == []  # type: ignore[arg-type]
    assert len([m for _, m in flwr_log.lines if "client-side evaluation is refused" in m]) == 1
    # The filter is gone afterwards: Flower's own summaries print as before.
    FedAvg().summary()
    assert any("Weighted by: 'num-examples'" in m for _, m in flwr_log.lines)
