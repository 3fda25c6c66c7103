"""Train: the inner handler, always run (a noise-only reply must take as long as a real one).

Anything that goes wrong in it (it raises, answers with an error or with something that is not the
model) would otherwise show as an un-noised, data-dependent signal: the update is then zero and the
cause is logged on the device only.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import numpy as np
from flwr.app import Context, Message

from fedfilter.client.flower.npy_codec import decode
from fedfilter.client.round.admitted import AdmittedRound

__all__ = ["train"]

log = logging.getLogger("fedfilter.client")


def train(
    call_next: Callable[[Message, Context], Message], msg: Message, context: Context, admitted: AdmittedRound
) -> list[np.ndarray]:
    """Run the inner handler and return ``returned - received`` in the model's dtypes (zeros if it failed).

    Parameters
    ----------
    call_next : callable
        The inner handler (the app's training code, or the next mod).
    msg, context : Message, Context
        As the mod received them.
    admitted : AdmittedRound
        The round (the model received).

    Examples
    --------
    >>> import time
    >>> from flwr.app import Metadata, RecordDict
    >>> from fedfilter.client.settings.node_config import device_config
    >>> from fedfilter.protocol.request import RoundSpec
    >>> meta = Metadata(run_id=1, message_id="m", src_node_id=1, dst_node_id=2, reply_to_message_id="",
    ...                 group_id="1", created_at=time.time(), ttl=60.0, message_type="train")
    >>> device = device_config({"ledger-dir": "/tmp/x", "client-id": "a", "budget-epsilon": 4.0,
    ...                         "budget-delta": 1e-5})
    >>> round_ = AdmittedRound(RoundSpec("run", 1, 1.0, 1.0), device, 0.0, ["w"], [np.ones(2, np.float32)], [0], None)
    >>> def failing(msg, ctx):
    ...     raise RuntimeError("no data")
    >>> ctx = Context(run_id=1, node_id=2, node_config={}, state=RecordDict(), run_config={})
    >>> train(failing, Message(RecordDict(), metadata=meta), ctx, round_)
    [array([0., 0.], dtype=float32)]
    """
    update = _inner_update(call_next, msg, context, admitted.keys, admitted.received)
    return [np.zeros_like(a) for a in admitted.received] if update is None else update


def _inner_update(
    call_next, msg: Message, context: Context, keys: list[str], received: list[np.ndarray]
) -> list[np.ndarray] | None:
    """``returned - received``, or ``None`` when the handler failed or answered with something that is
    not the model: the cause is logged here, on the device, and never sent."""
    try:
        out = call_next(msg, context)
    except Exception:  # noqa: BLE001 - any failure becomes a zero update (see module docstring)
        log.exception("fedfilter mod: the inner train handler raised; releasing a zero update")
        return None
    if out.has_error():
        log.error(
            "fedfilter mod: the inner train handler answered with an error (code %s: %s); releasing a zero update",
            out.error.code,
            out.error.reason,
        )
        return None
    records = list(out.content.array_records.items())
    if len(records) != 1 or list(records[0][1].keys()) != keys:
        log.error(
            "fedfilter mod: the inner reply must hold exactly one ArrayRecord with the keys "
            "received; releasing a zero update"
        )
        return None
    update = []
    for key, old in zip(keys, received):
        try:
            new = decode(records[0][1][key])
        except Exception:  # noqa: BLE001
            log.exception("fedfilter mod: array %r of the inner reply cannot be read", key)
            return None
        if new.shape != old.shape:
            log.error(
                "fedfilter mod: array %r came back with shape %s, expected %s; releasing a zero update",
                key,
                new.shape,
                old.shape,
            )
            return None
        if np.issubdtype(old.dtype, np.floating):
            update.append((new.astype(np.float64) - old.astype(np.float64)).astype(old.dtype))
        else:
            # Integer buffers (e.g. BatchNorm's num_batches_tracked, which counts batches and so
            # reveals the data size) are never released: their update is always zero.
            update.append(np.zeros_like(old))
    return update
