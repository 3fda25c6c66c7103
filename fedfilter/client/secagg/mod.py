"""The device's SecAgg+ layer: Flower's ``secaggplus_mod`` with sound masks, and the placement that
tells ``individual_filter_mod`` its reply will be masked.

Usage (the order is the device's own, so the device knows its reply is masked)::

    from flwr.clientapp import ClientApp
    from fedfilter.client.filter_mod import individual_filter_mod
    from fedfilter.client.secagg.mod import secure_aggregation_mod

    app = ClientApp(mods=[secure_aggregation_mod, individual_filter_mod])

What it does with each message:

* a ``train`` message carrying SecAgg+ configs (``"secaggplus_configs"``): installs fedfilter's SecAgg+
  primitives in this process (masks, Shamir sharing, X25519 keys, AES-GCM share ciphertexts:
  ``protocol/secagg/masks.py``; idempotent), then hands the message to
  Flower's ``secaggplus_mod``. That mod calls the inner handler only in its COLLECT_MASKED_VECTORS
  stage and then masks the reply's arrays; the ``call_next`` it gets here installs a
  ``SecAggPlacement`` (``client/secagg/masked_round.py``), built from the SecAgg+ state this device
  holds, for exactly that call (``reply_masked()`` is then true), and removes the SecAgg+ configs
  record from the message first (the training code never sees the protocol's keys). The placement
  comes from this mod's own position in the device's mod list, never from anything the coordinator
  sends; the filter reads it once and calls none of this package's functions.
* at the share-keys stage, before Flower's: every neighbour's public keys must be raw X25519 keys and
  each ``pk1`` must agree a key with this device's (``keys.public_key_problems``; Flower would
  first meet ``pk1`` after training), else a refusal with nothing trained or spent.
* any other ``train`` message (a local round) and every other message pass straight to
  ``call_next`` with no placement installed (the filter's local one): one app serves local and
  distributed rounds.

If the inner handler answers with an error (a refusal, or a ``leave`` device whose budget is spent),
that error is the device's reply: ``secaggplus_mod`` cannot mask an error, and the device drops out
of the SecAgg+ round (its neighbours' key shares keep the round correct).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import cast

from cryptography.fernet import InvalidToken
from flwr.app import ConfigRecord, Context, Error, Message, RecordDict

from fedfilter.client.flower.mod_once import once_per_message
from fedfilter.client.round.placement import install_placement
from fedfilter.client.secagg.consistency import (
    certify,
    check_certificate,
    check_node_ids,
    check_tags,
    check_unmask_lists,
    open_certificate,
    public_key_of,
    round_parameters,
    seal_certificate,
    survivors_message,
    survivors_tag,
)
from fedfilter.client.secagg.masked_round import SECAGG_STATE_RECORD, SecAggPlacement, reply_masked
from fedfilter.client.secagg.pinning import Pinning, PinningError, pinning
from fedfilter.protocol.flower_api import (
    RECORD_KEY_CONFIGS,
    RECORD_KEY_STATE,
    ErrorCode,
    Key,
    MessageType,
    SecAggPlusState,
    Stage,
    secaggplus_mod,
    share_keys_plaintext_separate,
)
from fedfilter.protocol.refusals import refusal_reason
from fedfilter.protocol.secagg.aead import decrypt as decrypt_share
from fedfilter.protocol.secagg.keys import public_key_problems
from fedfilter.protocol.secagg.masks import use_cryptographic_masks
from fedfilter.protocol.wire import CONSISTENCY_RECORD, CONSISTENCY_STAGE, REQUEST_RECORD

__all__ = ["secure_aggregation_mod", "reply_masked", "SECAGG_STATE_RECORD"]  # the last two: masked_round

log = logging.getLogger("fedfilter.client")

# context.state: this mod's own protocol state beside Flower's (phase, the survivor set it authenticated)
CONSISTENCY_STATE_RECORD = "fedfilter.secagg.state"


class _InnerError(Exception):
    """Carries the inner handler's error reply out of ``secaggplus_mod`` (which cannot mask it)."""

    def __init__(self, reply: Message):
        super().__init__(reply.error.reason if reply.has_error() else "")
        self.reply = reply


# A refusal's problems, each with the code of its family (protocol/refusals.py). The reply carries the
# first problem's code: the checks run in a fixed order, so the code is a function of the messages
# and the settings, like the words.
Problems = list[tuple[str, str]]


def _tagged(code: str, problems: list[str]) -> Problems:
    return [(code, text) for text in problems]


def _refusal(msg: Message, problems: Problems, after: str) -> Message:
    text = "secure aggregation refused: " + " ".join(text for _, text in problems) + " " + after
    reason = refusal_reason(problems[0][0], text)
    log.warning("fedfilter mod: %s", reason)
    return Message(Error(code=ErrorCode.MOD_FAILED_PRECONDITION, reason=reason), reply_to=msg)


def _pinning_settings(err: PinningError) -> tuple[str, str]:
    """The owner's pinning settings cannot be used: the details (file paths, the OS error) go to the
    device's log only; the coordinator learns the code and that the owner must act."""
    log.warning("fedfilter mod: SecAgg+ pinning settings: %s", err)
    return ("secagg-pinning-settings", "this device's SecAgg+ pinning settings cannot be used (details in its log).")


def _config(records: RecordDict, name: str) -> ConfigRecord | None:
    """``records.config_records.get(name)`` without that view: Flower rebuilds it (every record,
    type-checked and written back) at each access, and this mod reads its records a few times a stage."""
    record = records.get(name)
    return record if isinstance(record, ConfigRecord) else None


def _flower_state(context: Context) -> SecAggPlusState | None:
    record = _config(context.state, RECORD_KEY_STATE)
    if record is None:
        return None
    state = SecAggPlusState(**dict(record))
    for name in ("rd_seed_share_dict", "sk1_share_dict", "ss2_dict", "public_keys_dict"):
        if not hasattr(state, name):  # Flower's __init__ sets only the fields its record holds
            setattr(state, name, {})
    return state


def _own_state(context: Context) -> ConfigRecord:
    record = _config(context.state, CONSISTENCY_STATE_RECORD)
    if record is None:
        record = context.state[CONSISTENCY_STATE_RECORD] = ConfigRecord({"phase": ""})
    return record


def _extra(msg: Message) -> ConfigRecord:
    record = _config(msg.content, CONSISTENCY_RECORD)
    return record if record is not None else ConfigRecord()


def _pairs(record: ConfigRecord, keys: str, values: str) -> dict:
    """``dict(zip(record[keys], record[values]))``, empty unless both are lists."""
    k, v = record.get(keys), record.get(values)
    return dict(zip(k, v)) if isinstance(k, list) and isinstance(v, list) else {}


# The SecAgg+ setup every device of a round must share (Flower's state fields; the node's own keys aside).
_SETUP_FIELDS = ("sample_num", "share_num", "threshold", "clipping_range", "target_range", "mod_range", "max_weight")


def _parameters(msg: Message, flower: SecAggPlusState) -> bytes:
    """The digest of the round's parameters as this device received them: the fedfilter request (the
    noise share it adds) and the SecAgg+ setup (the grid and graph it checked)."""
    request = _config(msg.content, REQUEST_RECORD)
    setup = {name: getattr(flower, name, None) for name in _SETUP_FIELDS}
    return round_parameters(dict(request) if request is not None else {}, setup)


def _holders(flower: SecAggPlusState) -> set[int]:
    """The nodes whose shares this device holds: itself and the neighbours whose ciphertexts it read."""
    return {int(n) for n in flower.rd_seed_share_dict}


def _collect_problems(msg: Message, context: Context, flower: SecAggPlusState | None) -> Problems:
    """What ``secaggplus_mod`` would raise on only AFTER training (too few neighbours, a ciphertext it
    cannot read), and, with pinning, the neighbours' certificates, checked before it."""
    configs = cast(ConfigRecord, _config(msg.content, RECORD_KEY_CONFIGS))  # the mod checked it is there
    if flower is None or flower.current_stage != Stage.SHARE_KEYS or _own_state(context).get("phase") != "shared":
        return [("secagg-stage", "the collect stage must follow this device's share-keys stage.")]
    srcs, ciphertexts = configs.get(Key.SOURCE_LIST), configs.get(Key.CIPHERTEXT_LIST)
    problems = _tagged("secagg-ciphertext", check_node_ids("source node ids", srcs))
    if problems:
        return problems
    srcs = cast(list[int], srcs)
    if not isinstance(ciphertexts, list) or len(ciphertexts) != len(srcs):
        return [("secagg-ciphertext", f"the share ciphertexts must be a list as long as the {len(srcs)} sources.")]
    if len(srcs) + 1 < flower.threshold:
        problems.append(
            (
                "secagg-graph",
                f"{len(srcs) + 1} nodes shared keys with this one, below the threshold {flower.threshold}.",
            )
        )
    try:
        pin = pinning(context.node_config)
    except PinningError as err:
        return [_pinning_settings(err)]
    sealed = _pairs(_extra(msg), "src", "sealed") if pin is not None else {}
    identities = {public_key_of(pin.identity_key)} if pin is not None else set()
    for src, ciphertext in zip(srcs, ciphertexts):
        shared = flower.ss2_dict.get(src)
        if src == flower.nid or shared is None:
            problems.append(("secagg-ciphertext", f"node {src} is not a neighbour this device shared keys with."))
            continue
        why = ""
        try:
            if not isinstance(ciphertext, bytes):
                raise TypeError(f"found {type(ciphertext).__name__}, not bytes.")
            # The decryption Flower's collect stage runs after training (fedfilter's AES-GCM, which this
            # mod installed: protocol/secagg/aead.py), run here first. Its result is not kept for Flower's
            # call: the plaintexts are the neighbours' key shares, and a second decryption costs ~1-2 us.
            actual, dst, _, _ = share_keys_plaintext_separate(decrypt_share(shared, ciphertext))
        except (InvalidToken, TypeError, ValueError) as err:
            actual, dst, why = -1, -1, str(err).rstrip(".")
        if (actual, dst) != (src, flower.nid):
            problems.append(
                (
                    "secagg-ciphertext",
                    f"node {src}'s share ciphertext is not one it sealed for this device"
                    + (f" ({why})." if why else "."),
                )
            )
        if pin is None:
            continue
        certificate = open_certificate(shared, sealed.get(src), src=src, dst=flower.nid)
        if certificate is None:
            problems.append(
                ("secagg-pinning", f"node {src}'s certificate is missing or not sealed by it for this device.")
            )
            continue
        pk1, pk2 = flower.public_keys_dict.get(src, (b"", b""))
        identity, problem = check_certificate(
            certificate,
            pin.pinned,
            run_id=int(context.run_id),
            round_id=msg.metadata.group_id,
            nid=src,
            pk1=pk1,
            pk2=pk2,
        )
        if identity is not None and identity in identities:
            problem = f"node {src} shows the identity key of another node ({identity.hex()})."
        if problem:
            problems.append(("secagg-pinning", problem))
        elif identity is not None:
            identities.add(identity)
    if not problems:
        own = _own_state(context)
        own["phase"], own["parameters"] = "collected", _parameters(msg, flower)
    return problems


def _key_problems(msg: Message, flower: SecAggPlusState | None) -> list[str]:
    """The neighbours' X25519 keys (protocol/secagg/keys.py), checked before Flower's share-keys stage."""
    sk1 = getattr(flower, "sk1", None) if flower is not None else None
    if not isinstance(sk1, bytes):
        return []  # no setup yet: Flower's own stage check refuses
    configs = cast(ConfigRecord, _config(msg.content, RECORD_KEY_CONFIGS))
    keys = {nid: pair for nid, pair in configs.items() if nid != Key.STAGE}
    share_num = getattr(flower, "share_num", 0)
    if isinstance(share_num, int) and len(keys) > share_num:
        # Every bound on the sum assumes at most share_num holders of this device's secrets.
        return [f"{len(keys)} nodes' keys (this one included) for a neighbourhood of share_num {share_num}."]
    return public_key_problems(sk1, keys)


def _consistency_reply(msg: Message, context: Context) -> Message:
    """Authenticate, once per round, the survivor set the coordinator names to each neighbour in it
    whose shares this device holds (Bonawitz et al. 2017, Round 3; MACs: consistency.py)."""
    flower, own = _flower_state(context), _own_state(context)
    survivors = cast(ConfigRecord, _config(msg.content, RECORD_KEY_CONFIGS)).get(Key.ACTIVE_NODE_ID_LIST)
    problems = _tagged("secagg-consistency", check_node_ids("survivor node ids", survivors))
    if flower is None or flower.current_stage != Stage.COLLECT_MASKED_VECTORS or own.get("phase") != "collected":
        once = "a survivor set is authenticated once per round, after this device sent its masked vector."
        problems.insert(0, ("secagg-stage", once))
    elif not problems:
        survivors = cast(list[int], survivors)
        if flower.nid not in survivors:
            problems.append(("secagg-consistency", f"this device ({flower.nid}) is not in the survivor set."))
        if len(_holders(flower) & set(survivors)) < flower.threshold:
            few = f"fewer than the threshold {flower.threshold} of this device's neighbours survive."
            problems.append(("secagg-consistency", few))
    if problems or flower is None:
        own["phase"] = "refused"
        return _refusal(msg, problems, "No share was revealed.")
    survivors = cast(list[int], survivors)
    message = survivors_message(
        run_id=int(context.run_id),
        round_id=msg.metadata.group_id,
        survivors=survivors,
        parameters=cast(bytes, own["parameters"]),
    )
    own["survivors"], own["phase"] = sorted(survivors), "authenticated"
    dsts = sorted((_holders(flower) & set(survivors)) - {flower.nid})
    tags = [survivors_tag(flower.ss2_dict[d], message, src=flower.nid, dst=d) for d in dsts]
    return Message(RecordDict({RECORD_KEY_CONFIGS: ConfigRecord({"dst": dsts, "tag": tags})}), reply_to=msg)


def _unmask_problems(msg: Message, context: Context, flower: SecAggPlusState | None) -> Problems:
    """The unmask request against the authenticated survivor set and the neighbours' tags on it."""
    own = _own_state(context)
    if flower is None or flower.current_stage != Stage.COLLECT_MASKED_VECTORS or own.get("phase") != "authenticated":
        return [("secagg-stage", "shares are revealed once per round, after this device authenticated a survivor set.")]
    configs, extra = cast(ConfigRecord, _config(msg.content, RECORD_KEY_CONFIGS)), _extra(msg)
    survivors = cast(list[int], own["survivors"])
    message = survivors_message(
        run_id=int(context.run_id),
        round_id=msg.metadata.group_id,
        survivors=survivors,
        parameters=cast(bytes, own["parameters"]),
    )
    holders = _holders(flower)
    keys = {nid: flower.ss2_dict[nid] for nid in holders - {flower.nid} if nid in flower.ss2_dict}
    tag_problems, tagged = check_tags(
        message,
        me=flower.nid,
        keys=keys,
        signers=extra.get("signer", []),
        tags=extra.get("tag", []),
        threshold=flower.threshold,
    )
    return _tagged("secagg-consistency", tag_problems) + _tagged(
        "secagg-unmask",
        check_unmask_lists(
            me=flower.nid,
            active=configs.get(Key.ACTIVE_NODE_ID_LIST),
            dead=configs.get(Key.DEAD_NODE_ID_LIST),
            holders=holders,
            survivors=survivors,
            tagged=tagged,
            threshold=flower.threshold,
        ),
    )


def _share_keys_code(err: ValueError) -> str:
    """The family of a refusal at Flower's share-keys stage (flwr 1.41 ``_share_keys`` and its stage
    check; ``secagg_keys`` for a low-order pk2), read from its words: the stage order, too few
    neighbours for the threshold, else the keys (identical or unusable)."""
    text = str(err)
    if "stage" in text:
        return "secagg-stage"
    if "threshold" in text:
        return "secagg-graph"
    return "secagg-keys"


def _seal_certificate(msg: Message, reply: Message, context: Context, pin: Pinning | None) -> None:
    """After Flower's share-keys stage: with pinning, the owner's certificate of this round's keys sealed
    for each destination under the pairwise key that stage agreed (the coordinator relays it but can
    neither read nor swap it); without, nothing is sent."""
    flower, own = _flower_state(context), _own_state(context)
    if flower is None or reply.has_error():
        return
    if pin is not None:
        certificate = certify(
            pin.identity_key,
            run_id=int(context.run_id),
            round_id=msg.metadata.group_id,
            nid=flower.nid,
            pk1=flower.pk1,
            pk2=flower.pk2,
        )
        dsts = cast(list[int], cast(ConfigRecord, _config(reply.content, RECORD_KEY_CONFIGS))[Key.DESTINATION_LIST])
        sealed = [seal_certificate(flower.ss2_dict[d], src=flower.nid, dst=d, certificate=certificate) for d in dsts]
        reply.content[CONSISTENCY_RECORD] = ConfigRecord({"dst": list(dsts), "sealed": sealed})
    own["phase"] = "shared"


@once_per_message  # the device runtime puts it around every approved app, which may list it too
def secure_aggregation_mod(msg: Message, context: Context, call_next: Callable[[Message, Context], Message]) -> Message:
    """Run Flower's SecAgg+ client protocol around the inner handler, installing the SecAgg+ placement, with
    the malicious-server checks of ``client/secagg/consistency.py`` around its stages.

    List it before ``individual_filter_mod``: the placement it installs is how the filter knows its reply is
    masked, and so serves ``placement = "distributed"`` (Skellam noise on SecAgg+'s grid). Messages
    without SecAgg+ configs (local rounds, evaluate, queries) pass through with none installed.

    Parameters
    ----------
    msg : Message
        The message the SuperNode delivered to this ClientApp.
    context : Context
        The node's context; SecAgg+'s state between stages lives in ``context.state``.
    call_next : Callable[[Message, Context], Message]
        The inner handler (normally ``individual_filter_mod`` around the app's training).

    Returns
    -------
    Message
        Flower's SecAgg+ reply for the stage, or the inner handler's error (the device then drops out
        of the round).

    Examples
    --------
    >>> from flwr.clientapp import ClientApp
    >>> from fedfilter.client.filter_mod import individual_filter_mod
    >>> app = ClientApp(mods=[secure_aggregation_mod, individual_filter_mod])
    """
    if msg.metadata.message_type != MessageType.TRAIN or not msg.has_content():
        return call_next(msg, context)
    configs = _config(msg.content, RECORD_KEY_CONFIGS)
    if configs is None:
        return call_next(msg, context)  # a local round: no placement installed
    use_cryptographic_masks()
    stage = configs.get(Key.STAGE)
    flower = _flower_state(context)
    pin = None
    if stage == Stage.SETUP:
        context.state[CONSISTENCY_STATE_RECORD] = ConfigRecord({"phase": ""})
    elif stage == Stage.SHARE_KEYS:
        try:
            pin = pinning(context.node_config)
        except PinningError as err:
            return _refusal(msg, [_pinning_settings(err)], "Nothing was trained, spent or released.")
        if keys := _tagged("secagg-keys", _key_problems(msg, flower)):
            return _refusal(msg, keys, "Nothing was trained, spent or released.")
    elif stage == CONSISTENCY_STAGE:
        return _consistency_reply(msg, context)
    elif stage == Stage.COLLECT_MASKED_VECTORS and (problems := _collect_problems(msg, context, flower)):
        return _refusal(msg, problems, "Nothing was trained, spent or released.")
    elif stage == Stage.UNMASK:
        if problems := _unmask_problems(msg, context, flower):
            _own_state(context)["phase"] = "refused"
            return _refusal(msg, problems, "No share was revealed.")
        _own_state(context)["phase"] = "unmasked"  # one unmask per round, whatever happens next

    def masked_call_next(inner: Message, ctx: Context) -> Message:
        # secaggplus_mod has read its configs already; the training code must not see them.
        removed = {
            name: inner.content.pop(name)
            for name in (RECORD_KEY_CONFIGS, CONSISTENCY_RECORD)
            if _config(inner.content, name) is not None
        }
        try:
            # The one hand-over to the filter: its placement for this round, built from SecAgg+'s state.
            with install_placement(SecAggPlacement.from_context(ctx)):
                reply = call_next(inner, ctx)
        finally:
            inner.content.update(removed)
        if reply.has_error():
            raise _InnerError(reply)
        return reply

    try:
        reply = secaggplus_mod(msg, context, masked_call_next)
    except _InnerError as err:
        return err.reply
    except ValueError as err:
        if stage != Stage.SHARE_KEYS:
            raise
        # Flower's share-keys checks (threshold, duplicate keys) and a low-order pk2 (secagg_keys): this
        # stage trains nothing, so the refusal costs nothing.
        return _refusal(msg, [(_share_keys_code(err), str(err))], "Nothing was trained, spent or released.")
    if stage == Stage.SHARE_KEYS:
        _seal_certificate(msg, reply, context, pin)
    return reply
