"""A Flower mod that puts a device's individual, lifelong privacy filter around any ClientApp.

Usage::

    from flwr.clientapp import ClientApp
    from fedfilter.client.filter_mod import individual_filter_mod

    app = ClientApp(mods=[individual_filter_mod])

What the mod does with each message:

* **train** (``"train"`` and ``"train.<action>"``): reads the coordinator's round request from the
  ``ConfigRecord`` ``"fedfilter.request"`` (``run-id``, ``round-id``, ``noise-multiplier``,
  ``clip``, ``placement``, ``min-reports``) and the device's own settings from
  ``context.node_config`` only (``NODE_CONFIG_KEYS``; the coordinator cannot set them). A request
  that breaks the device's policy, a model with no floating-point values (only integer, bool or
  complex arrays, or none), or a round already released, is answered with an error ``Message``
  that names the field and value; nothing is trained, spent or released. A ledger the device
  cannot use (missing, refused until its owner acts, not writable) is answered with an error that
  names that kind only (``LedgerError.public``), never its spends or budget. Otherwise the
  inner handler always runs (so a client with no budget left is not faster than one with budget),
  the update ``returned - received`` goes through ``fedfilter.client.release.release`` (clip to the
  allowance, durable spend, then noise), and the reply carries exactly:

  - ``"arrays"``: an ``ArrayRecord`` with the noisy *update* (same keys and shapes as the model
    received; floating-point arrays in float32 whatever the model's dtype, ``fedfilter.client.mechanisms.gaussian``),
    and ``"fedfilter.status"``: ``ConfigRecord({"status": "report"})``, for a
    client that contributed and for one that sends pure noise alike; or
  - only ``"fedfilter.status"``: ``ConfigRecord({"status": "left"})`` for a client in ``leave``
    mode whose budget is spent (no ``ArrayRecord`` at all).

  Every metric and config the inner handler returned is dropped: example counts and training
  metrics depend on private data and carry no noise. Local bookkeeping (status, spend) stays in
  the device's ledger.

  Anything that goes wrong *after* an accepted request (the inner handler raises or answers with
  an error, returns arrays of the wrong shape, or an update holding NaN or inf) would otherwise
  show up as an un-noised, data-dependent signal. Instead the update is taken to be zero: the
  reply is pure noise (which costs nothing), and the cause is logged on the device only.

  Timing: once a round reaches the ledger, every reply (report, marker, replay refusal, error) is
  held until arrival + a whole multiple of the owner's ``reply-hold-s`` and only then built, so its
  arrival, ``created_at`` and ``ttl`` do not depend on the data or the budget
  (``client/flower/reply_timing.py``). Refusals before that depend only on the request and the settings,
  and are answered at once.
  The round runs as stages (``client/round/``): admit the request, train, release, reply, under
  one placement object the mod reads once, at its entry: the local one, or the SecAgg+ one below.

  **Under SecAgg+** (``ClientApp(mods=[secure_aggregation_mod, individual_filter_mod])``,
  ``client/secagg/mod.py``): in the stage where Flower's ``secaggplus_mod`` masks this mod's reply,
  and only there, ``secure_aggregation_mod`` installs its placement (``client/secagg/masked_round.py``;
  never anything the message carries), and the request must be ``distributed`` (``local`` is refused;
  without that mod ``distributed`` is refused, whatever the node config), the coordinator's SecAgg+
  setup must pass ``check_secagg_state`` (``client/secagg/neighbourhood.py``), the device's filter must
  be ``rdp`` and its worst-case account must exist: else the error names the field and value and
  nothing is trained, spent or released. The release is Skellam noise on SecAgg+'s
  integer grid (``client/mechanisms/skellam.py``), and the reply is the legacy layout
  ``secaggplus_mod`` reads: the encoded report (masked by the mod), ``num_examples = 1``, no metric,
  status OK. A ``leave`` device whose budget is spent answers with an error and drops out of the
  round. The reply hold applies as above.
* **evaluate**: refused with an error ``Message``. Loss and accuracy on a client's private data
  are data-dependent releases that carry no noise and are not accounted by the filter, with or
  without ``num-examples``; the coordinator evaluates on held-out data instead.
* anything else (``query``, system messages) passes through untouched: a ClientApp that answers
  queries with private data is outside what this mod protects.

Device settings (``context.node_config``; in the Deployment Engine from
``flower-supernode --node-config "ledger-dir='/var/lib/fedfilter' budget-epsilon=8.0 ..."``):
``fedfilter.client.settings.node_config`` lists the keys (``NODE_CONFIG_KEYS``), their defaults and meaning.

In the Simulation Engine every node's ``node_config`` holds only ``partition-id`` and
``num-partitions``. A node without its own ``ledger-dir`` then takes its entry (by partition-id)
of the device-settings file named by ``FEDFILTER_DEVICE_SETTINGS`` on the machine that runs the
simulation (``client/settings/simulated.py``; used by ``flwr run``), or, in-process,
``simulated_device_config_mod`` stands in for ``--node-config``.
"""

from __future__ import annotations

from collections.abc import Callable
from contextvars import ContextVar

from flwr.app import Context, Message

from fedfilter.client.flower.mod_once import once_per_message
from fedfilter.client.flower.reply_timing import ReplyHold
from fedfilter.client.round.placement import installed_placement
from fedfilter.client.round.refusal import refusal
from fedfilter.client.round.run import run_round

__all__ = ["individual_filter_mod"]

# Set while this mod's body handles a message: a copy nested past once_per_message (``__wrapped__``) passes
# through instead of waiting forever on the ledger lock the outer copy holds (flower/ledger_cache.py).
_FILTERING: ContextVar[bool] = ContextVar("fedfilter_filtering", default=False)


@once_per_message  # the device runtime puts it around every approved app, which may list it too
def individual_filter_mod(msg: Message, context: Context, call_next: Callable[[Message, Context], Message]) -> Message:
    """Wrap a ClientApp's training with the device's individual privacy filter.

    Every ``train`` message is checked against the device owner's settings (``context.node_config``)
    and ``check_request`` before anything runs; an accepted round trains, clips the update to the
    allowance the device's filter grants, spends it durably in the device's ledger, and only then
    adds the noise. ``evaluate`` is refused; other messages pass through (see the module docstring).

    Parameters
    ----------
    msg : Message
        The message the SuperNode delivered to this ClientApp.
    context : Context
        The node's context; ``context.node_config`` holds the owner's settings (``NODE_CONFIG_KEYS``).
    call_next : Callable[[Message, Context], Message]
        The inner handler (the app's training code, or the next mod).

    Returns
    -------
    Message
        The noisy update and status ``"report"``, the status ``"left"``, or an error reply whose
        reason is ``fedfilter[<code>]: <text>`` (``fedfilter.protocol.refusals``).

    Examples
    --------
    >>> from flwr.clientapp import ClientApp
    >>> app = ClientApp(mods=[individual_filter_mod])
    """
    if _FILTERING.get():  # a second copy inside the first, past once_per_message: the outer one filters
        return call_next(msg, context)
    hold = ReplyHold()  # the clock starts when the message reaches the device's mod
    placement = installed_placement()  # chosen once: local, unless secure_aggregation_mod masks this call
    token = _FILTERING.set(True)
    try:
        category = msg.metadata.message_type.split(".", 1)[0]
        if category == "evaluate":
            reply = refusal(
                msg,
                "evaluate-refused",
                "evaluation on a client's private data is refused: loss and "
                "accuracy on it are un-noised releases outside the privacy filter. Evaluate "
                "the global model on held-out data at the coordinator.",
            )
        elif category != "train":
            reply = call_next(msg, context)
        else:
            reply = run_round(msg, context, call_next, placement, hold)
    except Exception:
        hold.wait()  # Flower answers with the exception: not before the hold either
        raise
    finally:
        _FILTERING.reset(token)
    return hold.reply(reply, msg)
