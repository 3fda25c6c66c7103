"""The coordinator's half of the consistency round fedfilter's devices require before they unmask.

``ConsistencyCheckedSecAggPlus`` is Flower's ``SecAggPlusWorkflow`` (flwr 1.41/1.42) with three small
additions; Flower's four stages and their messages are otherwise its own:

* share keys: a device with peer-key pinning on adds its owner's certificate sealed for each
  destination (``CONSISTENCY_RECORD``: ``dst``, ``sealed``); the workflow keeps them (devices without
  pinning add nothing);
* collect masked vectors: a device to which certificates were sealed gets them (``src``, ``sealed``)
  beside Flower's share ciphertexts; the others get no extra record;
* between collect and unmask, the consistency round (Bonawitz et al., CCS 2017, Round 3
  ConsistencyCheck; the device's side and the argument are in ``client/secagg/consistency.py``):
  every survivor gets the survivor set (Flower's ``active_node_ids`` after the collect stage) and
  answers with one MAC on it for each neighbour it holds shares of (``dst``, ``tag``); each unmask
  message then carries every tag addressed to its device by its surviving neighbours (``signer``,
  ``tag``): a device reveals a node's mask-seed share only if that node's own tag was shown to it.

The additions are message routing only: the devices check everything, so a coordinator that skips or
forges any of it gets refusals, not shares. Every stage's error replies are counted by refusal code
(``refusals``, ``coordinator/replies.refusal_of``) for the round's log: a device's SecAgg+ refusal
names its check (``secagg-keys``, ``secagg-consistency``, ...; ``protocol/refusals.py``). The grid is
wrapped (``_Relay``) to add or read the extra record on the messages Flower's stages send and receive,
so Flower's stage code runs unchanged.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from logging import DEBUG
from typing import cast

from flwr.app import ConfigRecord, Message, RecordDict
from flwr.serverapp import Grid

from fedfilter.coordinator.replies import refusal_of
from fedfilter.protocol.flower_api import (
    RECORD_KEY_CONFIGS,
    Key,
    LegacyContext,
    MessageType,
    SecAggPlusWorkflow,
    WorkflowState,
    log,
)
from fedfilter.protocol.wire import CONSISTENCY_RECORD, CONSISTENCY_STAGE, LEGACY_CONFIGS_RECORD, LEGACY_CURRENT_ROUND

__all__ = ["ConsistencyCheckedSecAggPlus"]


class _Relay:
    """A grid whose ``send_and_receive`` lets the workflow add a record to each message sent
    (``outgoing(msg)``), read each reply (``incoming(reply)``) and each error reply (``refused(reply)``);
    every other call goes to the grid."""

    def __init__(
        self,
        grid: Grid,
        outgoing: Callable[[Message], None] = lambda m: None,
        incoming: Callable[[Message], None] = lambda m: None,
        refused: Callable[[Message], None] = lambda m: None,
    ) -> None:
        self._grid, self._outgoing, self._incoming, self._refused = grid, outgoing, incoming, refused

    def __getattr__(self, name: str):
        return getattr(self._grid, name)

    def send_and_receive(self, messages: Iterable[Message], *, timeout: float | None = None) -> list[Message]:
        messages = list(messages)
        for msg in messages:
            # Flower shares one RecordDict among a stage's messages in places: give each its own.
            msg.content = RecordDict(dict(msg.content.items()))
            self._outgoing(msg)
        replies = list(self._grid.send_and_receive(messages, timeout=timeout))
        for reply in replies:
            (self._refused if reply.has_error() else self._incoming)(reply)
        return replies


class ConsistencyCheckedSecAggPlus(SecAggPlusWorkflow):
    """Flower's SecAgg+ workflow plus the routing of the devices' consistency round.

    Parameters
    ----------
    **kwargs
        ``SecAggPlusWorkflow``'s parameters (``num_shares``, ``reconstruction_threshold``, ``timeout``, ...).

    Attributes
    ----------
    signers : int
        Devices that authenticated the survivor set in the last consistency round.
    refusals : dict of str to int
        Refusal code -> error replies, over all stages.

    Examples
    --------
    >>> workflow = ConsistencyCheckedSecAggPlus(num_shares=3, reconstruction_threshold=2)
    >>> workflow.refusals, workflow.signers
    ({}, 0)
    >>> workflow(grid, context)  # doctest: +SKIP
    """

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self._sealed: dict[int, list[tuple[int, bytes]]] = {}  # dst -> [(src, sealed certificate)]
        self._tags: dict[int, dict[int, bytes]] = {}  # dst -> {src: src's tag on the survivor set for dst}
        self.signers = 0  # devices that authenticated the survivor set (for the round's log)
        self.refusals: dict[str, int] = {}  # refusal code -> error replies, all stages (for the round's log)

    def _count(self, reply: Message) -> None:
        code = refusal_of(reply) or "unknown"
        self.refusals[code] = self.refusals.get(code, 0) + 1

    def setup_stage(self, grid: Grid, context: LegacyContext, state: WorkflowState) -> bool:
        """Flower's setup stage, its error replies counted by refusal code.

        Parameters
        ----------
        grid : Grid
            Flower's grid.
        context : LegacyContext
            The workflow's context.
        state : WorkflowState
            SecAgg+'s state.

        Returns
        -------
        bool
            Whether the protocol goes on.

        Examples
        --------
        >>> workflow.setup_stage(grid, context, state)  # doctest: +SKIP
        True
        """
        return super().setup_stage(cast(Grid, _Relay(grid, refused=self._count)), context, state)

    def share_keys_stage(self, grid: Grid, context: LegacyContext, state: WorkflowState) -> bool:
        """Flower's share-keys stage, keeping the certificates devices sealed for their neighbours.

        Parameters
        ----------
        grid : Grid
            Flower's grid.
        context : LegacyContext
            The workflow's context.
        state : WorkflowState
            SecAgg+'s state.

        Returns
        -------
        bool
            Whether the protocol goes on.

        Examples
        --------
        >>> workflow.share_keys_stage(grid, context, state)  # doctest: +SKIP
        True
        """
        self._sealed = {}

        def keep(reply: Message) -> None:
            record = reply.content.config_records.get(CONSISTENCY_RECORD)
            if record is None:
                return  # no pinning on this device (or it sealed nothing: pinned neighbours will refuse)
            dsts, sealed = record.get("dst"), record.get("sealed")
            if isinstance(dsts, list) and isinstance(sealed, list):
                for dst, token in zip(dsts, sealed):
                    if isinstance(dst, int) and isinstance(token, bytes):  # the receiver checks the rest
                        self._sealed.setdefault(dst, []).append((int(reply.metadata.src_node_id), token))

        return super().share_keys_stage(cast(Grid, _Relay(grid, incoming=keep, refused=self._count)), context, state)

    def collect_masked_vectors_stage(self, grid: Grid, context: LegacyContext, state: WorkflowState) -> bool:
        """Flower's masked-vector stage, each device also sent the certificates sealed for it.

        Parameters
        ----------
        grid : Grid
            Flower's grid.
        context : LegacyContext
            The workflow's context.
        state : WorkflowState
            SecAgg+'s state.

        Returns
        -------
        bool
            Whether the protocol goes on.

        Examples
        --------
        >>> workflow.collect_masked_vectors_stage(grid, context, state)  # doctest: +SKIP
        True
        """

        def add(msg: Message) -> None:
            pairs = self._sealed.get(int(msg.metadata.dst_node_id))
            if pairs:  # only certificates are relayed here: without pinning the message is Flower's own
                msg.content.config_records[CONSISTENCY_RECORD] = ConfigRecord(
                    {"src": [src for src, _ in pairs], "sealed": [token for _, token in pairs]}
                )

        relay = _Relay(grid, outgoing=add, refused=self._count)
        return super().collect_masked_vectors_stage(cast(Grid, relay), context, state)

    def consistency_stage(self, grid: Grid, context: LegacyContext, state: WorkflowState) -> None:
        """Send the survivor set to every survivor and keep the tags that come back, by destination.

        Parameters
        ----------
        grid : Grid
            Flower's grid.
        context : LegacyContext
            The workflow's context (its current round is the messages' group).
        state : WorkflowState
            SecAgg+'s state (``active_node_ids``: the survivors).

        Examples
        --------
        >>> workflow.consistency_stage(grid, context, state)  # doctest: +SKIP
        >>> workflow.signers  # doctest: +SKIP
        5
        """
        group = str(context.state.config_records[LEGACY_CONFIGS_RECORD][LEGACY_CURRENT_ROUND])
        survivors = sorted(state.active_node_ids)

        def make(nid: int) -> Message:
            record = ConfigRecord({Key.STAGE: CONSISTENCY_STAGE, Key.ACTIVE_NODE_ID_LIST: survivors})
            return Message(
                content=RecordDict({RECORD_KEY_CONFIGS: record}),
                dst_node_id=nid,
                message_type=MessageType.TRAIN,
                group_id=group,
            )

        log(DEBUG, "[Consistency] Sending the survivor set to %s clients.", len(survivors))
        replies = grid.send_and_receive([make(nid) for nid in survivors], timeout=self.timeout)
        self._tags = {}
        signers = set()
        for reply in replies:
            if reply.has_error():
                self._count(reply)
                continue
            record = reply.content.config_records.get(RECORD_KEY_CONFIGS, ConfigRecord())
            dsts, tags = record.get("dst"), record.get("tag")
            if not (isinstance(dsts, list) and isinstance(tags, list)):
                continue
            src = int(reply.metadata.src_node_id)
            signers.add(src)
            for dst, tag in zip(dsts, tags):
                if isinstance(dst, int) and isinstance(tag, bytes):  # the receiver checks the rest
                    self._tags.setdefault(dst, {})[src] = tag
        self.signers = len(signers)

    def unmask_stage(self, grid: Grid, context: LegacyContext, state: WorkflowState) -> bool:
        """The consistency round, then Flower's unmask stage with each device's tags attached.

        Parameters
        ----------
        grid : Grid
            Flower's grid.
        context : LegacyContext
            The workflow's context.
        state : WorkflowState
            SecAgg+'s state.

        Returns
        -------
        bool
            Whether the sum was unmasked.

        Examples
        --------
        >>> workflow.unmask_stage(grid, context, state)  # doctest: +SKIP
        True
        """
        self.consistency_stage(grid, context, state)

        def add(msg: Message) -> None:
            nid = int(msg.metadata.dst_node_id)
            tags = self._tags.get(nid, {})
            # A device reveals the mask-seed share of each active neighbour only if that neighbour's own
            # tag on the set (and the round's parameters) was shown to it, and needs `threshold - 1` such
            # tags in all (client/secagg/consistency.py): show it every tag its neighbours addressed to it.
            signers = sorted(set(tags) & state.nid_to_neighbours.get(nid, set()))
            msg.content.config_records[CONSISTENCY_RECORD] = ConfigRecord(
                {"signer": signers, "tag": [tags[n] for n in signers]}
            )

        return super().unmask_stage(cast(Grid, _Relay(grid, outgoing=add, refused=self._count)), context, state)
