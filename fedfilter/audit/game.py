"""Canary devices through the real ClientApp and filter mod: the distinguishing game.

A trial is a pair of fresh devices (each its own ledger, enrolled with the audited budget), one per
neighbouring world of the privacy model (DESIGN.md section 1): in world 1 the train handler
returns an update of norm C along a fixed unit direction v (the canary); in world 0 it returns the
model unchanged (no data, update zero). Both run R rounds, where R is the number of rounds the
canary needs to exhaust the budget. N trials give N scores per world.

The attacker is the coordinator. It chose the noise multiplier z and the clip C, and it knows the
claimed budget, hence the clipped norms c_t the canary pays for each round (it runs the open-source
client itself: ``shadow_schedule``). Round t's reply is y_t = c_t v + N(0, (zC)^2 I) in world 1 and
pure noise in world 0, so the Neyman-Pearson statistic is ``sum_t c_t <y_t, v>``; normalised by its
standard deviation zC ||c|| it is N(0, 1) in world 0 and N(||c|| / (zC), 1) in world 1, and
||c|| / (zC) is the budget's mu (Dong, Roth and Su, arXiv 1905.02383 v3, Corollary 3.3: composed
Gaussians are exactly sqrt(sum mu_t^2)-GDP).

Noise multiplier: z = sqrt(R0) / mu_B, with mu_B the largest mu the claim allows (exact Gaussian
curve), makes R0 full-norm rounds cost exactly the budget (R0 = ``rounds``, 3 by default). The
filter rounds every charge up and every allowance down, so the last full round is clipped a little
and a sliver round (about 0.1% of C) may follow: ``shadow_schedule`` finds out, R is R0 or R0 + 1.

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
    """What is audited (the claim) and how the canary devices are set up."""

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
        return gaussian_dp.mu_for_budget(self.epsilon, self.delta)

    @cached_property
    def noise_multiplier(self) -> float:
        return math.sqrt(self.rounds) / self.claimed_mu

    @property
    def noise_std(self) -> float:
        return self.noise_multiplier * self.clip


@contextmanager
def reuse_budget_solves() -> Iterator[None]:
    """Solve each budget's mu_B once per process while the audit runs.

    Every canary device enrols a fresh ledger, and every ledger builds its filter with an exact
    60-digit solve of the same (epsilon, delta): over half of a trial's time. ``mu_for_budget`` is a
    pure function, so the cached one returns exactly what it would have computed.
    """
    original = gaussian_dp.mu_for_budget
    gaussian_dp.mu_for_budget = lru_cache(maxsize=64)(original)
    try:
        yield
    finally:
        gaussian_dp.mu_for_budget = original


def canary_direction(rng: np.random.Generator) -> np.ndarray:
    """A random unit vector over all parameters (float64), known to the attacker."""
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
    return np.concatenate([np.asarray(a, dtype=np.float64).ravel() for a in arrays])


def make_app(update: np.ndarray | None) -> ClientApp:
    """A ClientApp whose train handler adds ``update`` to the model (None: returns it unchanged).

    The handler does the same work in both worlds, so the worlds differ only in the update.
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
    """The coordinator's train message: a zero model in ``cfg.dtype`` and the round request."""
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
    """One canary device: its own ledger directory and Flower Context."""

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
        self.context.node_config["reply-hold-s"] = float(seconds)

    def statuses(self) -> list[tuple[str, float]]:
        ledger = BudgetLedger.open(self.directory)
        try:
            return [(r.status, r.sensitivity) for r in ledger.records()]
        finally:
            ledger.close()


class DeviceRefused(RuntimeError):
    """A canary device answered a round with an error (e.g. it refuses the model's dtype)."""


@dataclass
class Reply:
    arrays: list[np.ndarray]
    seconds: float  # wall-clock round trip of the call, as the coordinator times it
    metadata_seconds: float  # reply.created_at - request.created_at, sent in the reply itself
    nbytes: int  # serialized size of the reply message


def ask(app: ClientApp, cfg: GameConfig, device: Device, round_id: int) -> Reply:
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
    """What the exhaustion distinguishers look at in one probe reply (its arrays are dropped)."""
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
    score0: float  # normalised attack score, world 0 (no data)
    score1: float  # world 1 (canary)
    noise_only: dict[str, float]  # probe round: the exhausted world-1 device
    contributing: dict[str, float]  # probe round: the world-0 device, which still has its whole budget


@dataclass
class GameRun:
    cfg: GameConfig
    weights: np.ndarray  # c_t
    trials: list[Trial] = field(default_factory=list)
    verified: int = 0  # trials whose ledgers were read back and matched the schedule

    @property
    def effective_mu(self) -> float:
        """The mu the attack's score separates the worlds by, if the claim is tight."""
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

    ``seeded``: derive each device's ``noise-seed`` from ``rng`` (reproducible, for tests);
    otherwise the devices draw noise from the OS as deployed devices do.
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
    return (np.array([t.score0 for t in run.trials]), np.array([t.score1 for t in run.trials]))


def probe_table(run: GameRun) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """Per feature, the values of all trials' noise-only and contributing probe replies."""
    keys = run.trials[0].noise_only.keys()
    return (
        {k: np.array([t.noise_only[k] for t in run.trials]) for k in keys},
        {k: np.array([t.contributing[k] for t in run.trials]) for k in keys},
    )
