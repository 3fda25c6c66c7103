"""The SecAgg+ placement: what ``individual_filter_mod`` does in the stage where Flower's
``secaggplus_mod`` masks its reply.

``secure_aggregation_mod`` builds a ``SecAggPlacement`` from the SecAgg+ state it holds and installs it
for exactly its call of the inner handler in that stage (``client/round/placement.py``); the filter
reads it once and calls only its methods. Everything SecAgg+-specific about a round is here: the
request must be ``distributed`` (a ``local`` float report would be mangled by Flower's quantizer), the
coordinator's SecAgg+ setup must pass the device's rule (``check_secagg_state``) and give the noise
grid, the device's filter must be ``rdp`` and its worst-case account must exist, every model array
is released as Skellam noise on the grid, and the reply is the one layout ``secaggplus_mod`` reads.

Each check raises ``RoundSpecError`` with a refusal code before anything is trained or spent.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any, cast

import numpy as np
from flwr.app import ConfigRecord, Context, Message, RecordDict

from fedfilter.client.ledger.budget import BudgetLedger
from fedfilter.client.mechanisms.skellam import SkellamGrid, SkellamMechanism, skellam_grid
from fedfilter.client.release import Release, require_worst_case_budget
from fedfilter.client.round.admitted import AdmittedRound, MechanismFor
from fedfilter.client.round.placement import Placement, installed_placement
from fedfilter.client.round.refusal import refusal
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

__all__ = ["SecAggPlacement", "reply_masked", "secagg_round_grid", "masked_report_content", "SECAGG_STATE_RECORD"]

SECAGG_STATE_RECORD = RECORD_KEY_STATE  # context.state: secaggplus_mod's saved protocol state


@dataclass(frozen=True)
class SecAggPlacement(Placement):
    """The placement of a round whose reply SecAgg+ masks (installed by ``secure_aggregation_mod`` only).

    Parameters
    ----------
    state : mapping or None
        ``secaggplus_mod``'s saved state as the masked stage found it (``None``: there was none).

    Examples
    --------
    >>> from fedfilter.protocol.request import RoundSpec, RoundSpecError
    >>> try:
    ...     SecAggPlacement(None).mechanism_for(RoundSpec("run", 1, 1.0, 1.0, "distributed", 2), ClientPolicy())
    ... except RoundSpecError as err:
    ...     print(err.code)
    secagg-setup
    """

    state: Mapping[str, Any] | None

    distributed = True

    @classmethod
    def from_context(cls, context: Context) -> SecAggPlacement:
        """The placement for the masked stage, from the SecAgg+ state ``context.state`` holds.

        Parameters
        ----------
        context : Context
            The node's context in the masked stage.

        Examples
        --------
        >>> from flwr.app import RecordDict
        >>> SecAggPlacement.from_context(Context(run_id=1, node_id=2, node_config={}, state=RecordDict(),
        ...                                      run_config={})).state is None
        True
        """
        record = context.state.get(SECAGG_STATE_RECORD)
        return cls(dict(record) if isinstance(record, ConfigRecord) else None)

    def refuse_message(self, msg: Message) -> Message | None:
        """Nothing to refuse: ``secure_aggregation_mod`` has checked the stage and set SecAgg+'s configs aside.

        Parameters
        ----------
        msg : Message
            The train message.

        Returns
        -------
        None
            Always: the message goes on.

        Examples
        --------
        >>> import time
        >>> from flwr.app import Metadata
        >>> meta = Metadata(run_id=1, message_id="m", src_node_id=1, dst_node_id=2, reply_to_message_id="",
        ...                 group_id="1", created_at=time.time(), ttl=60.0, message_type="train")
        >>> print(SecAggPlacement(None).refuse_message(Message(RecordDict(), metadata=meta)))
        None
        """
        return None

    def mechanism_for(self, spec: RoundSpec, policy: ClientPolicy) -> MechanismFor:
        """Skellam noise on the grid the coordinator's SecAgg+ setup gives (``secagg_round_grid``).

        Parameters
        ----------
        spec : RoundSpec
            The coordinator's request (``check_request`` passed it).
        policy : ClientPolicy
            The owner's rules (its limits on the SecAgg+ graph).

        Returns
        -------
        callable
            Arrays to their ``SkellamMechanism`` (``SkellamMechanism.for_update`` on the round's grid).

        Examples
        --------
        >>> try:  # no SecAgg+ state: refused before any training
        ...     SecAggPlacement(None).mechanism_for(RoundSpec("run", 1, 1.0, 1.0, "distributed", 2), ClientPolicy())
        ... except RoundSpecError as err:
        ...     print(err.code)
        secagg-setup
        """
        return partial(SkellamMechanism.for_update, spec, secagg_round_grid(spec, self.state, policy))

    def check_ledger(self, ledger: BudgetLedger) -> None:
        """Skellam releases are accounted by the rdp filter, and a distributed round needs a worst-case budget.

        Parameters
        ----------
        ledger : BudgetLedger
            The device's ledger, held for this round.

        Examples
        --------
        >>> import tempfile
        >>> from pathlib import Path
        >>> from fedfilter.client.ledger.owner_state import owner_state_at
        >>> from fedfilter.client.settings.node_config import enrol_device
        >>> with tempfile.TemporaryDirectory() as root, owner_state_at(Path(root) / "owner"):
        ...     enrol_device({"ledger-dir": root + "/dev", "budget-epsilon": 4.0, "filter": "gdp"})
        ...     ledger = BudgetLedger.open(root + "/dev")
        ...     try:
        ...         SecAggPlacement(None).check_ledger(ledger)
        ...     except RoundSpecError as err:
        ...         print(err.code)
        ...     ledger.close()
        filter-not-rdp
        """
        if ledger.filter.kind != "rdp":
            raise RoundSpecError(
                "round request refused: distributed (Skellam) releases are accounted by the rdp filter; "
                f"this device's filter is {ledger.filter.kind!r}.",
                code="filter-not-rdp",
            )
        require_worst_case_budget(ledger)

    def released(self, admitted: AdmittedRound, update: list[np.ndarray]) -> list[np.ndarray]:
        """Every model array in order (SecAgg+ sums them all; an integer buffer's update is zero).

        Parameters
        ----------
        admitted : AdmittedRound
            The round.
        update : list of numpy.ndarray
            ``returned - received``.

        Returns
        -------
        list of numpy.ndarray
            ``update`` itself, integer buffers included.

        Examples
        --------
        >>> SecAggPlacement(None).released(None, [np.ones(2), np.array(0)])  # the round is not read here
        [array([1., 1.]), array(0)]
        """
        return list(update)

    def reply(self, msg: Message, admitted: AdmittedRound, release: Release) -> Message:
        """The legacy layout ``secaggplus_mod`` masks; a device that left answers with an error instead
        (``secaggplus_mod`` cannot mask one, so the device drops out of the SecAgg+ round).

        Parameters
        ----------
        msg : Message
            The train message.
        admitted : AdmittedRound
            The round.
        release : Release
            The round's release (the encoded report).

        Returns
        -------
        Message
            The ``fitres.*`` content for ``secaggplus_mod``, or the ``left`` refusal.

        Examples
        --------
        >>> import time
        >>> from flwr.app import Metadata
        >>> meta = Metadata(run_id=1, message_id="m", src_node_id=1, dst_node_id=2, reply_to_message_id="",
        ...                 group_id="1", created_at=time.time(), ttl=60.0, message_type="train")
        >>> left = Release("left", None, 0.0, 0.0, np.zeros(1), np.zeros(1), None)
        >>> SecAggPlacement(None).reply(Message(RecordDict(), metadata=meta), None, left).error.reason[:16]
        'fedfilter[left]:'
        """
        if release.status == "left" or release.arrays is None:
            return refusal(msg, "left", "this device's budget is spent and it leaves (after-exhaustion='leave').")
        return Message(masked_report_content(release.arrays), reply_to=msg)


def reply_masked() -> bool:
    """True inside ``secure_aggregation_mod``'s masked stage: the reply being built will be masked by
    SecAgg+ (its arrays never reach the coordinator in the clear).

    Examples
    --------
    >>> reply_masked()
    False
    """
    return isinstance(installed_placement(), SecAggPlacement)


def secagg_round_grid(spec: RoundSpec, state: Mapping[str, Any] | None, policy: ClientPolicy) -> SkellamGrid:
    """The checks of a request under SecAgg+, before any training; ``RoundSpecError`` names the value.

    Only ``distributed`` is served, the coordinator's SecAgg+ setup (``state``) must make Flower's map
    exact and release only sums of at least ``min_reports`` on a graph within the owner's ``policy``
    (``check_secagg_state``), and the request's numbers must give a usable grid (``skellam_grid``).

    Parameters
    ----------
    spec : RoundSpec
        The coordinator's request.
    state : mapping or None
        ``secaggplus_mod``'s saved state.
    policy : ClientPolicy
        The owner's rules.

    Examples
    --------
    >>> from fedfilter.protocol.secagg.grid import secaggplus_settings
    >>> spec = RoundSpec("run", 1, 1.0, 1.0, "local", 2)
    >>> try:
    ...     secagg_round_grid(spec, None, ClientPolicy())
    ... except RoundSpecError as err:
    ...     print(err.code)
    secagg-placement
    """
    if spec.placement != "distributed":
        raise RoundSpecError(
            f"round request refused: placement={spec.placement!r} is refused under secure aggregation "
            "(SecAgg+ would quantize a float report); a masked round needs placement='distributed'.",
            code="secagg-placement",
        )
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
    they are all that reaches the coordinator in the clear.

    Parameters
    ----------
    report : list of numpy.ndarray
        The encoded report, one array per model array.

    Examples
    --------
    >>> sorted(masked_report_content([np.zeros(2)]).keys())[:2]
    ['fitres.metrics', 'fitres.num_examples']
    """
    fitres = FitRes(
        status=Status(code=Code.OK, message="Success"),
        parameters=ndarrays_to_parameters([np.asarray(a, dtype=np.float64) for a in report]),
        num_examples=1,
        metrics={},
    )
    return fitres_to_recorddict(fitres, keep_input=True)
