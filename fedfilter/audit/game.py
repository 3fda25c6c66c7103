"""Canary devices through the real ClientApp and filter mod: the distinguishing game.

A trial is a pair of fresh devices (each its own ledger, enrolled with the audited budget), one per
neighbouring world of the privacy model: in world 1 the train handler returns an update of norm C
along a fixed unit direction v (the canary); in world 0 it returns the model unchanged (no data,
update zero). Both run R rounds, where R is the number of rounds the canary needs to exhaust
the budget. N trials give N scores per world.

The attacker is the coordinator: it knows the clipped norms c_t the canary pays for
(``shadow_schedule``) and scores each device with the Neyman-Pearson statistic ``sum_t c_t <y_t, v>``,
normalised to N(0, 1) in world 0 and N(mu, 1) in world 1, mu the budget's. The noise multiplier
z = sqrt(R0) / mu_B makes R0 = ``rounds`` full-norm rounds cost exactly the budget; R is R0 or
R0 + 1 (a sliver round may follow). Derivation: docs/derivations/audit.md.

After the R rounds, one more "probe" round asks both devices for the canary: the world-1 device
is exhausted and answers noise-only, the world-0 device (which has paid nothing) contributes the
canary. The two replies, taken in random order, feed the exhaustion distinguishers.
"""

from __future__ import annotations

import math
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import cached_property, lru_cache
from pathlib import Path

import numpy as np
from flwr.app import Array, ArrayRecord, Context, Message, Metadata, RecordDict, UserConfig
from flwr.clientapp import ClientApp

from fedfilter.audit.distinguishers import bits_features
from fedfilter.checks import positive_finite
from fedfilter.client.filter_mod import individual_filter_mod
from fedfilter.client.ledger.budget import BudgetLedger
from fedfilter.client.ledger.owner_state import owner_state_at
from fedfilter.client.settings.node_config import enrol_device
from fedfilter.privacy import gaussian_dp
from fedfilter.protocol.flower_api import message_to_proto
from fedfilter.protocol.request import RoundSpec
from fedfilter.protocol.wire import ARRAYS_RECORD, REQUEST_RECORD, STATUS_RECORD, STATUS_REPORT, request_record

KEYS = ("w", "b")
SHAPES = ((32, 32), (32,))  # 1056 parameters: many low-order bits per reply, still fast
RUN_ID = "audit"
_NODE_BASE = 2**21


@dataclass(frozen=True)
class GameConfig:
    """What is audited (the claim) and how the canary devices are set up.

    Parameters
    ----------
    epsilon : float
        The claimed budget.
    delta : float, optional
        The claimed delta.
    filter_kind : str, optional
        The canaries' privacy filter.
    rounds : int, optional
        R0: full-norm rounds that exhaust the claimed budget (sets the noise multiplier).
    clip : float, optional
        The clip norm C.
    dtype : str, optional
        The model's dtype, chosen by the coordinator (``float32`` or ``float64``).
    device_epsilon : float, optional
        The budget the devices are actually enrolled with; None means the claim. Only a test that
        checks the audit can catch an understated claim sets it.
    reply_hold_s : float, optional
        The owner's reply hold the devices apply in the probe round, whose reply times feed the
        timing distinguishers; the budget rounds run without it. Deployed devices default to 60 s;
        a small hold keeps the audit quick.

    Raises
    ------
    ValueError
        Naming every bad setting at once.

    Examples
    --------
    >>> cfg = GameConfig(epsilon=2.0)
    >>> round(cfg.claimed_mu, 4), round(cfg.noise_multiplier, 4)
    (0.5016, 3.4534)
    """

    epsilon: float
    delta: float = 1e-5
    filter_kind: str = "gdp"
    rounds: int = 3  # R0: full-norm rounds that exhaust the claimed budget
    clip: float = 1.0
    dtype: str = "float32"  # the model's dtype, chosen by the coordinator
    # The budget the devices are actually enrolled with; None means the claim. Only a test that
    # checks the audit can catch an understated claim sets it.
    device_epsilon: float | None = None
    # The owner's reply hold (client/flower/reply_timing.py) the devices apply in the probe round, whose
    # reply times feed the timing distinguishers; the budget rounds run without it (their times
    # are not looked at). Deployed devices default to 60 s; a small hold keeps the audit quick.
    reply_hold_s: float = 0.02

    def __post_init__(self):
        problems = [p for p in (positive_finite(name, getattr(self, name)) for name in ("epsilon", "clip")) if p]
        if not (isinstance(self.delta, (int, float)) and 0 < self.delta < 1):
            problems.append(f"delta must be in (0, 1). Found {self.delta!r}.")
        if not (isinstance(self.rounds, int) and self.rounds >= 1):
            problems.append(f"rounds must be an integer >= 1. Found {self.rounds!r}.")
        if self.dtype not in ("float32", "float64"):
            problems.append(f"dtype must be float32 or float64. Found {self.dtype!r}.")
        if problems:
            raise ValueError(" ".join(problems))

    @cached_property
    def claimed_mu(self) -> float:
        """The largest mu the claimed (epsilon, delta) allows (exact Gaussian curve).

        Returns
        -------
        float
            mu_B.

        Examples
        --------
        >>> round(GameConfig(epsilon=2.0).claimed_mu, 4)
        0.5016
        """
        return gaussian_dp.mu_for_budget(self.epsilon, self.delta)

    @cached_property
    def noise_multiplier(self) -> float:
        """``sqrt(R0) / mu_B``: R0 full-norm rounds then cost exactly the budget.

        Returns
        -------
        float
            z.

        Examples
        --------
        >>> round(GameConfig(epsilon=2.0, rounds=1).noise_multiplier, 4)
        1.9938
        """
        return math.sqrt(self.rounds) / self.claimed_mu

    @property
    def noise_std(self) -> float:
        """The noise std of a reply, ``z * C``.

        Returns
        -------
        float
            The std.

        Examples
        --------
        >>> round(GameConfig(epsilon=2.0, clip=2.0).noise_std, 4)
        6.9068
        """
        return self.noise_multiplier * self.clip


@contextmanager
def reuse_budget_solves() -> Iterator[None]:
    """Solve each budget's mu_B once per process while the audit runs.

    Every canary device enrols a fresh ledger, and every ledger builds its filter with an exact
    60-digit solve of the same (epsilon, delta): over half of a trial's time. ``mu_for_budget`` is a
    pure function, so the cached one returns exactly what it would have computed.

    Examples
    --------
    >>> with reuse_budget_solves():
    ...     first = gaussian_dp.mu_for_budget(2.0, 1e-5)
    ...     first == gaussian_dp.mu_for_budget(2.0, 1e-5)
    True
    """
    original = gaussian_dp.mu_for_budget
    gaussian_dp.mu_for_budget = lru_cache(maxsize=64)(original)
    try:
        yield
    finally:
        gaussian_dp.mu_for_budget = original


def canary_direction(rng: np.random.Generator) -> np.ndarray:
    """A random unit vector over all parameters (float64), known to the attacker.

    Parameters
    ----------
    rng : numpy.random.Generator
        The source of randomness.

    Returns
    -------
    numpy.ndarray
        A unit vector of the model's size.

    Examples
    --------
    >>> v = canary_direction(np.random.default_rng(0))
    >>> v.shape, round(float(np.linalg.norm(v)), 12)
    ((1056,), 1.0)
    """
    v = rng.standard_normal(sum(math.prod(s) for s in SHAPES))
    return v / np.linalg.norm(v)


def _split(flat: np.ndarray) -> list[np.ndarray]:
    out, i = [], 0
    for s in SHAPES:
        n = math.prod(s)
        out.append(flat[i : i + n].reshape(s))
        i += n
    return out


def flatten(arrays) -> np.ndarray:
    """The arrays' values as one float64 vector (in order).

    Parameters
    ----------
    arrays : iterable of array_like
        The model's arrays.

    Returns
    -------
    numpy.ndarray
        The concatenated values.

    Examples
    --------
    >>> flatten([np.ones((2, 2), dtype=np.float32), np.zeros(1)]).tolist()
    [1.0, 1.0, 1.0, 1.0, 0.0]
    """
    return np.concatenate([np.asarray(a, dtype=np.float64).ravel() for a in arrays])


def make_app(update: np.ndarray | None) -> ClientApp:
    """A ClientApp whose train handler adds ``update`` to the model (None: returns it unchanged).

    The handler does the same work in both worlds, so the worlds differ only in the update.

    Parameters
    ----------
    update : numpy.ndarray or None
        The flat update (the canary), or None for no data.

    Returns
    -------
    flwr.clientapp.ClientApp
        The app, inside ``individual_filter_mod``.

    Examples
    --------
    >>> isinstance(make_app(None), ClientApp)
    True
    """
    parts = None if update is None else _split(update)
    app = ClientApp(mods=[individual_filter_mod])

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        record = msg.content.array_records[ARRAYS_RECORD]
        new = {}
        for i, key in enumerate(record.keys()):
            a = record[key].numpy()
            step = 0.0 if parts is None else parts[i]
            new[key] = Array((a.astype(np.float64) + step).astype(a.dtype))
        return Message(RecordDict({ARRAYS_RECORD: ArrayRecord(new)}), reply_to=msg)

    return app


def train_message(cfg: GameConfig, round_id: int, node_id: int) -> Message:
    """The coordinator's train message: a zero model in ``cfg.dtype`` and the round request.

    Parameters
    ----------
    cfg : GameConfig
        The audit's settings.
    round_id : int
        The round.
    node_id : int
        The device it goes to.

    Returns
    -------
    flwr.app.Message
        The message, as the SuperLink would deliver it.

    Examples
    --------
    >>> msg = train_message(GameConfig(epsilon=2.0), round_id=1, node_id=7)
    >>> msg.metadata.message_type, msg.metadata.dst_node_id
    ('train', 7)
    """
    model = ArrayRecord({k: Array(np.zeros(s, dtype=cfg.dtype)) for k, s in zip(KEYS, SHAPES)})
    spec = RoundSpec(run_id=RUN_ID, round_id=round_id, noise_multiplier=cfg.noise_multiplier, clip=cfg.clip)
    content = RecordDict({ARRAYS_RECORD: model, REQUEST_RECORD: request_record(spec)})
    meta = Metadata(
        run_id=1,
        message_id=f"{node_id}-{round_id}",
        src_node_id=1,
        dst_node_id=node_id,
        reply_to_message_id="",
        group_id=str(round_id),
        created_at=time.time(),
        ttl=3600.0,
        message_type="train",
    )
    # The game plays the SuperLink, the one party that gives a message its id; flwr's typed
    # overloads leave out the keyword it uses for that (Message.__init__ accepts it at run time).
    return Message(content=content, metadata=meta)  # type: ignore[call-overload]


class Device:
    """One canary device: its own ledger directory and Flower Context.

    It is enrolled on creation (the owner's act, up front: the mod never enrols).

    Parameters
    ----------
    cfg : GameConfig
        The audit's settings.
    directory : Path
        Its ledger directory.
    node_id : int
        Its node id.
    noise_seed : int or None
        Its ``noise-seed`` (reproducible noise), or None for OS randomness.

    Examples
    --------
    >>> from fedfilter.client.ledger.owner_state import owner_state_at
    >>> with tempfile.TemporaryDirectory() as d, owner_state_at(Path(d) / "owner"):
    ...     device = Device(GameConfig(epsilon=2.0), Path(d) / "dev", node_id=7, noise_seed=0)
    ...     device.context.node_config["client-id"], device.statuses()
    ('canary-7', [])
    """

    def __init__(self, cfg: GameConfig, directory: Path, node_id: int, noise_seed: int | None):
        self.directory, self.node_id = directory, node_id
        node: UserConfig = {
            "ledger-dir": str(directory),
            "client-id": f"canary-{node_id}",
            "budget-epsilon": float(cfg.device_epsilon or cfg.epsilon),
            "budget-delta": float(cfg.delta),
            "filter": cfg.filter_kind,
            "min-noise-multiplier": min(0.5, cfg.noise_multiplier),
        }
        if noise_seed is not None:
            node["noise-seed"] = int(noise_seed)
        node["reply-hold-s"] = 0.0  # budget rounds: see GameConfig.reply_hold_s
        enrol_device(node)  # the owner's act, up front: the mod never enrols
        self.context = Context(run_id=1, node_id=node_id, node_config=node, state=RecordDict(), run_config={})

    def hold_replies(self, seconds: float) -> None:
        """Set the device's reply hold (used for the probe round).

        Parameters
        ----------
        seconds : float
            The hold.

        Examples
        --------
        >>> from fedfilter.client.ledger.owner_state import owner_state_at
        >>> with tempfile.TemporaryDirectory() as d, owner_state_at(Path(d) / "owner"):
        ...     device = Device(GameConfig(epsilon=2.0), Path(d) / "dev", node_id=7, noise_seed=0)
        ...     device.hold_replies(0.05)
        ...     device.context.node_config["reply-hold-s"]
        0.05
        """
        self.context.node_config["reply-hold-s"] = float(seconds)

    def statuses(self) -> list[tuple[str, float]]:
        """The device's ledger records so far: (status, clipped norm) per round.

        Returns
        -------
        list of (str, float)
            E.g. ``("contributed", 1.0)`` or ``("noise-only", 0.0)``.

        Examples
        --------
        >>> from fedfilter.client.ledger.owner_state import owner_state_at
        >>> cfg = GameConfig(epsilon=2.0, reply_hold_s=0.0)
        >>> with tempfile.TemporaryDirectory() as d, owner_state_at(Path(d) / "owner"):
        ...     device = Device(cfg, Path(d) / "dev", node_id=7, noise_seed=0)
        ...     _ = ask(make_app(None), cfg, device, 1)
        ...     device.statuses()
        [('contributed', 0.0)]
        """
        ledger = BudgetLedger.open(self.directory)
        try:
            return [(r.status, r.sensitivity) for r in ledger.records()]
        finally:
            ledger.close()


class DeviceRefused(RuntimeError):
    """A canary device answered a round with an error (e.g. it refuses the model's dtype).

    Examples
    --------
    >>> issubclass(DeviceRefused, RuntimeError)
    True
    """


@dataclass
class Reply:
    """One reply as the coordinator observes it.

    Parameters
    ----------
    arrays : list of numpy.ndarray
        The reply's arrays.
    seconds : float
        Wall-clock round trip of the call, as the coordinator times it.
    metadata_seconds : float
        ``reply.created_at - request.created_at``, sent in the reply itself.
    nbytes : int
        Serialized size of the reply message.

    Examples
    --------
    >>> Reply([np.zeros(3)], seconds=0.01, metadata_seconds=0.01, nbytes=100).nbytes
    100
    """

    arrays: list[np.ndarray]
    seconds: float  # wall-clock round trip of the call, as the coordinator times it
    metadata_seconds: float  # reply.created_at - request.created_at, sent in the reply itself
    nbytes: int  # serialized size of the reply message


def ask(app: ClientApp, cfg: GameConfig, device: Device, round_id: int) -> Reply:
    """One round: send the train message to ``device`` through ``app`` and observe its reply.

    Parameters
    ----------
    app : flwr.clientapp.ClientApp
        ``make_app``'s app (the canary or no data).
    cfg : GameConfig
        The audit's settings.
    device : Device
        The device.
    round_id : int
        The round.

    Returns
    -------
    Reply
        What the coordinator sees.

    Raises
    ------
    DeviceRefused
        The device answered with an error.

    Examples
    --------
    >>> from fedfilter.client.ledger.owner_state import owner_state_at
    >>> cfg = GameConfig(epsilon=2.0, reply_hold_s=0.0)
    >>> with tempfile.TemporaryDirectory() as d, owner_state_at(Path(d) / "owner"):
    ...     device = Device(cfg, Path(d) / "dev", node_id=7, noise_seed=0)
    ...     reply = ask(make_app(None), cfg, device, 1)
    >>> [a.shape for a in reply.arrays]
    [(32, 32), (32,)]
    """
    msg = train_message(cfg, round_id, device.node_id)
    start = time.perf_counter()
    reply = app(msg, device.context)
    seconds = time.perf_counter() - start
    if reply.has_error():
        raise DeviceRefused(f"the canary device refused round {round_id} ({cfg.dtype} model): {reply.error.reason}")
    if reply.content[STATUS_RECORD]["status"] != STATUS_REPORT:
        raise RuntimeError(f"the canary device did not report in round {round_id}")
    arrays = next(iter(reply.content.array_records.values())).to_numpy_ndarrays()
    return Reply(
        arrays, seconds, reply.metadata.created_at - msg.metadata.created_at, message_to_proto(reply).ByteSize()
    )


def shadow_schedule(cfg: GameConfig, v: np.ndarray, max_rounds: int = 1000) -> np.ndarray:
    """The clipped norms c_t a canary device pays for, until it answers noise-only.

    The attacker runs the client code on a device of its own, set up like the canaries (the noise
    is irrelevant: spending depends only on the update).

    Parameters
    ----------
    cfg : GameConfig
        The audit's settings.
    v : numpy.ndarray
        The canary direction.
    max_rounds : int, optional
        Give up after this many rounds.

    Returns
    -------
    numpy.ndarray
        c_t per round the canary contributed.

    Raises
    ------
    RuntimeError
        The canary did not exhaust its budget in ``max_rounds``.

    Examples
    --------
    >>> from fedfilter.client.ledger.owner_state import owner_state_at
    >>> cfg = GameConfig(epsilon=2.0, reply_hold_s=0.0)
    >>> with tempfile.TemporaryDirectory() as d, owner_state_at(Path(d) / "owner"):
    ...     shadow_schedule(cfg, canary_direction(np.random.default_rng(0))).round(6).tolist()
    [1.0, 1.0, 1.0]
    """
    app = make_app(cfg.clip * v)
    with tempfile.TemporaryDirectory(prefix="fedfilter-audit-shadow-") as tmp:
        device = Device(cfg, Path(tmp) / "shadow", node_id=0, noise_seed=0)
        for r in range(1, max_rounds + 1):
            ask(app, cfg, device, r)
            statuses = device.statuses()
            if statuses[-1][0] != "contributed":
                return np.array([s for st, s in statuses if st == "contributed"])
    raise RuntimeError(f"the canary did not exhaust its budget within {max_rounds} rounds")


def probe_features(reply: Reply, v: np.ndarray, std: float) -> dict[str, float]:
    """What the exhaustion distinguishers look at in one probe reply (its arrays are dropped).

    Parameters
    ----------
    reply : Reply
        The probe reply.
    v : numpy.ndarray
        The canary direction.
    std : float
        The noise std.

    Returns
    -------
    dict of str to float
        ``value``, ``time``, ``metadata-time``, ``bytes`` and the ``bits:`` features.

    Examples
    --------
    >>> reply = Reply([np.ones((32, 32)), np.ones(32)], seconds=0.01, metadata_seconds=0.0, nbytes=100)
    >>> features = probe_features(reply, np.ones(1056) / np.sqrt(1056), std=1.0)
    >>> round(features["value"], 4), features["bytes"]
    (32.4962, 100.0)
    """
    out = {
        "value": float(flatten(reply.arrays) @ v),
        "time": reply.seconds,
        "metadata-time": reply.metadata_seconds,
        "bytes": float(reply.nbytes),
    }
    out.update({f"bits:{k}": x for k, x in bits_features(reply.arrays, std).items()})
    return out


@dataclass
class Trial:
    """One pair of canary devices' outcome.

    Parameters
    ----------
    score0 : float
        The normalised attack score in world 0 (no data).
    score1 : float
        The score in world 1 (canary).
    noise_only : dict of str to float
        Probe round: the exhausted world-1 device's reply features.
    contributing : dict of str to float
        Probe round: the world-0 device's, which still has its whole budget.

    Examples
    --------
    >>> Trial(0.1, 0.6, {"bytes": 100.0}, {"bytes": 100.0}).score1
    0.6
    """

    score0: float  # normalised attack score, world 0 (no data)
    score1: float  # world 1 (canary)
    noise_only: dict[str, float]  # probe round: the exhausted world-1 device
    contributing: dict[str, float]  # probe round: the world-0 device, which still has its whole budget


@dataclass
class GameRun:
    """The trials of one game, with the schedule the attacker computed.

    Parameters
    ----------
    cfg : GameConfig
        The audit's settings.
    weights : numpy.ndarray
        c_t (``shadow_schedule``).
    trials : list of Trial, optional
        The trials played.
    verified : int, optional
        Trials whose ledgers were read back and matched the schedule.

    Examples
    --------
    >>> run = GameRun(GameConfig(epsilon=2.0), np.ones(3))
    >>> round(run.effective_mu, 4)
    0.5016
    """

    cfg: GameConfig
    weights: np.ndarray  # c_t
    trials: list[Trial] = field(default_factory=list)
    verified: int = 0  # trials whose ledgers were read back and matched the schedule

    @property
    def effective_mu(self) -> float:
        """The mu the attack's score separates the worlds by, if the claim is tight.

        Returns
        -------
        float
            ``||c|| / (z C)``.

        Examples
        --------
        >>> round(GameRun(GameConfig(epsilon=2.0), np.array([1.0, 1.0, 0.5])).effective_mu, 4)
        0.4344
        """
        return float(np.linalg.norm(self.weights) / self.cfg.noise_std)


def _check_ledgers(x: Device, y: Device, rounds: int) -> None:
    sx, sy = x.statuses(), y.statuses()
    ok = (
        [st for st, _ in sx] == ["contributed"] * rounds + ["noise-only"]
        and [st for st, _ in sy] == ["contributed"] * (rounds + 1)
        and all(s == 0.0 for _, s in sy[:rounds])
        and sy[-1][1] > 0
    )
    if not ok:
        raise RuntimeError(f"a canary device did not follow the schedule: canary {sx}, no-data {sy}")


def play(
    cfg: GameConfig,
    trials: int,
    *,
    rng: np.random.Generator,
    seeded: bool,
    tmp_dir: str | None = None,
    verify_every: int = 25,
    progress: Callable[[int], None] | None = None,
) -> GameRun:
    """Run ``trials`` pairs of fresh canary devices through the real ClientApp and mod.

    Parameters
    ----------
    cfg : GameConfig
        The audit's settings.
    trials : int
        Pairs of devices.
    rng : numpy.random.Generator
        The attacker's randomness (canary, order of the devices).
    seeded : bool
        Derive each device's ``noise-seed`` from ``rng`` (reproducible, for tests); otherwise the
        devices draw noise from the OS as deployed devices do.
    tmp_dir : str, optional
        Where the throw-away ledgers go.
    verify_every : int, optional
        Read every this many trials' ledgers back and check them against the schedule (0: never).
    progress : callable, optional
        Called with 1 after each trial.

    Returns
    -------
    GameRun
        The trials.

    Examples
    --------
    >>> run = play(GameConfig(epsilon=2.0, reply_hold_s=0.0), 2, rng=np.random.default_rng(0), seeded=True)
    >>> len(run.trials), run.verified, run.weights.size
    (2, 1, 3)
    """
    v = canary_direction(rng)
    weights = shadow_schedule(cfg, v)
    run = GameRun(cfg, weights)
    rounds, scale = weights.size, cfg.noise_std * float(np.linalg.norm(weights))
    canary_app, empty_app = make_app(cfg.clip * v), make_app(None)
    with (
        tempfile.TemporaryDirectory(prefix="fedfilter-audit-", dir=tmp_dir) as tmp,
        owner_state_at(Path(tmp) / "owner"),
    ):
        for i in range(trials):  # (the canaries' roll-back anchors stay in the throw-away folder too)
            seeds = rng.integers(0, 2**63, size=2) if seeded else (None, None)
            # Node ids of one width (varints of 4 bytes), so that ids cannot change a reply's size.
            x = Device(cfg, Path(tmp) / f"{i}-canary", _NODE_BASE + 2 * i, seeds[0])
            y = Device(cfg, Path(tmp) / f"{i}-empty", _NODE_BASE + 2 * i + 1, seeds[1])
            score = {x: 0.0, y: 0.0}
            for r in range(1, rounds + 1):
                for dev in (x, y) if rng.random() < 0.5 else (y, x):
                    reply = ask(canary_app if dev is x else empty_app, cfg, dev, r)
                    score[dev] += weights[r - 1] * float(flatten(reply.arrays) @ v)
            probe = {}
            for dev in (x, y):
                dev.hold_replies(cfg.reply_hold_s)
            for dev in (x, y) if rng.random() < 0.5 else (y, x):
                probe[dev] = ask(canary_app, cfg, dev, rounds + 1)
            if verify_every and i % verify_every == 0:
                _check_ledgers(x, y, rounds)
                run.verified += 1
            run.trials.append(
                Trial(
                    score[y] / scale,
                    score[x] / scale,
                    probe_features(probe[x], v, cfg.noise_std),
                    probe_features(probe[y], v, cfg.noise_std),
                )
            )
            for dev in (x, y):  # the mod may keep the file open in its cache: the inode lingers
                shutil.rmtree(dev.directory, ignore_errors=True)
            if progress is not None:
                progress(1)
    return run


def scores(run: GameRun) -> tuple[np.ndarray, np.ndarray]:
    """Both worlds' normalised attack scores, one per trial.

    Parameters
    ----------
    run : GameRun
        The game.

    Returns
    -------
    tuple of numpy.ndarray
        (world 0 scores, world 1 scores).

    Examples
    --------
    >>> run = GameRun(GameConfig(epsilon=2.0), np.ones(3), [Trial(0.1, 0.6, {}, {}), Trial(-0.2, 0.4, {}, {})])
    >>> scores(run)[1].tolist()
    [0.6, 0.4]
    """
    return (np.array([t.score0 for t in run.trials]), np.array([t.score1 for t in run.trials]))


def probe_table(run: GameRun) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """Per feature, the values of all trials' noise-only and contributing probe replies.

    Parameters
    ----------
    run : GameRun
        The game (at least one trial).

    Returns
    -------
    tuple of dict of str to numpy.ndarray
        (noise-only, contributing).

    Examples
    --------
    >>> trials = [Trial(0.0, 0.0, {"bytes": 100.0}, {"bytes": b}) for b in (101.0, 100.0)]
    >>> noise_only, contributing = probe_table(GameRun(GameConfig(epsilon=2.0), np.ones(3), trials))
    >>> contributing["bytes"].tolist()
    [101.0, 100.0]
    """
    keys = run.trials[0].noise_only.keys()
    return (
        {k: np.array([t.noise_only[k] for t in run.trials]) for k in keys},
        {k: np.array([t.contributing[k] for t in run.trials]) for k in keys},
    )
