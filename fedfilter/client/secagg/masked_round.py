"""The mark ``secure_aggregation_mod`` sets while Flower's ``secaggplus_mod`` runs the inner handler (the
reply will be masked), and what ``individual_filter_mod`` needs under it: the request's checks
under SecAgg+ (placement, the coordinator's SecAgg+ setup against the device's rule, the noise grid)
and the one reply layout Flower's ``secaggplus_mod`` reads.

Each check raises ``RoundSpecError`` with a refusal code before anything is trained or spent.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import cast

import numpy as np
from flwr.app import ConfigRecord, Context, RecordDict

from fedfilter.client.mechanisms.skellam import SkellamGrid, skellam_grid
from fedfilter.client.secagg.neighbourhood import check_secagg_graph, check_secagg_state
from fedfilter.client.settings.policy import ClientPolicy
from fedfilter.protocol.flower_api import (
    RECORD_KEY_STATE,
    Code,
    FitRes,
    Status,
    fitres_to_recorddict,
    ndarrays_to_parameters,
)
from fedfilter.protocol.request import RoundSpec, RoundSpecError

__all__ = ["reply_masked", "secagg_round_grid", "masked_report_content", "SECAGG_STATE_RECORD"]

SECAGG_STATE_RECORD = RECORD_KEY_STATE  # context.state: secaggplus_mod's saved protocol state

# True only while secaggplus_mod runs the inner handler (its COLLECT_MASKED_VECTORS stage).
_MASKED: ContextVar[bool] = ContextVar("fedfilter_reply_masked", default=False)


def reply_masked() -> bool:
    """True inside ``secure_aggregation_mod``'s masked stage: the reply being built will be masked by
    SecAgg+ (its arrays never reach the coordinator in the clear)."""
    return _MASKED.get()


@contextmanager
def masked() -> Iterator[None]:
    """Set the mark for exactly the inner handler's call (``secure_aggregation_mod`` only)."""
    token = _MASKED.set(True)
    try:
        yield
    finally:
        _MASKED.reset(token)


def secagg_round_grid(spec: RoundSpec, context: Context, policy: ClientPolicy) -> SkellamGrid:
    """The checks of a request under SecAgg+, before any training; ``RoundSpecError`` names the value.

    Under the mark only ``distributed`` is served (a ``local`` float report would be mangled by
    Flower's quantizer), the coordinator's SecAgg+ setup must make Flower's map exact and release
    only sums of at least ``min_reports`` on a graph within the owner's ``policy``
    (``check_secagg_state``), and the request's numbers must
    give a usable grid (``skellam_grid``).
    """
    if spec.placement != "distributed":
        raise RoundSpecError(
            f"round request refused: placement={spec.placement!r} is refused under secure aggregation "
            "(SecAgg+ would quantize a float report); a masked round needs placement='distributed'.",
            code="secagg-placement",
        )
    record = context.state.get(SECAGG_STATE_RECORD)
    state = record if isinstance(record, ConfigRecord) else None
    problems = check_secagg_state(state if state is not None else {}, int(spec.min_reports), policy.secagg_graph)
    if problems or state is None:
        # Problems of the graph alone (check_secagg_state checks it last, once the rest is sound): the
        # graph's code; any other problem with the setup: the setup's.
        graph = state is not None and problems == check_secagg_graph(state, int(spec.min_reports), policy.secagg_graph)
        raise RoundSpecError(
            "secure aggregation refused: " + " ".join(problems or ["no SecAgg+ state."]),
            code="secagg-graph" if graph else "secagg-setup",
        )
    # check_secagg_state has established that both are ints; the casts tell the type checker.
    q, n = cast(int, state["target_range"]), cast(int, state["sample_num"])
    return skellam_grid(spec, target_range=q, sample_num=n)


def masked_report_content(report: list[np.ndarray]) -> RecordDict:
    """The reply ``secaggplus_mod`` reads (the legacy ``fitres.*`` layout) and nothing else: the report
    (masked by the mod), ``num_examples = 1``, no metric, status OK. The last three are constants, and
    they are all that reaches the coordinator in the clear."""
    fitres = FitRes(
        status=Status(code=Code.OK, message="Success"),
        parameters=ndarrays_to_parameters([np.asarray(a, dtype=np.float64) for a in report]),
        num_examples=1,
        metrics={},
    )
    return fitres_to_recorddict(fitres, keep_input=True)
