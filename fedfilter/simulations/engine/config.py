"""What a study asks the vectorised engine for, and what it gets back.

Only data: the engine itself lives in ``fedfilter.simulations.engine.core``. Names follow the Flower path
(``fedfilter.protocol.request.RoundSpec`` and ``ClientPolicy``, ``fedfilter.coordinator.strategy``) so a study can move
between the two without translating settings.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from fedfilter.checks import is_int, positive_finite, short_repr
from fedfilter.client.settings.policy import ClientPolicy
from fedfilter.privacy.bisection import MIN_RATE
from fedfilter.privacy.filters import FILTER_KINDS
from fedfilter.privacy.subsampled import MAX_SUBSAMPLED_ORDER
from fedfilter.protocol.adaptive_clip import AdaptiveClipping, update_noise_multiplier
from fedfilter.protocol.request import AFTER_EXHAUSTION, MAX_PLANNED_ASKS, PLACEMENTS
from fedfilter.protocol.rules import accounted_noise_std, added_noise_std
from fedfilter.protocol.secagg.graph import SecAggGraph

CLIENT_MODES = ("auto", "single-example", "multi-example")
NOISE_DRAWS = ("per-client", "aggregate")
NORMS = ("device", "vectorised", "fast")
# The devices' placements, and "central": Feldman & Zrnic's trusted curator, which no device runs.
ENGINE_PLACEMENTS = (*PLACEMENTS, "central")
GROUP_BY = ("label", "client", "none")
# "individual": each release charged at its certified norm (the device's rule). "worst-case": the
# uniform accounting of a non-individual system (the baseline individual accounting is compared with),
# simulation only.
ACCOUNTINGS = ("individual", "worst-case")
SECAGG_GRAPHS = ("full", "sparse")
# "uniform": each round asks a fresh random subset; "balanced": passes over a shuffled population
# (``fedfilter.planning.participation.BalancedSchedule``), every client asked within one of the others.
PARTICIPATIONS = ("uniform", "balanced", "poisson")


@dataclass(frozen=True)
class EngineConfig:
    """One simulated federation: data split, per-client budgets, round requests and training.

    Parameters
    ----------
    Privacy fields (the same meaning as on a Flower device and in the coordinator's request):

    epsilon
        Personal lifetime budget: one number for every client, or one per client.
    delta, filter_kind, run_quota
        As in ``fedfilter.client.ledger.budget.BudgetLedger.enrol``. ``filter_kind`` is ``gdp`` (exact Gaussian-DP
        filter), ``zcdp`` (Feldman & Zrnic (2021) Theorem 4.9) or ``rdp``.
    noise_multiplier, clip, placement, min_reports
        The coordinator's request (``fedfilter.protocol.request.RoundSpec``): accounted noise std is
        ``sigma = noise_multiplier * clip`` (with ``adaptive_clipping``: ``noise_multiplier`` is the
        accounted ``z_eff`` and ``clip`` the first round's ``C``). ``local``: each report carries
        Gaussian noise of std sigma (the device's float-safe rounded Gaussian). ``distributed``: the
        device's Skellam mechanism on the SecAgg+ grid (``fedfilter.simulations.engine.skellam_round``):
        each report carries ``Sk(mu_share)``, ``mu_share = mu_total / min_reports`` (rounded up),
        ``mu_total = (sigma / gamma)**2`` (rounded down) in grid units, the coordinator sees only the sum mod q, and a
        round with fewer than ``min_reports`` reports is not released; needs ``filter_kind="rdp"``.
        ``central`` (simulation only; Feldman & Zrnic's private GD): the coordinator sums the clipped
        updates and adds one ``N(0, sigma^2 I)`` draw; needs ``noise_draw="aggregate"``.
    secagg_graph, secagg_dropout_rate, secagg_colluders
        Distributed placement: the SecAgg+ neighbourhoods (``fedfilter.protocol.secagg.graph``).
        ``full``: Flower's full graph (every asked client holds a share of every other's secrets);
        ``sparse``: ``choose_graph(n_asked, ...)`` on Flower's ring over a permutation drawn per round,
        sized for ``secagg_dropout_rate``. Either way k and t are the coordinator's
        (``coordinator.secure_round.round_graph``), passing the rule the devices check with
        ``secagg_colluders`` (``protocol/secagg/rule.py``: ``t >= min_reports + colluders``,
        ``2 t > k + colluders``), so every sum that can be unmasked holds ``min_reports`` honest
        reports and no graph failure probability enters any delta. A round is released only when
        the simulated ring can be unmasked (every client keeps ``threshold`` reporting holders, as
        Flower's ``_check_threshold`` requires) and it has ``min_reports`` reports.
    worst_case_epsilon
        The device's worst-case budget (``fedfilter.client.ledger.worst_case``), at ``delta``: one number or
        one per client, each at least that client's ``epsilon``; required with ``placement=
        'distributed'`` (a device without one refuses distributed rounds), where every client also
        keeps the worst-case account (its share ``Sk(mu_share)`` read alone) and stops contributing
        when either account is spent. Local placement: the worst-case account is charged the main
        charges against a budget at least as large, so it never binds and the engine does not keep it.
    adaptive_clipping
        ``fedfilter.protocol.adaptive_clip.AdaptiveClipping`` (Flower's names: target_clipped_quantile,
        clip_norm_lr, clipped_count_stddev, None: clients asked per round / 20), or None for a fixed
        clip. Each asked client clips its update to the round's ``C`` and appends its bit; the
        augmented row is one release, charged at its norm with the clip ``augmented_clip`` and the
        multiplier ``noise_multiplier``; the released mean's bit sets the next round's clip
        (``fedfilter.simulations.engine.adaptive``; every rule from ``fedfilter.protocol.adaptive_clip``).
        Each round's clip is in its ``RoundRecord.clip``. With ``accounting="worst-case"`` a full
        round is the augmented vector's, at the round's clip. ``norms="fast"`` falls back to
        ``vectorised``.
    after_exhaustion
        ``noise-only`` (keeps sending pure-noise reports) or ``leave`` (sends a marker); one value
        or one per client.
    exhausted_below
        ``fedfilter.client.settings.policy.ClientPolicy.exhausted_below``.
    min_noise_multiplier
        ``ClientPolicy.min_noise_multiplier``: a self-sampling client reads whether it is spent at it
        (``privacy.sampling_rate.spent``), as a device does.
    accounting
        ``individual`` (the device's rule: each release is charged at the certified norm of what it
        adds). ``worst-case`` (simulation only; no device runs it): every contribution is charged the
        full round's worst case, as a system without individual accounting does: the charge at the
        allowance of a fresh client (the clip ``C``; distributed: the largest integer-grid L2 a fresh
        client's accounts admit, with its worst-case L1) whatever the update's norm, and a client
        whose budget no longer admits a full round stops contributing (exhausted). Local and
        distributed placement; the clip, noise and mean are unchanged.
    noise_draw
        ``per-client``: every report gets its own noise from the client's generator, seeded
        exactly as ``fedfilter.client.filter_mod`` seeds a device with ``noise-seed =
        client_noise_seed(seed, k)`` (bitwise the Flower path's reports). ``aggregate``: one draw
        for the sum of the round's reports, with the summed variance (same distribution of the
        aggregate; much faster; the individual reports are never materialised).
    norms
        ``device``: each client's certified norm and clip by ``fedfilter.client.mechanisms.gaussian.certified_norm`` /
        ``clip_to_norm``, the functions a device runs (bitwise the Flower path's sensitivities;
        about 0.1-0.3 ms per client). ``vectorised``: the same guarantee (an upper bound on the
        exact norm of what is released, never above the allowance) computed for a whole chunk at
        once (``fedfilter.simulations.engine.norms``); equal to the device's up to ~1e-12 relative, not
        bitwise. ``fast``: single-example clients on models of Linear and Conv2d layers get their
        certified norms and the clipped sum layer by layer from one batched forward and backward
        pass, never forming a per-example gradient of the whole model
        (``fedfilter.simulations.engine.layerwise``; needs ``noise_draw="aggregate"``); each charge is an
        upper bound on the exact norm of what the client adds, within about 2e-6 of it; 1.4 to 1.6
        times a plain batched forward and backward on the MNIST CNN (docs/results.md section 2). Other clients
        and models
        fall back to ``vectorised`` (``Engine.fast_fallback`` says why).
        Filters, allowances and charges are the shared code in every mode.

    Clients and training
    --------------------
    task, num_clients, partition, alpha, partition_seed
        ``fedfilter.simulations.tasks.registry.load_task`` arguments (ignored when ``run_engine`` is given
        a ``task``).
    client_mode
        ``single-example``: every client holds exactly one example and reports ``-lr * gradient``
        (per-example gradients with torch.func, ``chunk_size`` clients at a time).
        ``multi-example``: ``local_epochs`` epochs of SGD per client, exactly as
        ``fedfilter.app.client_app.train`` (same seeds). ``auto``: single-example iff every client has
        one example.
    rounds, fraction
        Rounds to run (``round_id`` 1..rounds, as the ServerApp numbers them) and the share of
        clients asked each round (``fraction < 1`` draws from the engine's own generator, which
        is not the ServerApp's node sampling).
    participation
        With ``fraction < 1``: ``uniform`` (a fresh random subset each round), ``balanced`` (passes
        over a shuffled population, ``fedfilter.planning.participation.BalancedSchedule``, from the
        same sampling seed: after any number of rounds every client has been asked within one of
        every other), or ``poisson`` (central placement only: a trusted server asks each client
        independently with probability ``fraction`` and divides the noisy sum by the expected count
        ``fraction * num_clients``, the amplified DP-FedAvg a trusted server can run).
    planned_asks, max_sampling_rate, rdp_order, expected_rate
        Devices that sample themselves (``client/mechanisms/sampled.py``; 0 asks: off). Each asked
        client spreads what its accounts have left over the ``planned_asks`` its plan still expects
        and puts its update in its report with the rate that buys, at most ``max_sampling_rate``;
        its coin is the first word of its noise stream, as on a device. Needs ``filter_kind="rdp"``
        and individual accounting, or in distributed placement worst-case accounting (each ask
        charged the sampled release of the worst update within the full clip; with
        ``noise_draw="aggregate"`` only the updates the coins keep are trained). ``rdp_order``: the one
        order each client's filter is enrolled at
        (None: the budget's best for Gaussian rounds; ``"plan"``: each budget's own
        ``order_for_rate`` at the rate its budget buys over the plan's asks, as ``fedfilter rounds
        --sampling-rate`` prints it). ``expected_rate``: the plan's mean rate, public; the
        coordinator divides the sum by the reports times it (1: the plain mean).
    server_lr
        The coordinator's step: ``w <- w + server_lr * mean(reports)`` (``fedfilter.protocol.rules.model_step``).
    seed
        Initial model (``torch.manual_seed(seed)`` then ``task.model_fn()``, as the ServerApp)
        and every noise stream (``client_noise_seed``, ``aggregate_noise_rng``).
    model_fn
        Optional replacement for ``task.model_fn`` (e.g. ``lambda: MnistCNN("relu")``).
    eval_every, group_by
        Evaluate on the task's test data every ``eval_every`` rounds (and after the last);
        ``group_by="label"``: test accuracy per label class; ``"client"``: each client's
        accuracy on its own training data (writer, for FEMNIST), an oracle statistic the
        coordinator never sees; ``"none"``.
    local_epochs, lr, batch_size
        Multi-example clients' local SGD; ``lr`` is also the single-example step.
    run_id
        The run every noise stream and account is keyed by.
    chunk_size, torch_threads
        Clients processed at once, and torch's thread count (None leaves it alone).

    Raises
    ------
    ValueError
        Listing every invalid field.

    Examples
    --------
    >>> config = EngineConfig(num_clients=4, epsilon=2.0, noise_multiplier=2.0, clip=0.5)
    >>> config.accounted_std
    1.0
    >>> EngineConfig(num_clients=0)
    Traceback (most recent call last):
    ...
    ValueError: invalid EngineConfig: num_clients must be a positive integer. Found 0.
    """

    task: str = "digits"
    num_clients: int = 10
    partition: str = "iid"
    alpha: float = 0.5
    partition_seed: int = 0
    client_mode: str = "auto"

    epsilon: float | Sequence[float] | np.ndarray = 1.0
    delta: float = 1e-5
    filter_kind: str = "gdp"
    run_quota: float = 1.0
    noise_multiplier: float = 1.0
    clip: float = 1.0
    placement: str = "local"
    min_reports: int = 1
    secagg_graph: str = "full"
    secagg_dropout_rate: float = 0.1
    secagg_colluders: int = 0
    after_exhaustion: str | Sequence[str] = "noise-only"
    worst_case_epsilon: float | Sequence[float] | np.ndarray | None = None
    exhausted_below: float = ClientPolicy.exhausted_below  # the device's default
    min_noise_multiplier: float = ClientPolicy.min_noise_multiplier  # the device's default
    adaptive_clipping: AdaptiveClipping | None = None
    accounting: str = "individual"
    noise_draw: str = "per-client"
    norms: str = "device"

    rounds: int = 5
    fraction: float = 1.0
    participation: str = "uniform"
    local_epochs: int = 2
    lr: float = 0.1
    batch_size: int = 32
    server_lr: float = 1.0
    planned_asks: int = 0
    max_sampling_rate: float = 1.0
    rdp_order: float | str | None = None
    expected_rate: float = 1.0
    seed: int = 0
    run_id: str = "engine"
    model_fn: Callable | None = field(default=None, compare=False, repr=False)

    eval_every: int = 1
    group_by: str = "label"
    chunk_size: int = 1024
    torch_threads: int | None = None  # None: leave torch's setting alone

    def __post_init__(self):
        problems = []

        for name in ("num_clients", "rounds", "min_reports", "local_epochs", "batch_size", "eval_every", "chunk_size"):
            v = getattr(self, name)
            if not (is_int(v) and v > 0):
                problems.append(f"{name} must be a positive integer. Found {short_repr(v)}.")
        for name in ("noise_multiplier", "clip", "lr", "server_lr", "min_noise_multiplier"):
            if (problem := positive_finite(name, getattr(self, name))) is not None:
                problems.append(problem)
        if self.client_mode not in CLIENT_MODES:
            problems.append(f"client_mode must be one of {CLIENT_MODES}. Found {self.client_mode!r}.")
        if self.filter_kind not in FILTER_KINDS:
            problems.append(f"filter_kind must be one of {FILTER_KINDS}. Found {self.filter_kind!r}.")
        if self.placement not in ENGINE_PLACEMENTS:
            problems.append(f"placement must be one of {ENGINE_PLACEMENTS}. Found {self.placement!r}.")
        if self.placement == "distributed" and self.filter_kind != "rdp":
            problems.append(
                "placement='distributed' runs Skellam noise on the SecAgg+ grid, which only the rdp filter "
                f"accounts (devices refuse it otherwise): filter_kind must be 'rdp'. Found {self.filter_kind!r}."
            )
        if self.placement == "central" and self.noise_draw != "aggregate":
            problems.append(
                "placement='central' adds the coordinator's one draw to the sum, so it needs "
                f"noise_draw='aggregate'. Found noise_draw={self.noise_draw!r}."
            )
        if self.accounting not in ACCOUNTINGS:
            problems.append(f"accounting must be one of {ACCOUNTINGS}. Found {self.accounting!r}.")
        elif self.accounting == "worst-case" and self.placement == "central":
            problems.append(
                "accounting='worst-case' is for the devices' placements ('local', 'distributed'). "
                f"Found placement={self.placement!r}."
            )
        if self.secagg_graph not in SECAGG_GRAPHS:
            problems.append(f"secagg_graph must be one of {SECAGG_GRAPHS}. Found {self.secagg_graph!r}.")
        v = self.secagg_dropout_rate
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v < 1:
            problems.append(f"secagg_dropout_rate must be a number in [0, 1). Found {v!r}.")
        c = self.secagg_colluders
        if isinstance(c, bool) or not isinstance(c, int) or c < 0:
            problems.append(f"secagg_colluders must be an integer >= 0. Found {c!r}.")
        if self.noise_draw not in NOISE_DRAWS:
            problems.append(f"noise_draw must be one of {NOISE_DRAWS}. Found {self.noise_draw!r}.")
        if self.norms not in NORMS:
            problems.append(f"norms must be one of {NORMS}. Found {self.norms!r}.")
        if self.norms == "fast" and self.noise_draw != "aggregate":
            problems.append(
                f"norms='fast' forms only the sum of the clipped updates, so it needs "
                f"noise_draw='aggregate'. Found noise_draw={self.noise_draw!r}."
            )
        if self.group_by not in GROUP_BY:
            problems.append(f"group_by must be one of {GROUP_BY}. Found {self.group_by!r}.")
        after = [self.after_exhaustion] if isinstance(self.after_exhaustion, str) else list(self.after_exhaustion)
        bad = sorted({a for a in after if a not in AFTER_EXHAUSTION})
        if bad:
            problems.append(f"after_exhaustion must be among {AFTER_EXHAUSTION}. Found {bad!r}.")
        eps = np.atleast_1d(np.asarray(self.epsilon, dtype=np.float64))
        if not np.all(np.isfinite(eps) & (eps > 0)):
            problems.append(f"epsilon must be finite and > 0 for every client. Found {self.epsilon!r}.")
        if self.worst_case_epsilon is None:
            if self.placement == "distributed":
                problems.append(
                    "placement='distributed' needs worst_case_epsilon (a device without worst-case-epsilon "
                    "refuses distributed rounds: client/ledger/worst_case.py). Found None."
                )
        else:
            worst = np.atleast_1d(np.asarray(self.worst_case_epsilon, dtype=np.float64))
            if not (np.all(np.isfinite(worst)) and (worst.size == 1 or worst.shape == eps.shape or eps.size == 1)):
                problems.append(
                    "worst_case_epsilon must be finite, one number or one per client. "
                    f"Found {self.worst_case_epsilon!r}."
                )
            elif np.any(worst < eps):
                problems.append(
                    "worst_case_epsilon must be at least epsilon for every client (the account against any "
                    f"coordinator covers every release the main one does). Found {self.worst_case_epsilon!r}."
                )
        problems += self._adaptive_problems()
        problems += self._sampling_problems()
        if self.participation not in PARTICIPATIONS:
            problems.append(f"participation must be one of {PARTICIPATIONS}. Found {self.participation!r}.")
        elif self.participation == "poisson" and self.placement != "central":
            problems.append(
                "participation 'poisson' is a trusted server's sampling: it needs placement 'central'. "
                f"Found placement {self.placement!r}."
            )
        if not (0 < self.fraction <= 1):
            problems.append(f"fraction must be in (0, 1]. Found {self.fraction!r}.")
        if not (0 <= self.exhausted_below < 1):
            problems.append(f"exhausted_below must be in [0, 1). Found {self.exhausted_below!r}.")
        if not (isinstance(self.run_id, str) and self.run_id):
            problems.append(f"run_id must be a non-empty string. Found {self.run_id!r}.")
        if problems:
            raise ValueError("invalid EngineConfig: " + " ".join(problems))

    def _sampling_problems(self) -> list[str]:
        out = []
        order = self.rdp_order
        if order is not None and not (
            order == "plan"
            or (isinstance(order, (int, float)) and not isinstance(order, bool) and math.isfinite(order) and order > 1)
        ):
            out.append(f"rdp_order must be None, 'plan' or an order > 1. Found {short_repr(order)}.")
        elif order is not None and self.filter_kind != "rdp":
            out.append(f"rdp_order needs filter_kind 'rdp'. Found {self.filter_kind!r}.")
        rate = self.max_sampling_rate
        if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not MIN_RATE <= rate <= 1:
            out.append(f"max_sampling_rate must be in [{MIN_RATE}, 1]. Found {short_repr(rate)}.")
        rate = self.expected_rate
        if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not 0 < rate <= 1:
            out.append(f"expected_rate must be in (0, 1]. Found {short_repr(rate)}.")
        asks = self.planned_asks
        if not (is_int(asks) and 0 <= asks <= MAX_PLANNED_ASKS):
            out.append(f"planned_asks must be an integer in [0, {MAX_PLANNED_ASKS}]. Found {short_repr(asks)}.")
        elif asks:
            needs = [
                (self.filter_kind == "rdp", f"filter_kind 'rdp' (found {self.filter_kind!r})"),
                (self.placement in PLACEMENTS, f"a device's placement (found {self.placement!r})"),
                (
                    self.accounting == "individual" or self.placement == "distributed",
                    f"individual accounting outside distributed placement (found {self.accounting!r})",
                ),
                (self.adaptive_clipping is None, "a fixed clip (found adaptive clipping)"),
                # A device's worst-case account holds its own order, where a subsampled release can cost
                # more than at the main one, so it can bind a local round; the local rows keep no such account.
                (
                    self.placement != "local" or self.worst_case_epsilon is None,
                    f"no worst_case_epsilon in local placement (found {short_repr(self.worst_case_epsilon)})",
                ),
                # Every client must sample (a device whose order cannot falls back to the unsampled round,
                # which the engine's distributed rounds do not reproduce): one order the curves reach.
                (
                    order == "plan" or (isinstance(order, (int, float)) and 2 <= order <= MAX_SUBSAMPLED_ORDER),
                    f"rdp_order 'plan' or in [2, {MAX_SUBSAMPLED_ORDER}] (found {short_repr(order)})",
                ),
            ]
            missing = [why for ok, why in needs if not ok]
            if missing:
                out.append("planned_asks (devices that sample themselves) needs " + ", ".join(missing) + ".")
        elif order == "plan":
            out.append("rdp_order 'plan' needs planned_asks > 0 (the order is the plan's for each budget's rate).")
        return out

    def _adaptive_problems(self) -> list[str]:
        spec = self.adaptive_clipping
        if spec is None:
            return []
        if not isinstance(spec, AdaptiveClipping):
            return [f"adaptive_clipping must be an AdaptiveClipping or None. Found {short_repr(spec)}."]
        out = [f"adaptive_clipping.{p}" for p in spec.problems()]
        fields_ok = (
            is_int(self.num_clients)
            and self.num_clients > 0
            and isinstance(self.fraction, (int, float))
            and 0 < self.fraction <= 1
            and positive_finite("noise_multiplier", self.noise_multiplier) is None
        )
        if not out and fields_ok:
            asked = self.num_clients if self.fraction >= 1 else max(1, math.ceil(self.fraction * self.num_clients))
            sigma_b = spec.stddev_for(asked)
            try:
                update_noise_multiplier(float(self.noise_multiplier), float(sigma_b))
            except ValueError as err:
                out.append(f"adaptive_clipping with clipped_count_stddev={sigma_b!r}: {err}")
        return out

    @property
    def accounted_std(self) -> float:
        """The noise std the filter charges against (what an observer of the aggregate faces).

        Returns
        -------
        float
            ``noise_multiplier * clip``.

        Examples
        --------
        >>> EngineConfig(noise_multiplier=2.0, clip=0.5).accounted_std
        1.0
        """
        return accounted_noise_std(float(self.noise_multiplier), float(self.clip))

    @property
    def added_std(self) -> float:
        """The Gaussian noise std each client adds in local placement
        (``fedfilter.client.release.FilteredClient.release``); distributed reports carry Skellam noise
        (``fedfilter.simulations.engine.skellam_round.SkellamRound``), central ones none.

        Returns
        -------
        float
            The std of each local report's Gaussian noise.

        Raises
        ------
        ValueError
            When the placement is not ``local``.

        Examples
        --------
        >>> EngineConfig(noise_multiplier=2.0, clip=0.5).added_std
        1.0
        """
        if self.placement != "local":
            raise ValueError(f"added_std is the local placement's Gaussian std. Found placement={self.placement!r}.")
        return added_noise_std(float(self.noise_multiplier), float(self.clip), self.placement, self.min_reports)


@dataclass
class RoundRecord:
    """One round, as the engine saw it (ground truth) and as the coordinator saw it (public).

    Attributes
    ----------
    round_id : int
        The round.
    sampled, contributing, noise_only, left, reports_seen : int
        Clients asked; clients whose data entered the report (ground truth); pure-noise reports
        (ground truth); "left" markers; reports the coordinator received.
    released : bool
        Whether the aggregate was applied.
    exhausted_total : int
        Clients exhausted so far (ground truth).
    aggregate_norm : float
        Norm of the noisy mean's model part (0 if not released).
    accuracy, loss : float or None
        Test metrics after the round's step (None if not evaluated).
    group_accuracy : dict of str to float, or None
        Accuracy per group (``EngineConfig.group_by``).
    seconds : float
        Wall-clock time of the round.
    clip : float or None
        The round's clip ``C`` (public: the request's).
    unclipped_fraction : float or None
        Adaptive clipping: the fraction of unclipped updates the released mean's bit estimates
        (public; None without adaptive clipping or when not released).

    Examples
    --------
    >>> r = RoundRecord(1, sampled=4, contributing=3, noise_only=1, left=0, reports_seen=4,
    ...                 released=True, exhausted_total=1, aggregate_norm=0.5)
    >>> r.reports_seen - r.contributing
    1
    """

    round_id: int
    sampled: int  # clients asked this round
    contributing: int  # ground truth: clients whose data entered this round's report
    noise_only: int  # ground truth: pure-noise reports from exhausted clients
    left: int  # "left" markers (public)
    reports_seen: int  # public: reports the coordinator received (contributing + noise-only)
    released: bool  # public: whether the aggregate was applied (distributed: >= min_reports)
    exhausted_total: int  # ground truth: clients exhausted so far (at this round's start or earlier)
    aggregate_norm: float  # public: norm of the noisy mean (0 if not released)
    accuracy: float | None = None  # test accuracy after this round's step (None if not evaluated)
    loss: float | None = None
    group_accuracy: dict[str, float] | None = None
    seconds: float = 0.0
    clip: float | None = None  # public: the round's clip C
    unclipped_fraction: float | None = None  # public: adaptive clipping's estimate from the released bit
    kept: int | None = None  # ground truth, devices that sample themselves: contributions their coins kept


@dataclass
class EngineResult:
    """Everything a study needs after a run; per-client arrays are indexed by client position.

    Attributes
    ----------
    config : EngineConfig
        The run's configuration.
    rounds : list of RoundRecord
        One record per round run.
    client_ids : list of str
        The clients, in array order.
    exhausted_round : numpy.ndarray
        First round each client found its budget spent; -1 if never.
    spent_epsilon, spent_fraction : numpy.ndarray
        Lifetime epsilon used (rounded up) and its share of the budget.
    state, run_state : numpy.ndarray
        Lifetime and this run's filter states, ``(n_clients, dim)``.
    weights : list of numpy.ndarray
        The final model, in ``state_dict`` order.
    group_accuracy : dict of str to float, or None
        At the last evaluation.
    graph : SecAggGraph or None
        Distributed placement: the SecAgg+ graph the rounds ran on.
    graph_rounds : numpy.ndarray or None
        Distributed placement: rounds each client reported in.
    worst_state : numpy.ndarray or None
        Distributed placement: the worst-case accounts.

    Examples
    --------
    >>> import numpy as np
    >>> rec = RoundRecord(1, 2, 2, 0, 0, 2, True, 0, 0.1, accuracy=0.75)
    >>> z = np.zeros(2)
    >>> res = EngineResult(EngineConfig(num_clients=2), [rec], ["0", "1"], np.array([-1, -1]),
    ...                    z, z, z[:, None], z[:, None], weights=[])
    >>> res.accuracy, res.contributing, res.reports_seen
    ([0.75], [2], [2])
    """

    config: EngineConfig
    rounds: list[RoundRecord]
    client_ids: list[str]
    exhausted_round: np.ndarray  # int64: first round a client found its budget spent; -1 if never
    spent_epsilon: np.ndarray  # float64: lifetime epsilon used (filter.epsilon_spent, rounded up)
    spent_fraction: np.ndarray  # float64: share of the lifetime budget used, in [0, 1]
    state: np.ndarray  # (n_clients, dim) lifetime filter states, bitwise what the ledgers would hold
    run_state: np.ndarray  # (n_clients, dim) this run's states (the run quota's filter)
    weights: list[np.ndarray] = field(repr=False)  # final model, state_dict order
    group_accuracy: dict[str, float] | None = None  # at the last evaluation
    graph: SecAggGraph | None = None  # distributed placement: the SecAgg+ graph every round ran on
    graph_rounds: np.ndarray | None = None  # int64: distributed rounds each client reported in

    # (n_clients, dim) the worst-case accounts (distributed placement; None otherwise), bitwise the ledgers'
    worst_state: np.ndarray | None = field(default=None, repr=False)

    @property
    def accuracy(self) -> list[float | None]:
        """Test accuracy after each round (None where not evaluated).

        Examples
        --------
        >>> import numpy as np
        >>> z = np.zeros(1)
        >>> rec = RoundRecord(1, 1, 1, 0, 0, 1, True, 0, 0.1)
        >>> EngineResult(EngineConfig(), [rec], ["0"], z, z, z, z, z, weights=[]).accuracy
        [None]
        """
        return [r.accuracy for r in self.rounds]

    @property
    def contributing(self) -> list[int]:
        """Clients whose data entered each round's report (ground truth).

        Examples
        --------
        >>> import numpy as np
        >>> z = np.zeros(1)
        >>> rec = RoundRecord(1, 1, 1, 0, 0, 1, True, 0, 0.1)
        >>> EngineResult(EngineConfig(), [rec], ["0"], z, z, z, z, z, weights=[]).contributing
        [1]
        """
        return [r.contributing for r in self.rounds]

    @property
    def reports_seen(self) -> list[int]:
        """Reports the coordinator received each round.

        Examples
        --------
        >>> import numpy as np
        >>> z = np.zeros(1)
        >>> rec = RoundRecord(1, 1, 0, 1, 0, 1, True, 1, 0.1)
        >>> EngineResult(EngineConfig(), [rec], ["0"], z, z, z, z, z, weights=[]).reports_seen
        [1]
        """
        return [r.reports_seen for r in self.rounds]
