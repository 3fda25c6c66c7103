"""Where a round's noise is summed, as ONE object chosen once per message: local, or SecAgg+.

A ``Placement`` holds everything that differs between the two: its checks of the request before
training (``admit_request``) and against the ledger (``check_ledger``), which arrays it releases
(``released``), the mechanism (returned by ``admit_request``) and the reply's layout (``reply``).

``individual_filter_mod`` reads the placement once, at its entry (``installed_placement``): the local
one unless ``secure_aggregation_mod`` installed its SecAgg+ placement (``client/secagg/masked_round.py``)
for exactly its call of the inner handler in the masked stage (``install_placement``). The object
lives in a process-local ``ContextVar``, never in the message: the coordinator writes every record a
message holds, so nothing it sends can make a round look masked.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import replace
from typing import ClassVar

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, RecordDict

from fedfilter.client.flower.npy_codec import encode
from fedfilter.client.ledger.budget import BudgetLedger
from fedfilter.client.mechanisms.gaussian import GaussianMechanism
from fedfilter.client.mechanisms.sampled import self_sampling
from fedfilter.client.release import Release
from fedfilter.client.round.admitted import AdmittedRound, MechanismFor
from fedfilter.client.round.refusal import refusal
from fedfilter.client.settings.policy import ClientPolicy, check_request
from fedfilter.protocol.adaptive_clip import released_vector_spec
from fedfilter.protocol.flower_api import RECORD_KEY_CONFIGS
from fedfilter.protocol.request import RoundSpec
from fedfilter.protocol.wire import ARRAYS_RECORD, CLIP_BIT_KEY, STATUS_LEFT, STATUS_RECORD, STATUS_REPORT

__all__ = ["Placement", "LocalPlacement", "installed_placement", "install_placement"]


class Placement(ABC):
    """What one placement does at each stage of a round (``LocalPlacement``; SecAgg+'s in ``client/secagg``).

    Attributes
    ----------
    distributed : bool
        Whether the request may ask for ``placement='distributed'`` (SecAgg+ only).

    Examples
    --------
    >>> placement = installed_placement()
    >>> isinstance(placement, Placement), placement.distributed
    (True, False)
    """

    # Whether the request may ask for placement='distributed' (check_request's allow_distributed).
    distributed: ClassVar[bool]

    @abstractmethod
    def refuse_message(self, msg: Message) -> Message | None:
        """A refusal of the message as a whole, before the device's settings are read; ``None``: go on.

        Parameters
        ----------
        msg : Message
            The train message.

        Returns
        -------
        Message or None
            The error reply, or None to go on.

        Examples
        --------
        >>> import time
        >>> from flwr.app import Metadata
        >>> meta = Metadata(run_id=1, message_id="m", src_node_id=1, dst_node_id=2, reply_to_message_id="",
        ...                 group_id="1", created_at=time.time(), ttl=60.0, message_type="train")
        >>> LocalPlacement().refuse_message(Message(RecordDict(), metadata=meta)) is None
        True
        >>> masked = Message(RecordDict({RECORD_KEY_CONFIGS: ConfigRecord({})}), metadata=meta)
        >>> LocalPlacement().refuse_message(masked).error.reason[:28]
        'fedfilter[secagg-mod-order]:'
        """

    def admit_request(self, spec: RoundSpec, policy: ClientPolicy) -> MechanismFor:
        """Check the request (``RoundSpecError`` names the value) and say how its noise is drawn.

        Parameters
        ----------
        spec : RoundSpec
            The coordinator's request.
        policy : ClientPolicy
            The owner's rules.

        Examples
        --------
        >>> from fedfilter.protocol.request import RoundSpecError
        >>> try:
        ...     LocalPlacement().admit_request(RoundSpec("run", 1, 1.0, 1.0, "distributed", 2), ClientPolicy())
        ... except RoundSpecError as err:
        ...     print(err.code)
        needs-secure-aggregation
        """
        check_request(spec, replace(policy, allow_distributed=self.distributed))
        # The mechanism releases the report vector (with adaptive clipping: the update and the clip bit);
        # with a plan's asks, behind the device's own coin.
        return self_sampling(spec, policy, self.mechanism_for(released_vector_spec(spec), policy))

    @abstractmethod
    def mechanism_for(self, spec: RoundSpec, policy: ClientPolicy) -> MechanismFor:
        """The placement's own checks of a request ``check_request`` passed, and the round's mechanism.

        Parameters
        ----------
        spec : RoundSpec
            The coordinator's request.
        policy : ClientPolicy
            The owner's rules.

        Returns
        -------
        callable
            The round's mechanism for the arrays it releases.

        Examples
        --------
        >>> import numpy as np
        >>> for_arrays = LocalPlacement().mechanism_for(RoundSpec("run", 1, 1.0, 1.0), ClientPolicy())
        >>> for_arrays([np.zeros(2)]).placement
        'local'
        """

    @abstractmethod
    def check_ledger(self, ledger: BudgetLedger) -> None:
        """Checks against the device's ledger before training (``RoundSpecError``: nothing is spent).

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
        ...     enrol_device({"ledger-dir": root + "/dev", "budget-epsilon": 4.0})
        ...     ledger = BudgetLedger.open(root + "/dev")
        ...     print(LocalPlacement().check_ledger(ledger))
        ...     ledger.close()
        None
        """

    @abstractmethod
    def released(self, admitted: AdmittedRound, update: list[np.ndarray]) -> list[np.ndarray]:
        """The arrays of ``update`` this placement releases.

        Parameters
        ----------
        admitted : AdmittedRound
            The round.
        update : list of numpy.ndarray
            ``returned - received``, one array per model array.

        Returns
        -------
        list of numpy.ndarray
            The arrays the mechanism clips and noises.

        Examples
        --------
        >>> import numpy as np
        >>> from fedfilter.client.settings.node_config import device_config
        >>> spec = RoundSpec("run", 1, 1.0, 1.0)
        >>> admitted = AdmittedRound(spec, device_config({"ledger-dir": "dev", "budget-epsilon": 4.0}), 0.0,
        ...                          ["w", "batches"], [np.zeros(2, np.float32), np.zeros((), np.int64)], [0],
        ...                          LocalPlacement().mechanism_for(spec, ClientPolicy()))
        >>> LocalPlacement().released(admitted, [np.ones(2, np.float32), np.array(5)])  # the count stays
        [array([1., 1.], dtype=float32)]
        """

    @abstractmethod
    def reply(self, msg: Message, admitted: AdmittedRound, release: Release) -> Message:
        """The reply to ``msg`` carrying ``release`` (or the placement's answer for a device that left).

        Parameters
        ----------
        msg : Message
            The train message.
        admitted : AdmittedRound
            The round.
        release : Release
            What ``client.release.release`` spent and noised.

        Returns
        -------
        Message
            The reply to send.

        Examples
        --------
        >>> import numpy as np
        >>> import time
        >>> from flwr.app import Metadata
        >>> meta = Metadata(run_id=1, message_id="m", src_node_id=1, dst_node_id=2, reply_to_message_id="",
        ...                 group_id="1", created_at=time.time(), ttl=60.0, message_type="train")
        >>> from fedfilter.client.settings.node_config import device_config
        >>> spec = RoundSpec("run", 1, 1.0, 1.0)
        >>> admitted = AdmittedRound(spec, device_config({"ledger-dir": "dev", "budget-epsilon": 4.0}), 0.0,
        ...                          ["w", "batches"], [np.zeros(2, np.float32), np.zeros((), np.int64)], [0],
        ...                          LocalPlacement().mechanism_for(spec, ClientPolicy()))
        >>> rel = Release("contributed", [np.full(2, 0.5, np.float32)], 1.0, 1.0, np.zeros(1), np.zeros(1), None)
        >>> reply = LocalPlacement().reply(Message(RecordDict(), metadata=meta), admitted, rel)
        >>> reply.content[STATUS_RECORD]["status"], reply.content[ARRAYS_RECORD]["w"].numpy()
        ('report', array([0.5, 0.5], dtype=float32))
        """


class LocalPlacement(Placement):
    """Gaussian noise on the floating-point arrays; the reply is the noisy update and a status.

    Examples
    --------
    >>> import numpy as np
    >>> LocalPlacement().mechanism_for(RoundSpec("run", 1, 1.0, 1.0), ClientPolicy())([np.zeros(2)]).placement
    'local'
    """

    distributed = False

    def refuse_message(self, msg: Message) -> Message | None:
        """A SecAgg+ message outside ``secure_aggregation_mod`` (which strips SecAgg+'s configs before the
        filter sees a masked stage): the mod is missing, or listed after the filter.

        Parameters
        ----------
        msg : Message
            The train message.

        Returns
        -------
        Message or None
            The ``secagg-mod-order`` refusal, or None to go on.

        Examples
        --------
        >>> import time
        >>> from flwr.app import Metadata
        >>> meta = Metadata(run_id=1, message_id="m", src_node_id=1, dst_node_id=2, reply_to_message_id="",
        ...                 group_id="1", created_at=time.time(), ttl=60.0, message_type="train")
        >>> LocalPlacement().refuse_message(Message(RecordDict(), metadata=meta)) is None
        True
        >>> masked = Message(RecordDict({RECORD_KEY_CONFIGS: ConfigRecord({})}), metadata=meta)
        >>> LocalPlacement().refuse_message(masked).error.reason[:28]
        'fedfilter[secagg-mod-order]:'
        """
        if RECORD_KEY_CONFIGS not in msg.content.config_records:
            return None
        return refusal(
            msg,
            "secagg-mod-order",
            "a SecAgg+ message reached individual_filter_mod outside secure_aggregation_mod: list it first, "
            "ClientApp(mods=[secure_aggregation_mod, individual_filter_mod]). Nothing was trained, spent or released.",
        )

    def mechanism_for(self, spec: RoundSpec, policy: ClientPolicy) -> MechanismFor:
        """``GaussianMechanism.for_request(spec)`` whatever the arrays.

        Parameters
        ----------
        spec : RoundSpec
            The coordinator's request.
        policy : ClientPolicy
            The owner's rules (``check_request`` applied them).

        Returns
        -------
        callable
            Arrays to the request's ``GaussianMechanism``.

        Examples
        --------
        >>> import numpy as np
        >>> for_arrays = LocalPlacement().mechanism_for(RoundSpec("run", 1, 1.0, 1.0), ClientPolicy())
        >>> for_arrays([np.zeros(2)]).placement
        'local'
        """
        return lambda arrays: GaussianMechanism.for_request(spec)

    def check_ledger(self, ledger: BudgetLedger) -> None:
        """Nothing to check: a local report's worst-case charge is its main one, under any filter.

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
        ...     enrol_device({"ledger-dir": root + "/dev", "budget-epsilon": 4.0})
        ...     ledger = BudgetLedger.open(root + "/dev")
        ...     print(LocalPlacement().check_ledger(ledger))
        ...     ledger.close()
        None
        """

    def released(self, admitted: AdmittedRound, update: list[np.ndarray]) -> list[np.ndarray]:
        """The floating-point arrays: integer buffers (a batch count reveals the data size) never leave.

        Parameters
        ----------
        admitted : AdmittedRound
            The round.
        update : list of numpy.ndarray
            ``returned - received``.

        Returns
        -------
        list of numpy.ndarray
            The floating-point arrays, in model order.

        Examples
        --------
        >>> import numpy as np
        >>> from fedfilter.client.settings.node_config import device_config
        >>> spec = RoundSpec("run", 1, 1.0, 1.0)
        >>> admitted = AdmittedRound(spec, device_config({"ledger-dir": "dev", "budget-epsilon": 4.0}), 0.0,
        ...                          ["w", "batches"], [np.zeros(2, np.float32), np.zeros((), np.int64)], [0],
        ...                          LocalPlacement().mechanism_for(spec, ClientPolicy()))
        >>> LocalPlacement().released(admitted, [np.ones(2, np.float32), np.array(5)])  # the count stays
        [array([1., 1.], dtype=float32)]
        """
        return [update[i] for i in admitted.floating]

    def reply(self, msg: Message, admitted: AdmittedRound, release: Release) -> Message:
        """Status ``left`` alone, or the noisy update (zeros for the arrays not released) and ``report``.

        Parameters
        ----------
        msg : Message
            The train message.
        admitted : AdmittedRound
            The round.
        release : Release
            The round's release.

        Returns
        -------
        Message
            The reply: the ``fedfilter.status`` record, and the ``arrays`` of a report.

        Examples
        --------
        >>> import numpy as np
        >>> import time
        >>> from flwr.app import Metadata
        >>> meta = Metadata(run_id=1, message_id="m", src_node_id=1, dst_node_id=2, reply_to_message_id="",
        ...                 group_id="1", created_at=time.time(), ttl=60.0, message_type="train")
        >>> from fedfilter.client.settings.node_config import device_config
        >>> spec = RoundSpec("run", 1, 1.0, 1.0)
        >>> admitted = AdmittedRound(spec, device_config({"ledger-dir": "dev", "budget-epsilon": 4.0}), 0.0,
        ...                          ["w", "batches"], [np.zeros(2, np.float32), np.zeros((), np.int64)], [0],
        ...                          LocalPlacement().mechanism_for(spec, ClientPolicy()))
        >>> rel = Release("contributed", [np.full(2, 0.5, np.float32)], 1.0, 1.0, np.zeros(1), np.zeros(1), None)
        >>> reply = LocalPlacement().reply(Message(RecordDict(), metadata=meta), admitted, rel)
        >>> reply.content[STATUS_RECORD]["status"], reply.content[ARRAYS_RECORD]["w"].numpy()
        ('report', array([0.5, 0.5], dtype=float32))
        """
        content = RecordDict()
        if release.status == "left" or release.arrays is None:  # only a device that left releases nothing
            content[STATUS_RECORD] = ConfigRecord({"status": STATUS_LEFT})
            return Message(content, reply_to=msg)
        out = [np.zeros_like(a) for a in admitted.received]
        for i, noisy in zip(admitted.floating, release.arrays):
            out[i] = noisy
        arrays = {k: encode(a) for k, a in zip(admitted.keys, out)}
        if admitted.spec.clipped_count_stddev:  # adaptive clipping: the noisy clip bit, after the model
            arrays[CLIP_BIT_KEY] = encode(release.arrays[-1])
        content[ARRAYS_RECORD] = ArrayRecord(arrays)
        content[STATUS_RECORD] = ConfigRecord({"status": STATUS_REPORT})
        return Message(content, reply_to=msg)


_LOCAL = LocalPlacement()
# The placement secure_aggregation_mod installed for its masked stage; unset: local.
_INSTALLED: ContextVar[Placement | None] = ContextVar("fedfilter_placement", default=None)


def installed_placement() -> Placement:
    """The placement of the message being handled: ``LocalPlacement`` unless one is installed.

    Examples
    --------
    >>> type(installed_placement()).__name__
    'LocalPlacement'
    """
    placement = _INSTALLED.get()
    return _LOCAL if placement is None else placement


@contextmanager
def install_placement(placement: Placement) -> Iterator[None]:
    """Make ``placement`` the installed one for exactly the ``with`` block (``secure_aggregation_mod`` only).

    Parameters
    ----------
    placement : Placement
        The masked stage's placement.

    Examples
    --------
    >>> with install_placement(LocalPlacement()):
    ...     type(installed_placement()).__name__
    'LocalPlacement'
    """
    token = _INSTALLED.set(placement)
    try:
        yield
    finally:
        _INSTALLED.reset(token)
