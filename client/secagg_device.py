"""The device's SecAgg+ layer: Flower's ``secaggplus_mod`` with sound masks, and the mark that tells
``individual_filter_mod`` its reply will be masked.

Usage (the order is the device's own, so the device knows its reply is masked)::

    from flwr.clientapp import ClientApp
    from fedfilter.client.flower_mod import individual_filter_mod
    from fedfilter.client.secagg_device import secure_aggregation_mod

    app = ClientApp(mods=[secure_aggregation_mod, individual_filter_mod])

What it does with each message:

* a ``train`` message carrying SecAgg+ configs (``"secaggplus_configs"``): installs the cryptographic
  mask generator in this process (``client/secagg_masks.py``; idempotent), then hands the message to
  Flower's ``secaggplus_mod``. That mod calls the inner handler only in its COLLECT_MASKED_VECTORS
  stage and then masks the reply's arrays; the ``call_next`` it gets here sets the mark
  (``reply_masked()``) for exactly that call, and removes the SecAgg+ configs record from the message
  first (the training code never sees the protocol's keys). The mark comes from this mod's own
  position in the device's mod list, never from anything the coordinator sends.
* any other ``train`` message (a local round) and every other message pass straight to
  ``call_next``, unmarked: one app serves local and distributed rounds.

If the inner handler answers with an error (a refusal, or a ``leave`` device whose budget is spent),
that error is the device's reply: ``secaggplus_mod`` cannot mask an error, and the device drops out
of the SecAgg+ round (its neighbours' key shares keep the round correct).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from contextvars import ContextVar
from typing import cast

import numpy as np
from flwr.app import Context, Error, Message, RecordDict
from flwr.app.message_type import MessageType
from flwr.client.mod import secaggplus_mod
from flwr.common import Code, FitRes, Status, ndarrays_to_parameters
from flwr.common.constant import ErrorCode
from flwr.common.secure_aggregation.secaggplus_constants import RECORD_KEY_CONFIGS, RECORD_KEY_STATE, Key, Stage
from flwr.compat.common.recorddict_compat import fitres_to_recorddict

from fedfilter.client.mod_once import once_per_message
from fedfilter.client.release import ClientPolicy, RoundSpec, RoundSpecError
from fedfilter.client.release_distributed import SkellamGrid, skellam_grid
from fedfilter.client.secagg_grid import check_secagg_state
from fedfilter.client.secagg_masks import use_cryptographic_masks

__all__ = [
    "secure_aggregation_mod",
    "reply_masked",
    "secagg_round_grid",
    "masked_report_content",
    "SECAGG_STATE_RECORD",
]

log = logging.getLogger("fedfilter.client")

SECAGG_STATE_RECORD = RECORD_KEY_STATE  # context.state: secaggplus_mod's saved protocol state

# True only while secaggplus_mod runs the inner handler (its COLLECT_MASKED_VECTORS stage).
_MASKED: ContextVar[bool] = ContextVar("fedfilter_reply_masked", default=False)


def reply_masked() -> bool:
    """True inside ``secure_aggregation_mod``'s masked stage: the reply being built will be masked by
    SecAgg+ (its arrays never reach the coordinator in the clear)."""
    return _MASKED.get()


class _InnerError(Exception):
    """Carries the inner handler's error reply out of ``secaggplus_mod`` (which cannot mask it)."""

    def __init__(self, reply: Message):
        super().__init__(reply.error.reason if reply.has_error() else "")
        self.reply = reply


def _too_few_neighbours(msg: Message, context: Context) -> str | None:
    """The check ``secaggplus_mod`` makes only AFTER training, made before it (so nothing is spent)."""
    configs = msg.content.config_records.get(RECORD_KEY_CONFIGS)
    state = context.state.config_records.get(RECORD_KEY_STATE)
    if configs is None or state is None or configs.get(Key.STAGE) != Stage.COLLECT_MASKED_VECTORS:
        return None
    ciphertexts, threshold = configs.get(Key.CIPHERTEXT_LIST), state.get("threshold")
    if isinstance(ciphertexts, list) and isinstance(threshold, int) and len(ciphertexts) + 1 < threshold:
        return (
            f"fedfilter: secure aggregation refused: {len(ciphertexts) + 1} nodes shared keys with this one, "
            f"below the threshold {threshold}; nothing was trained, spent or released."
        )
    return None


@once_per_message  # the device runtime puts it around every approved app, which may list it too
def secure_aggregation_mod(msg: Message, context: Context, call_next: Callable[[Message, Context], Message]) -> Message:
    """Run Flower's SecAgg+ client protocol around the inner handler, marking its reply as masked."""
    if msg.metadata.message_type != MessageType.TRAIN or not msg.has_content():
        return call_next(msg, context)
    if RECORD_KEY_CONFIGS not in msg.content.config_records:
        return call_next(msg, context)  # a local round: unmarked
    use_cryptographic_masks()
    if (reason := _too_few_neighbours(msg, context)) is not None:
        log.warning("fedfilter mod: %s", reason)
        return Message(Error(code=ErrorCode.MOD_FAILED_PRECONDITION, reason=reason), reply_to=msg)

    def masked_call_next(inner: Message, ctx: Context) -> Message:
        # secaggplus_mod has read its configs already; the training code must not see them.
        configs = inner.content.config_records.get(RECORD_KEY_CONFIGS)
        if configs is not None:
            del inner.content.config_records[RECORD_KEY_CONFIGS]
        token = _MASKED.set(True)
        try:
            reply = call_next(inner, ctx)
        finally:
            _MASKED.reset(token)
            if configs is not None:
                inner.content.config_records[RECORD_KEY_CONFIGS] = configs
        if reply.has_error():
            raise _InnerError(reply)
        return reply

    try:
        return secaggplus_mod(msg, context, masked_call_next)
    except _InnerError as err:
        return err.reply


# --- what individual_filter_mod needs under the mark -------------------------------------------
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
            "(SecAgg+ would quantize a float report); a masked round needs placement='distributed'."
        )
    state = context.state.config_records.get(SECAGG_STATE_RECORD)
    problems = check_secagg_state(state if state is not None else {}, int(spec.min_reports), policy.secagg_graph)
    if problems or state is None:
        raise RoundSpecError("secure aggregation refused: " + " ".join(problems or ["no SecAgg+ state."]))
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
