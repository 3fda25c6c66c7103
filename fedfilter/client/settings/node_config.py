"""The device owner's settings (``context.node_config``), parsed and checked, and enrolment.

The coordinator cannot set any of these: in the Deployment Engine they come from
``flower-supernode --node-config``; in the Simulation Engine from ``simulated_device_config_mod``
(``fedfilter.client.filter_mod``).

Device settings (``context.node_config``; in the Deployment Engine from
``flower-supernode --node-config "ledger-dir='/var/lib/fedfilter' budget-epsilon=8.0 ..."``):

=======================  ========  ==========================================================
key                      default   meaning
=======================  ========  ==========================================================
``ledger-dir``           required  directory of the device's budget ledger, enrolled by its owner
                                   beforehand (``fedfilter ledger enrol``; ``enrol_device``)
``budget-epsilon``       (none)    if given, the enrolment must match it (with ``budget-delta``,
                                   ``filter``, ``run-quota``, ``client-id``); never enrols
``budget-delta``         1e-5      personal delta
``worst-case-epsilon``   (none)    the budget against ANY coordinator (one that forges SecAgg+
                                   peers), at ``budget-delta``: set at enrolment or by
                                   ``fedfilter ledger worst-case``; if given, the ledger's must
                                   match. Without it the device refuses distributed rounds
                                   (``client/ledger/worst_case.py``)
``filter``               gdp       ``gdp``, ``zcdp`` or ``rdp``
``rdp-order``            (best)    ``rdp`` only: the one Rényi order the filter is held at (default:
                                   the budget's best for Gaussian rounds). A device that samples
                                   itself fixes it from its plan (``fedfilter rounds
                                   --sampling-rate``, ``order_for_rate``)
``max-sampling-rate``    1.0       the largest rate at which this device puts its update in a reply
                                   when the request carries a plan's asks (``planned-asks``); its
                                   rate is otherwise its own (``client/mechanisms/sampled.py``)
``run-quota``            1.0       share of the lifetime budget one run may spend (and the same
                                   share of worst-case-epsilon's: each quota caps both accounts)
``client-id``            (enrolled) name stored in the ledger at enrolment (there: default the
                                   directory's name); if given, the enrolment must match it
``federation``           default   the coordinator this device serves; every run is charged to it
``coordinator-quota``    1.0       share of the lifetime budget that federation may ever spend
``daily-quota``          1.0       share of the lifetime budget spent in any 24 hours
``min-noise-multiplier`` 0.5       smallest noise multiplier this device accepts
``after-exhaustion``     noise-only  ``noise-only`` or ``leave``
                                   (``placement = "distributed"`` has no key: a device serves it
                                   exactly when SecAgg+ masks its reply, i.e. its ClientApp lists
                                   ``secure_aggregation_mod`` before ``individual_filter_mod``)
``max-min-reports``      100       largest ``min-reports`` accepted (each distributed report
                                   carries 1/m of the accounted noise variance)
``secagg-colluders``     0         the most devices of a SecAgg+ neighbourhood that may be the
                                   coordinator's own or collude with it; the device requires
                                   threshold >= min-reports + this (``protocol/secagg/rule.py``)
``secagg-min-threshold`` 2         smallest SecAgg+ threshold accepted
``noise-seed``           (none)    reproducible noise for tests ONLY: whoever knows it can
                                   subtract the noise. Default: OS cryptographic randomness.
``reply-hold-s``         60        every reply after the ledger is touched leaves at arrival
                                   + a whole multiple of this (``client/flower/reply_timing.py``);
                                   0 turns timing protection off (simulations only)
=======================  ========  ==========================================================
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fedfilter.client.ledger.budget import BudgetLedger
from fedfilter.client.ledger.quota import Quotas
from fedfilter.client.settings.policy import ClientPolicy, SecAggGraphPolicy
from fedfilter.protocol.request import AFTER_EXHAUSTION

NODE_CONFIG_KEYS = (
    "ledger-dir",
    "budget-epsilon",
    "budget-delta",
    "worst-case-epsilon",
    "filter",
    "rdp-order",
    "run-quota",
    "client-id",
    "federation",
    "coordinator-quota",
    "daily-quota",
    "min-noise-multiplier",
    "max-sampling-rate",
    "after-exhaustion",
    "max-min-reports",
    "secagg-colluders",
    "secagg-min-threshold",
    "noise-seed",
    "reply-hold-s",
    "secagg-identity-key",  # SecAgg+ peer-key pinning (client/secagg/pinning.py)
    "secagg-pinned-peers",
)


# Keys earlier versions read. Each is refused by name rather than ignored: an owner who set one relied
# on an assumption the device no longer makes.
RETIRED_KEYS = {
    key: (
        f"node-config {key!r} is no longer read: the device's main guarantee no longer rests on the "
        "coordinator's graph or population (every graph it accepts gives each unmasked sum min-reports "
        "honest reports), so no per-round graph failure probability, drop-out or corruption rate is "
        "assumed. Remove it; to allow devices that collude with the coordinator, set 'secagg-colluders'."
    )
    for key in ("secagg-max-failure-probability", "secagg-dropout-rate", "secagg-corrupt-rate")
}


@dataclass(frozen=True)
class DeviceConfig:
    """The device owner's settings, read from ``context.node_config`` only.

    Attributes
    ----------
    ledger_dir : pathlib.Path
        The device's ledger directory.
    budget_epsilon : float or None
        The budget the enrolment must match (None: not compared).
    budget_delta : float
        The personal delta.
    filter_kind : str
        ``gdp``, ``zcdp`` or ``rdp``.
    run_quota : float
        The share of the budget one run may spend.
    client_id : str or None
        The enrolled name to match (None: whatever the ledger holds).
    policy : ClientPolicy
        What requests the device accepts.
    noise_seed : int or None
        Reproducible noise, for tests only.
    quotas : Quotas
        The coordinator and daily quotas.
    worst_case_epsilon : float or None
        The worst-case budget the ledger's must match.
    rdp_order : float or None
        The rdp filter's one order (None: the budget's best for Gaussian rounds).

    Examples
    --------
    >>> config = device_config({"ledger-dir": "/var/lib/fedfilter", "budget-epsilon": 8.0})
    >>> config.ledger_dir, config.budget_epsilon, config.filter_kind
    (PosixPath('/var/lib/fedfilter'), 8.0, 'gdp')
    """

    ledger_dir: Path
    budget_epsilon: float | None
    budget_delta: float
    filter_kind: str
    run_quota: float
    client_id: str | None  # None: whatever the ledger was enrolled with (a default cannot mismatch)
    policy: ClientPolicy
    noise_seed: int | None
    quotas: Quotas
    worst_case_epsilon: float | None = None
    rdp_order: float | None = None

    def open_ledger(self) -> BudgetLedger:
        """Open the enrolled ledger; never enrol (fail closed: a lost ledger is no fresh budget).

        With ``budget-epsilon`` set, the enrolment must be the one the settings describe.

        Returns
        -------
        BudgetLedger

        Examples
        --------
        >>> import tempfile
        >>> from pathlib import Path
        >>> from fedfilter.client.ledger.owner_state import owner_state_at
        >>> with tempfile.TemporaryDirectory() as tmp, owner_state_at(Path(tmp) / "owner"):
        ...     device_config({"ledger-dir": f"{tmp}/dev0", "budget-epsilon": 8.0}).enrol().close()
        ...     ledger = device_config({"ledger-dir": f"{tmp}/dev0"}).open_ledger()
        ...     print(ledger.enrolment.client_id, ledger.enrolment.epsilon)
        ...     ledger.close()
        dev0 8.0
        """
        ledger = BudgetLedger.open(self.ledger_dir, quotas=self.quotas)
        if self.budget_epsilon is not None:
            e = ledger.enrolment
            pairs = (
                ("client-id", e.client_id, self.client_id),
                ("filter", e.filter_kind, self.filter_kind),
                ("budget-epsilon", e.epsilon, self.budget_epsilon),
                ("budget-delta", e.delta, self.budget_delta),
                ("run-quota", e.run_quota, self.run_quota),
                ("rdp-order", e.orders, None if self.rdp_order is None else (float(self.rdp_order),)),
            )
            # A key the node-config leaves out of client-id is not compared: its default is the enrolment.
            diffs = [(n, a, b) for n, a, b in pairs if b is not None and a != b]
            if diffs:
                ledger.close()
                raise EnrolmentMismatch(self.ledger_dir, diffs)
        if self.worst_case_epsilon is not None:
            stored_worst = ledger.worst_case.epsilon if ledger.worst_case is not None else None
            if stored_worst != self.worst_case_epsilon:
                ledger.close()
                raise EnrolmentMismatch(
                    self.ledger_dir, [("worst-case-epsilon", stored_worst, self.worst_case_epsilon)]
                )
        return ledger

    def enrol(self, *, recover: str | None = None) -> BudgetLedger:
        """The owner's act, once, before the device serves rounds (see ``enrol_device``).

        Parameters
        ----------
        recover : str, optional
            ``"reseal"`` or ``"replace"`` (``BudgetLedger.enrol``).

        Returns
        -------
        BudgetLedger

        Examples
        --------
        >>> import tempfile
        >>> from pathlib import Path
        >>> from fedfilter.client.ledger.owner_state import owner_state_at
        >>> with tempfile.TemporaryDirectory() as tmp, owner_state_at(Path(tmp) / "owner"):
        ...     ledger = device_config({"ledger-dir": f"{tmp}/dev0", "budget-epsilon": 8.0}).enrol()
        ...     print(ledger.spent_epsilon())
        ...     ledger.close()
        0.0
        """
        if self.budget_epsilon is None:
            raise ValueError("node-config 'budget-epsilon' is required to enrol the device.")
        return BudgetLedger.enrol(
            self.ledger_dir,
            client_id=self.client_id or self.ledger_dir.resolve().name,
            epsilon=self.budget_epsilon,
            delta=self.budget_delta,
            filter_kind=self.filter_kind,
            run_quota=self.run_quota,
            quotas=self.quotas,
            recover=recover,
            worst_case_epsilon=self.worst_case_epsilon,
            orders=None if self.rdp_order is None else [self.rdp_order],
        )


class EnrolmentMismatch(ValueError):
    """The node-config describes another enrolment than the ledger holds.

    ``str(err)`` has the values (the device's log); ``err.public`` names only the keys that differ,
    which depend on the owner's settings, never on the data or the budget spent.

    Parameters
    ----------
    ledger_dir : pathlib.Path
        The ledger directory.
    diffs : list of tuple of (str, Any, Any)
        ``(key, enrolled, node-config)`` per key that differs.

    Examples
    --------
    >>> from pathlib import Path
    >>> err = EnrolmentMismatch(Path("led"), [("budget-epsilon", 8.0, 4.0)])
    >>> print(err)
    the ledger at led is enrolled with other settings than this node's (budget-epsilon: enrolled 8.0, node-config 4.0).
    >>> "'budget-epsilon'" in err.public and "8.0" not in err.public
    True
    """

    def __init__(self, ledger_dir: Path, diffs: list[tuple[str, Any, Any]]):
        detail = "; ".join(f"{n}: enrolled {a!r}, node-config {b!r}" for n, a, b in diffs)
        super().__init__(f"the ledger at {ledger_dir} is enrolled with other settings than this node's ({detail}).")
        names = ", ".join(repr(n) for n, _, _ in diffs)
        self.public = (
            f"this device's settings differ from its ledger's enrolment in {names} (values in the device's "
            "log): its owner corrects the settings to match `fedfilter ledger show`."
        )


def _as_float(value: Any) -> float:
    if isinstance(value, bool):
        raise TypeError
    return float(value)  # int, float, or a numeric string from --node-config


def _as_int(value: Any) -> int:
    if isinstance(value, bool):
        raise TypeError
    if isinstance(value, float) and not value.is_integer():
        raise TypeError
    return int(value)


def device_config(node_config: Mapping[str, Any]) -> DeviceConfig:
    """Parse the device's settings; ``ValueError`` lists every problem at once.

    Parameters
    ----------
    node_config : Mapping[str, Any]
        The node's settings (the module's table of keys).

    Returns
    -------
    DeviceConfig

    Examples
    --------
    >>> device_config({"ledger-dir": "/var/lib/fedfilter", "daily-quota": 0.1}).quotas
    Quotas(federation='default', coordinator=1.0, daily=0.1)
    >>> device_config({"budget-epsilon": "x"})  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: invalid fedfilter device config: ... node-config 'budget-epsilon' has an invalid value 'x'.
    """
    problems: list[str] = []

    def get(key, convert, default):
        if key not in node_config:
            return default
        value = node_config[key]
        try:
            return convert(value)
        except (TypeError, ValueError):
            problems.append(f"node-config {key!r} has an invalid value {value!r}.")
            return default

    ledger_dir = node_config.get("ledger-dir")
    if not (isinstance(ledger_dir, str) and ledger_dir.strip()):
        problems.append(f"node-config 'ledger-dir' must name the device's ledger directory. Found {ledger_dir!r}.")
        ledger_dir = "."
    epsilon = get("budget-epsilon", _as_float, None)
    delta = get("budget-delta", _as_float, 1e-5)
    worst_case_epsilon = get("worst-case-epsilon", _as_float, None)
    filter_kind = str(node_config.get("filter", "gdp"))
    rdp_order = get("rdp-order", _as_float, None)
    if rdp_order is not None and (filter_kind != "rdp" or not (math.isfinite(rdp_order) and rdp_order > 1)):
        problems.append(
            f"node-config 'rdp-order' needs filter 'rdp' and an order > 1. Found {node_config['rdp-order']!r}."
        )
        rdp_order = None
    max_rate = get("max-sampling-rate", _as_float, ClientPolicy.max_sampling_rate)
    run_quota = get("run-quota", _as_float, 1.0)
    client_id = str(node_config.get("client-id", "")) or None
    min_z = get("min-noise-multiplier", _as_float, ClientPolicy.min_noise_multiplier)
    after = str(node_config.get("after-exhaustion", ClientPolicy.after_exhaustion))
    if after not in AFTER_EXHAUSTION:
        problems.append(f"node-config 'after-exhaustion' must be one of {AFTER_EXHAUSTION}. Found {after!r}.")
        after = ClientPolicy.after_exhaustion
    federation = str(node_config.get("federation", Quotas.federation))
    coordinator_quota = get("coordinator-quota", _as_float, Quotas.coordinator)
    daily_quota = get("daily-quota", _as_float, Quotas.daily)
    max_m = get("max-min-reports", _as_int, ClientPolicy.max_min_reports)
    seed = get("noise-seed", _as_int, None)
    graph = SecAggGraphPolicy()
    policy: ClientPolicy | None = None
    quotas: Quotas | None = None
    problems += [why for key, why in RETIRED_KEYS.items() if key in node_config]
    try:
        graph = SecAggGraphPolicy(
            min_threshold=get("secagg-min-threshold", _as_int, graph.min_threshold),
            colluders=get("secagg-colluders", _as_int, graph.colluders),
        )
    except ValueError as err:
        problems.append(f"node-config 'secagg-*': {err}")
    try:
        policy = ClientPolicy(
            min_noise_multiplier=min_z,
            after_exhaustion=after,
            max_min_reports=max_m,
            secagg_graph=graph,
            max_sampling_rate=max_rate,
        )
    except ValueError as err:
        problems.append(str(err))
    try:
        quotas = Quotas(federation=federation, coordinator=coordinator_quota, daily=daily_quota)
    except ValueError as err:
        problems.append(f"node-config 'federation', 'coordinator-quota' or 'daily-quota': {err}")
    if problems or policy is None or quotas is None:
        raise ValueError("invalid fedfilter device config: " + " ".join(problems))
    return DeviceConfig(
        Path(ledger_dir),
        epsilon,
        delta,
        filter_kind,
        run_quota,
        client_id,
        policy,
        seed,
        quotas,
        worst_case_epsilon,
        rdp_order,
    )


def enrol_device(node_config: Mapping[str, Any]) -> None:
    """Enrol a device from its settings: the owner's act, done once before its SuperNode starts.

    The one way to enrol (simulations and tests do it up front, ``fedfilter ledger enrol`` from the
    command line). Idempotent for the same budget; refuses a device whose ledger was lost (a lost
    ledger is no fresh budget: see ``BudgetLedger.enrol``).

    Parameters
    ----------
    node_config : Mapping[str, Any]
        The device's settings as its SuperNode gets them (``NODE_CONFIG_KEYS``): at least
        ``ledger-dir`` and ``budget-epsilon``; ``budget-delta``, ``filter``, ``run-quota``,
        ``client-id``, ``worst-case-epsilon`` and the quotas are optional.

    Raises
    ------
    ValueError
        A setting is missing or invalid (every problem is named at once), or the ledger directory
        holds another enrolment.

    Examples
    --------
    The owner's roll-back anchor goes to the owner's state directory, so this is not run as a doctest:

    >>> settings = {"ledger-dir": "/var/lib/fedfilter", "budget-epsilon": 8.0, "filter": "gdp"}
    >>> enrol_device(settings)  # doctest: +SKIP
    >>> enrol_device(settings)  # the same budget again: nothing changes  # doctest: +SKIP
    """
    device_config(node_config).enrol().close()


def enrol_simulated_device(node_config: Mapping[str, Any]) -> None:
    """``enrol_device`` for the devices a local trial simulates in its own output folder (the demo,
    ``deploy-local``). A device whose ledger directory does not exist is a new device, even if this
    machine's roll-back anchors remember an earlier simulated device at that path (the folder was
    deleted and is used again): its simulated owner starts a new ledger (``recover="replace"``). An
    existing directory is enrolled as any owner's device is (a lost ledger fails closed).

    Parameters
    ----------
    node_config : Mapping[str, Any]
        The simulated device's settings (at least ``ledger-dir`` and ``budget-epsilon``).

    Examples
    --------
    >>> import tempfile
    >>> from pathlib import Path
    >>> from fedfilter.client.ledger.owner_state import owner_state_at
    >>> with tempfile.TemporaryDirectory() as tmp, owner_state_at(Path(tmp) / "owner"):
    ...     enrol_simulated_device({"ledger-dir": f"{tmp}/dev0", "budget-epsilon": 8.0})
    ...     (Path(tmp) / "dev0" / "budget_ledger.sqlite").exists()
    True
    """
    config = device_config(node_config)
    config.enrol(recover=None if config.ledger_dir.exists() else "replace").close()


REPLY_HOLD_KEY = "reply-hold-s"


# A deployed device holds every reply for a minute unless its owner says otherwise. In the
# Deployment Engine each message starts a fresh process and the built-in ClientApp imports torch
# (about 2.3 s), loads its partition and trains inside the hold: seconds on a laptop, so a minute
# leaves room for slow phones and busy machines, and even a round that overruns four times still
# arrives within the coordinator's default round timeout (round-timeout-s = 300).
DEFAULT_REPLY_HOLD_S = 60.0


# An hour: a round held longer is almost surely a unit mistake (milliseconds for seconds).
MAX_REPLY_HOLD_S = 3600.0


def reply_hold_s(node_config: Mapping[str, Any]) -> float:
    """The owner's ``reply-hold-s`` (0 turns the hold off); ``ValueError`` names key and value.

    Parameters
    ----------
    node_config : Mapping[str, Any]
        The node's settings.

    Returns
    -------
    float
        Seconds, in ``[0, MAX_REPLY_HOLD_S]``.

    Examples
    --------
    >>> reply_hold_s({}), reply_hold_s({"reply-hold-s": "0"})
    (60.0, 0.0)
    """
    value = node_config.get(REPLY_HOLD_KEY, DEFAULT_REPLY_HOLD_S)
    try:
        if isinstance(value, bool):
            raise TypeError
        hold = float(value)  # int, float, or a numeric string from --node-config
    except (TypeError, ValueError):
        hold = math.nan
    if not (math.isfinite(hold) and 0.0 <= hold <= MAX_REPLY_HOLD_S):
        raise ValueError(
            f"node-config {REPLY_HOLD_KEY!r} must be a number of seconds in [0, "
            f"{MAX_REPLY_HOLD_S:g}] (0 turns timing protection off). Found {value!r}."
        )
    return hold
