"""Which Flower strategies the wrapper may wrap: the inner aggregate must be a weighted mean.

``IndividualFilterStrategy`` hands its inner strategy one reply per released round (the plain mean of
the noisy reports, weight 1). A strategy whose aggregate is a weighted mean of the replies means
exactly what it says then; any other would silently become a plain-mean step, so it is refused with
what it would have done. The inner summary's "Weighted by: 'num-examples'" line is rewritten while
the wrapper prints it (no reply here carries an example count). ``inner_step`` is that one reply
and the inner strategy's step from it, returned in the model's keys, shapes and dtypes.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from copy import copy

import numpy as np
from flwr.app import Array, ArrayRecord, Message, MetricRecord, RecordDict
from flwr.serverapp import strategy as flwr_strategies
from flwr.serverapp.strategy import Strategy

from fedfilter.protocol.rules import model_step
from fedfilter.protocol.wire import ARRAYS_RECORD

# The weight of the one reply the inner strategy gets: a constant, never an example count.
AGGREGATE_WEIGHT = 1

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
    """Why ``strategy`` cannot be wrapped (a Flower strategy whose aggregate is not a mean), or ``None``.

    Parameters
    ----------
    strategy : flwr.serverapp.strategy.Strategy
        The strategy to wrap.

    Returns
    -------
    str or None
        What the strategy would do instead and what to use, or ``None`` if it may be wrapped.

    Examples
    --------
    >>> from flwr.serverapp.strategy import FedAvg, FedMedian
    >>> check_inner_strategy(FedAvg()) is None
    True
    >>> print(check_inner_strategy(FedMedian()))  # doctest: +ELLIPSIS
    the inner strategy FedMedian takes the coordinate-wise median of the replies; ...
    """
    for name, what in NOT_A_MEAN.items():
        cls = getattr(flwr_strategies, name, None)
        if isinstance(cls, type) and isinstance(strategy, cls):
            return (
                f"the inner strategy {type(strategy).__name__} {what}; wrapped, it would get one reply per "
                f"round (the released plain mean of the noisy reports) and mean something else: {USE_INSTEAD}."
            )
    return None


def is_mean_strategy(strategy: Strategy) -> bool:
    """Whether the inner aggregate_train is one of Flower's weighted means (not overridden).

    Parameters
    ----------
    strategy : flwr.serverapp.strategy.Strategy
        The inner strategy.

    Returns
    -------
    bool
        Whether its ``aggregate_train`` is that of ``FedAvg``, ``FedAvgM``, ``FedProx`` or the ``FedOpt`` family.

    Examples
    --------
    >>> from flwr.serverapp.strategy import FedAvg, FedMedian
    >>> is_mean_strategy(FedAvg()), is_mean_strategy(FedMedian())
    (True, False)
    """
    own = type(strategy).aggregate_train
    return any(
        own is getattr(getattr(flwr_strategies, name, None), "aggregate_train", None) for name in MEAN_STRATEGIES
    )


class NoExampleWeights(logging.Filter):
    """Rewrites the inner summary's "Weighted by: 'num-examples'": no reply here carries a count.

    Examples
    --------
    >>> record = logging.LogRecord("flwr", logging.INFO, "", 0, "Weighted by: '%s'", ("num-examples",), None)
    >>> NoExampleWeights().filter(record), record.getMessage()
    (True, '\\t\\t├── Weighted by: nothing (fedfilter: one reply, the plain mean of the valid reports)')
    """

    def filter(self, record: logging.LogRecord) -> bool:
        """Rewrite ``record`` if it is the "Weighted by" line; let every record through.

        Parameters
        ----------
        record : logging.LogRecord
            A record of Flower's logger.

        Returns
        -------
        bool
            Always ``True`` (nothing is suppressed).

        Examples
        --------
        >>> record = logging.LogRecord("flwr", logging.INFO, "", 0, "Rounds: %d", (3,), None)
        >>> NoExampleWeights().filter(record), record.getMessage()
        (True, 'Rounds: 3')
        """
        if isinstance(record.msg, str) and "Weighted by" in record.msg:
            record.msg = "\t\t├── Weighted by: nothing (fedfilter: one reply, the plain mean of the valid reports)"
            record.args = ()
        return True


def inner_step(
    strategy: Strategy,
    server_round: int,
    carrier: Message,
    keys: Sequence[str],
    template: Sequence[np.ndarray],
    mean: Sequence[np.ndarray],
) -> ArrayRecord:
    """The inner strategy's step from the released aggregate: one reply, ``global + mean``, weight 1.

    The inner strategy sees what the round releases (the public release), not the reports one by
    one: in distributed placement a single report carries only 1/sqrt(m) of the accounted noise,
    and user code in the inner strategy may log what it gets. ``global + mean`` is the round rule
    ``model_step`` with rate 1, so FedAvg's result is the plain mean step bitwise (its weighted
    mean of one reply multiplies by exactly 1.0) and FedAvgM, FedAdam, FedYogi, ... apply their
    server step to the mean update. Per-client aggregators (median, Krum, trimmed mean) would see
    one reply and mean something else: the wrapper refuses them (``NOT_A_MEAN``).

    Parameters
    ----------
    strategy : flwr.serverapp.strategy.Strategy
        The inner strategy (a mean strategy).
    server_round : int
        The round.
    carrier : flwr.app.Message
        A message whose metadata the one reply borrows (it is left untouched).
    keys : sequence of str
        The model's array keys, in order.
    template : sequence of numpy.ndarray
        The global model's arrays.
    mean : sequence of numpy.ndarray
        The released mean update.

    Returns
    -------
    flwr.app.ArrayRecord
        The new global model, in the model's keys, shapes and dtypes.

    Examples
    --------
    >>> import time
    >>> from flwr.app import Metadata
    >>> from flwr.serverapp.strategy import FedAvg
    >>> meta = Metadata(run_id=1, message_id="m", src_node_id=7, dst_node_id=0, reply_to_message_id="q",
    ...                 group_id="1", created_at=time.time(), ttl=60.0, message_type="train")
    >>> new = inner_step(FedAvg(), 1, Message(RecordDict(), metadata=meta), ["w"],
    ...                  [np.ones(3, np.float32)], [np.full(3, 0.5, np.float32)])
    >>> new["w"].numpy()
    array([1.5, 1.5, 1.5], dtype=float32)
    """
    weight_key = getattr(strategy, "weighted_by_key", "num-examples")
    stepped = model_step(template, mean, 1.0)
    content = RecordDict(
        {
            ARRAYS_RECORD: ArrayRecord({k: Array(np.array(w, order="C")) for k, w in zip(keys, stepped)}),
            "metrics": MetricRecord({weight_key: AGGREGATE_WEIGHT}),
        }
    )
    # Flower's strategies read a reply's metadata only to log errors; the carrier's (a reply, or in
    # distributed rounds an instruction: no single reply exists) will do. A shallow copy with new
    # content leaves the carrier itself untouched.
    released = copy(carrier)
    released.content = content
    arrays, _ = strategy.aggregate_train(server_round, [released])
    if arrays is None:
        raise RuntimeError(f"the inner strategy {strategy!r} returned no arrays for a released aggregate.")
    return _in_model_dtypes(arrays, keys, template)


def _in_model_dtypes(arrays: ArrayRecord, keys: Sequence[str], template: Sequence[np.ndarray]) -> ArrayRecord:
    """The inner result with the model's keys, shapes and dtypes (optimizers may upcast to float64)."""
    if list(arrays.keys()) != list(keys):
        raise RuntimeError(f"the inner strategy returned keys {list(arrays.keys())}, not the model's {list(keys)}.")
    out = {}
    for key, like in zip(keys, template):
        a = arrays[key].numpy()
        if a.shape != like.shape:
            raise RuntimeError(f"the inner strategy returned {key!r} with shape {a.shape}, not {like.shape}.")
        if not np.issubdtype(like.dtype, np.floating):
            a = np.rint(a)  # a weighted mean of equal integers can land a rounding error below them
        out[key] = Array(np.array(a, dtype=like.dtype, order="C"))
    return ArrayRecord(out)
