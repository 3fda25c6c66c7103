"""Which Flower strategies the wrapper may wrap: the inner aggregate must be a weighted mean.

``IndividualFilterStrategy`` hands its inner strategy one reply per released round (the plain mean of
the noisy reports, weight 1). A strategy whose aggregate is a weighted mean of the replies means
exactly what it says then; any other would silently become a plain-mean step, so it is refused with
what it would have done. The inner summary's "Weighted by: 'num-examples'" line is rewritten while
the wrapper prints it (no reply here carries an example count).
"""

from __future__ import annotations

import logging

from flwr.serverapp import strategy as flwr_strategies
from flwr.serverapp.strategy import Strategy

# Flower strategies (flwr.serverapp.strategy, 1.41 and 1.42) whose aggregate is not a weighted mean of
# the replies' arrays. Wrapped, each would get the one reply a round releases (below) and silently
# become a plain-mean step: refused, with what each would have done.
_SECOND_MECHANISM = "adds Flower's central DP noise on top (a second, unaccounted mechanism)"
NOT_A_MEAN = {
    "FedMedian": "takes the coordinate-wise median of the replies",
    "FedTrimmedAvg": "takes a trimmed mean of the replies",
    "Krum": "selects the reply closest to the others",
    "MultiKrum": "averages the replies closest to the others",
    "Bulyan": "selects replies by Krum and takes a trimmed mean of them",
    "QFedAvg": "weights the replies by the clients' training losses (private, un-noised: the device drops them)",
    "FedXgbBagging": "aggregates XGBoost trees, not arrays",
    "FedXgbCyclic": "takes one client's XGBoost trees at a time",
    "DifferentialPrivacyServerSideFixedClipping": _SECOND_MECHANISM,
    "DifferentialPrivacyClientSideFixedClipping": "expects clipping by Flower's fixedclipping_mod (the device clips)",
    "DifferentialPrivacyServerSideAdaptiveClipping": _SECOND_MECHANISM,
    "DifferentialPrivacyClientSideAdaptiveClipping": "reads each client's clipping bit (a metric the device drops)",
}
# Flower's strategies whose aggregate_train is a weighted mean of the replies (FedOpt's family then
# steps a server optimizer on it): with one reply of weight 1 they mean exactly what they say.
MEAN_STRATEGIES = ("FedAvg", "FedAvgM", "FedProx", "FedOpt", "FedAdam", "FedYogi", "FedAdagrad")
USE_INSTEAD = (
    "wrap FedAvg (the plain mean of the noisy reports), or FedAvgM, FedProx, FedAdam, FedYogi or FedAdagrad "
    "(a server step on that mean); each report's influence is already bounded by the clip"
)


def check_inner_strategy(strategy: Strategy) -> str | None:
    """Why ``strategy`` cannot be wrapped (a Flower strategy whose aggregate is not a mean), or ``None``."""
    for name, what in NOT_A_MEAN.items():
        cls = getattr(flwr_strategies, name, None)
        if isinstance(cls, type) and isinstance(strategy, cls):
            return (
                f"the inner strategy {type(strategy).__name__} {what}; wrapped, it would get one reply per "
                f"round (the released plain mean of the noisy reports) and mean something else: {USE_INSTEAD}."
            )
    return None


def is_mean_strategy(strategy: Strategy) -> bool:
    """Whether the inner aggregate_train is one of Flower's weighted means (not overridden)."""
    own = type(strategy).aggregate_train
    return any(
        own is getattr(getattr(flwr_strategies, name, None), "aggregate_train", None) for name in MEAN_STRATEGIES
    )


class NoExampleWeights(logging.Filter):
    """Rewrites the inner summary's "Weighted by: 'num-examples'": no reply here carries a count."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.msg, str) and "Weighted by" in record.msg:
            record.msg = "\t\t├── Weighted by: nothing (fedfilter: one reply, the plain mean of the valid reports)"
            record.args = ()
        return True
