"""``IndividualFilterStrategy``: any Flower Message-API strategy, fed only checked, noisy reports.

Each device runs ``fedfilter.client.filter_mod.individual_filter_mod``: it pays for its clipped
update from its own budget and replies with a noisy *update* (or a ``left`` marker). Each training
round is one round object (``fedfilter.coordinator.rounds``), built when the round opens with what
it needs and dropped once released; ``start`` drives Flower's loop itself (ask, collect, release,
public record), so the strategy keeps nothing of a round between rounds. Per round:

* ask: the inner strategy samples nodes and builds its messages (its config, its arrays); the round
  adds the round request (``fedfilter.protocol.wire.request_record``) to each.
* collect and release, ``local`` placement: the replies are sorted into reports, markers and dropped
  (``fedfilter.coordinator.replies``; a bad reply never fails the round). A round with no report is
  dropped: ``None`` arrays, the model stays. Otherwise the round releases the plain mean of the
  reports, and the inner strategy gets exactly that: one reply
  holding ``global + mean`` in the model's dtypes and a MetricRecord whose weight is the constant 1
  (no example count exists here). FedAvg's result is then the plain-mean step bitwise; FedAvgM,
  FedAdam, FedYogi, FedAdagrad apply their server step to the mean update.
* ``distributed`` placement runs each training round through Flower's SecAgg+
  (``fedfilter.coordinator.secagg.secure_round``): nothing is sent in the clear; the messages travel
  inside SecAgg+'s masked-vector stage and the round gets only the sum of the devices' integer
  reports. The round is released only when that sum holds at least ``min_reports`` reports (fewer
  would carry less than the accounted noise; SecAgg+ itself halts below its threshold, which is
  ``min_reports``); then the mean is ``decode_sum(sum) * grid_step(clip) / n`` and the inner strategy
  steps as for local rounds. The coordinator never holds an individual report.
* driven by hand, Flower's ``configure_train`` opens the round (and returns what it asks: nothing in
  distributed placement) and ``aggregate_train`` collects and releases it; the one open round is all
  the strategy holds between those two calls.
* ``configure_evaluate`` sends nothing: a client's loss on its private data would be an
  unaccounted release (said once, in the summary at the start). Evaluate held-out data on the
  server through ``start(evaluate_fn=...)``.
* the inner strategy must aggregate by a weighted mean (``inner_strategy.MEAN_STRATEGIES``: FedAvg, FedAvgM,
  FedProx and FedOpt's family); Flower's others (FedMedian, FedTrimmedAvg, Krum, MultiKrum,
  Bulyan, QFedAvg, the XGBoost and DP strategies: ``inner_strategy.NOT_A_MEAN``) are refused with the reason; a
  custom one is wrapped with a warning that says what its ``aggregate_train`` gets. The summary
  prints the ledger's absolute path and "Weighted by: nothing" (Flower's says 'num-examples').
* the public record: one ``PublicRoundRecord`` per round (request, counts, released, the norm of
  the mean noisy update, the server-side metrics of that round, wall times) when ``public_ledger``
  is given. Nothing per client is kept or written.
"""

from __future__ import annotations

import io
import json
import time
from collections.abc import Callable, Iterable, Mapping
from logging import INFO, WARNING
from pathlib import Path
from typing import Any

from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Result, Strategy

from fedfilter.checks import positive_finite, short_repr
from fedfilter.coordinator.inner_strategy import (
    AGGREGATE_WEIGHT,
    MEAN_STRATEGIES,
    NoExampleWeights,
    check_inner_strategy,
    is_mean_strategy,
)
from fedfilter.coordinator.participation import AskCounter, Participation
from fedfilter.coordinator.public_ledger import PublicLedger
from fedfilter.coordinator.public_record import PublicRecorder
from fedfilter.coordinator.replies import RoundTally, classify_reply, plain_mean, report_norm_bound
from fedfilter.coordinator.rounds import LocalRound, RoundRelease, RoundSettings, SecureRound, open_round
from fedfilter.coordinator.run_log import (
    NothingReleasedError,
    RoundOutcome,
    RunLog,
    public_ledger_shown,
    say_evaluation_refused,
)
from fedfilter.coordinator.secagg.secure_round import AUTO_SHARES, check_num_shares
from fedfilter.planning.strategy_plan import strategy_arguments
from fedfilter.protocol.adaptive_clip import AdaptiveClipping, next_clip, update_noise_multiplier
from fedfilter.protocol.flower_api import DEFAULT_TTL, FLOWER_LOGGER, log, log_strategy_start_info
from fedfilter.protocol.request import RoundSpec, request_problems
from fedfilter.protocol.rules import check_message_ttl, run_id_for
from fedfilter.protocol.wire import ARRAYS_RECORD

__all__ = [
    "IndividualFilterStrategy",
    "NothingReleasedError",
    "RoundOutcome",
    "RoundTally",
    "classify_reply",
    "plain_mean",
    "report_norm_bound",
]


class IndividualFilterStrategy(Strategy):
    """Wrap a Message-API strategy so it sees only valid noisy reports, weighted equally.

    Every sampled device runs ``individual_filter_mod``: it checks the round request against its
    owner's policy, pays for its clipped update from its own budget and replies with a noisy update
    (or a ``left`` marker). The inner strategy gets one reply per released round, ``global + mean``
    of the valid reports, with a constant weight (the module docstring says how each stage works).

    Parameters
    ----------
    strategy : flwr.serverapp.strategy.Strategy
        The inner strategy; it must aggregate by a weighted mean (FedAvg, FedAvgM, FedProx, FedOpt's
        family). Per-client aggregators (median, Krum, trimmed mean) are refused with the reason.
    noise_multiplier : float
        ``z``: every observer's view of a report (of the sum, in distributed placement) carries
        Gaussian noise of std ``z * clip``. Finite, > 0; each device refuses one below its minimum.
        With ``adaptive_clipping`` it is the report's accounted multiplier, the clip bit included (as
        in Flower's adaptive clipping wrappers): the update gets the slightly larger
        ``update_noise_multiplier(z, clipped_count_stddev)``.
    clip : float
        ``C``: the L2 norm each device clips its update to (model units); with ``adaptive_clipping``
        the first round's. Finite, > 0.
    placement : {"local", "distributed"}, default "local"
        ``local``: each report carries all the noise. ``distributed``: each carries ``1/sqrt(m)`` of
        it and the round runs through Flower's SecAgg+, which releases only the sum.
    min_reports : int, default 1
        ``m``: in distributed placement the fewest reports a released sum holds (SecAgg+'s
        threshold). An integer >= 1.
    public_ledger : str, Path or PublicLedger, optional
        Where ``start`` appends one public record per round (nothing per client).
    run_name : str, optional
        The run id the devices account under; default ``flwr-<Flower run id>``.
    public_config : mapping, optional
        Public settings stored with the run (the ledger refuses names that look per-client).
    message_ttl_s : float, optional
        TTL of every train message (default: Flower's, 12 h). It must exceed the round timeout, or
        Flower discards the replies of devices that have already spent budget.
    secagg_num_shares : int, float or "auto", default "auto"
        Distributed placement: the SecAgg+ neighbourhood. ``"auto"`` (the sparse graph
        ``secure_round.round_graph`` chooses for the number sampled), a fraction in (0, 1] of the
        sampled nodes (1.0: all) or an odd integer >= 3. Its threshold is the smallest the devices'
        rule allows (``protocol/secagg/rule.py``).
    secagg_colluders : int, default 0
        Distributed placement: the most devices of a SecAgg+ neighbourhood that may be the
        coordinator's own or collude with it. The threshold is raised to ``min_reports`` plus this;
        devices refuse a graph below their own ``secagg-colluders``.
    adaptive_clipping : AdaptiveClipping, optional
        The clip follows a target quantile of the devices' update norms (Andrew et al., NeurIPS 2021),
        estimated from each device's noisy "within the clip" bit, which each device pays for from its
        own budget (``protocol/adaptive_clip.py``); its fields are named as in Flower's adaptive
        clipping wrappers. ``None`` (default): the clip is fixed.
    participation : Participation, optional
        How the nodes are chosen (balanced passes, or the inner strategy's sampling) and the asks each
        device's plan paid for: a node asked more often is named in a WARNING and counted in the
        round's public record (``coordinator/participation.py``). ``None``: the inner strategy's
        sampling, not counted.
    planned_asks : int, default 0
        The plan's asks per device, sent with every request: a device whose filter can account it
        then samples itself, putting its update in its reply with a rate it derives from its own
        budget over these asks (``client/mechanisms/sampled.py``). 0: every reply carries the update.
    expected_rate : float, default 1.0
        The plan's mean of the devices' rates (public): the released mean is the plain mean of the
        reports divided by it. 1: the plain mean.

    Raises
    ------
    ValueError
        Naming every bad argument and its value, before any round.

    Examples
    --------
    As with Flower's own DP wrappers, inside a ``ServerApp``'s main function:

    >>> from flwr.serverapp.strategy import FedAvg
    >>> from fedfilter import IndividualFilterStrategy
    >>> strategy = IndividualFilterStrategy(FedAvg(fraction_train=0.5), noise_multiplier=1.0, clip=0.5)
    >>> strategy.reports_needed()
    1
    >>> result = strategy.start(grid=grid, initial_arrays=arrays, num_rounds=3)  # doctest: +SKIP
    """

    def __init__(
        self,
        strategy: Strategy,
        *,
        noise_multiplier: float,
        clip: float,
        placement: str = "local",
        min_reports: int = 1,
        public_ledger: str | Path | PublicLedger | None = None,
        run_name: str | None = None,
        public_config: Mapping[str, Any] | None = None,
        message_ttl_s: float | None = None,
        secagg_num_shares: int | float | str = AUTO_SHARES,
        secagg_colluders: int = 0,
        adaptive_clipping: AdaptiveClipping | None = None,
        participation: Participation | None = None,
        planned_asks: int = 0,
        expected_rate: float = 1.0,
    ) -> None:
        problems = []
        if not isinstance(strategy, Strategy):
            problems.append(f"strategy must be a flwr.serverapp.strategy.Strategy. Found {type(strategy).__name__}.")
        named = run_name is None or (isinstance(run_name, str) and run_name != "")
        if not named:
            problems.append(f"run_name must be a non-empty string. Found {short_repr(run_name)}.")
        # The request's shape, checked as every device will check it (a representative round).
        problems += request_problems(
            RoundSpec(
                run_id=run_name if named and run_name else run_id_for(0),
                round_id=1,
                noise_multiplier=noise_multiplier,
                clip=clip,
                placement=placement,
                min_reports=min_reports,
                planned_asks=planned_asks,
            )
        )
        if planned_asks and adaptive_clipping is not None:  # every device would refuse every round
            problems.append(
                "planned_asks (devices that sample themselves) cannot be combined with adaptive_clipping: "
                "use a fixed clip."
            )
        if isinstance(expected_rate, bool) or not isinstance(expected_rate, (int, float)) or not 0 < expected_rate <= 1:
            problems.append(f"expected_rate must be in (0, 1]. Found {short_repr(expected_rate)}.")
        if message_ttl_s is not None and (problem := positive_finite("message_ttl_s", message_ttl_s)) is not None:
            problems.append(problem)
        # Devices read the model from "arrays" and reply under it; a strategy using another key cannot work.
        inner_key = getattr(strategy, "arrayrecord_key", ARRAYS_RECORD)
        if inner_key != ARRAYS_RECORD:
            problems.append(f"the inner strategy's arrayrecord_key must be {ARRAYS_RECORD!r}. Found {inner_key!r}.")
        if not problems and (why := check_inner_strategy(strategy)) is not None:
            problems.append(why)
        if not problems:
            try:
                check_num_shares(secagg_num_shares, min_reports)
            except ValueError as err:
                problems.append(str(err))
        if isinstance(secagg_colluders, bool) or not isinstance(secagg_colluders, int) or secagg_colluders < 0:
            problems.append(f"secagg_colluders must be an integer >= 0. Found {short_repr(secagg_colluders)}.")
        problems += _adaptive_problems(adaptive_clipping, noise_multiplier)
        if participation is not None:
            if isinstance(participation, Participation):
                problems += participation.problems()
            else:
                problems.append(f"participation must be a Participation or None. Found {short_repr(participation)}.")
        if problems:
            raise ValueError(" ".join(problems))
        self.strategy = strategy
        self.noise_multiplier = float(noise_multiplier)
        self.clip = float(clip)
        self.placement = placement
        self.min_reports = int(min_reports)
        self.public_ledger = public_ledger
        self.run_name = run_name
        self.public_config = dict(public_config) if public_config is not None else None
        self.message_ttl_s = message_ttl_s
        self.secagg_num_shares = secagg_num_shares
        self.secagg_colluders = secagg_colluders
        self.adaptive_clipping = adaptive_clipping
        self.current_clip = self.clip  # adaptive clipping moves it after each released round (public)
        self.participation = participation
        self.planned_asks = int(planned_asks)
        self.expected_rate = float(expected_rate)
        self._asks = self._new_ask_counter()  # the hand-driven rounds' asks; start() counts each run afresh
        self.last_outcome: RoundOutcome | None = None  # the last round's public outcome (read after a round)
        self._evaluate_refusal_logged = False
        self._run_shown: str | None = None  # the run id start() records under, shown with the ledger's path
        self._run_log = self._new_run_log()  # the hand-driven rounds' log; start() keeps one per run
        # Driven by hand (configure_train, then aggregate_train): the one round opened and not yet released.
        self._open: LocalRound | SecureRound | None = None
        if not is_mean_strategy(strategy):
            log(
                WARNING,
                "fedfilter: %s is not one of Flower's mean strategies (%s): its aggregate_train gets one reply "
                "per round, global + the plain mean of the valid noisy reports with weight %d; if it aggregates "
                "by anything but a weighted mean, it means something else here.",
                type(strategy).__name__,
                ", ".join(MEAN_STRATEGIES),
                AGGREGATE_WEIGHT,
            )

    def __repr__(self) -> str:
        return f"IndividualFilterStrategy({self.strategy!r})"

    @classmethod
    def from_plan(
        cls, strategy: Strategy, plan: Mapping[str, Any] | str | Path, **overrides: Any
    ) -> IndividualFilterStrategy:
        """The strategy ``fedfilter plan --json`` chose: ``z``, clip, placement, ``min_reports``, adaptive
        clipping and participation from the plan, any keyword in ``overrides`` on top.

        Nothing in the plan binds a device: each checks every request against its owner's policy.

        Parameters
        ----------
        strategy : flwr.serverapp.strategy.Strategy
            The inner strategy.
        plan : mapping, str or Path
            The plan (``fedfilter plan --json``'s output, or its ``"strategy"`` part) or a path to its file.
        **overrides
            Keyword arguments of ``IndividualFilterStrategy`` (``public_ledger``, ``run_name``, ...).

        Raises
        ------
        ValueError
            Naming a missing or bad field of the plan, or a bad argument.

        Examples
        --------
        >>> from flwr.serverapp.strategy import FedAvg
        >>> from fedfilter.planning.strategy_plan import plan_strategy
        >>> plan = plan_strategy(devices=10, population=100, rounds=20, dim=10, epsilons=[8.0], delta=1e-5)
        >>> strategy = IndividualFilterStrategy.from_plan(FedAvg(), plan, run_name="r")
        >>> strategy.noise_multiplier == plan["noise_multiplier"], strategy.participation.asks_planned
        (True, 2)
        """
        if isinstance(plan, (str, Path)):
            try:
                plan = json.loads(Path(plan).read_text(encoding="utf-8"))
            except (OSError, json.JSONDecodeError) as err:
                raise ValueError(f"plan {str(plan)!r} is not a readable JSON file ({err}).") from None
        args = strategy_arguments(plan)  # type: ignore[arg-type]
        args["participation"] = Participation.from_plan(args["participation"])
        # The one place the plan's adaptive clipping reaches the strategy: its ``adaptive_clipping`` keyword.
        if (adaptive := args.pop("adaptive_clipping")) is not None:
            args["adaptive_clipping"] = adaptive
        args.update(overrides)
        return cls(strategy, **args)

    # -- the round rules (fedfilter.protocol.rules; not re-derived here) --

    def _settings(self) -> RoundSettings:
        return RoundSettings(
            noise_multiplier=self.noise_multiplier,
            clip=self.current_clip,
            placement=self.placement,
            min_reports=self.min_reports,
            message_ttl_s=self.message_ttl_s,
            secagg_num_shares=self.secagg_num_shares,
            secagg_colluders=self.secagg_colluders,
            adaptive=self.adaptive_clipping,
            planned_asks=self.planned_asks,
            expected_rate=self.expected_rate,
        )

    def per_client_noise_std(self) -> float:
        """The std of the noise each report carries (``protocol.rules.added_noise_std``).

        Examples
        --------
        >>> from flwr.serverapp.strategy import FedAvg
        >>> IndividualFilterStrategy(FedAvg(), noise_multiplier=1.0, clip=0.5).per_client_noise_std()
        0.5
        """
        return self._settings().noise_std()

    def reports_needed(self) -> int:
        """The fewest reports a released round holds (``protocol.rules.reports_needed``).

        Examples
        --------
        >>> from flwr.serverapp.strategy import FedAvg
        >>> IndividualFilterStrategy(FedAvg(), noise_multiplier=1.0, clip=0.5, placement="distributed",
        ...                          min_reports=4).reports_needed()
        4
        """
        return self._settings().reports_needed()

    def _new_ask_counter(self) -> AskCounter | None:
        return AskCounter(self.participation) if self.participation is not None else None

    def _new_run_log(self) -> RunLog:
        return RunLog(self.noise_multiplier, self.clip, self.placement, self.min_reports)

    def run_id(self, grid: Grid) -> str:
        """The run id the devices account under: ``run_name``, or ``flwr-<Flower run id>``.

        Parameters
        ----------
        grid : Grid
            Flower's grid (its run).

        Examples
        --------
        >>> from flwr.serverapp.strategy import FedAvg
        >>> IndividualFilterStrategy(FedAvg(), noise_multiplier=1.0, clip=0.5, run_name="r").run_id(None)
        'r'
        """
        return self.run_name or run_id_for(grid.run.run_id)

    def summary(self) -> None:
        """Log the wrapper's settings, then the inner strategy's summary (weighted by nothing).

        Examples
        --------
        >>> from flwr.serverapp.strategy import FedAvg
        >>> strategy = IndividualFilterStrategy(FedAvg(), noise_multiplier=1.0, clip=0.5)
        >>> strategy.summary()  # logs at INFO through Flower's logger
        """
        self._run_log.start_summary(
            noise_std=self.per_client_noise_std(),
            secagg_num_shares=self.secagg_num_shares if self.placement == "distributed" else None,
            public_ledger=public_ledger_shown(self.public_ledger, self._run_shown),
        )
        if (adaptive := self.adaptive_clipping) is not None:
            sigma_b = adaptive.clipped_count_stddev
            log(
                INFO,
                "fedfilter: adaptive clipping (Andrew et al. 2021): the clip starts at %g and follows the %g quantile "
                "of the update norms (step %g); each device's report carries its 'within the clip' bit, noise std "
                "%s bits on the sum, which each device pays for from its own budget; noise multiplier %g is the "
                "report's, bit included.",
                self.clip,
                adaptive.target_clipped_quantile,
                adaptive.clip_norm_lr,
                f"{sigma_b:g}" if sigma_b is not None else "(devices asked) / 20",
                self.noise_multiplier,
            )
        if self.participation is not None:
            p = self.participation
            how = f"balanced passes (public seed {p.seed})" if p.mode == "balanced" else f"{p.mode} (inner strategy)"
            log(INFO, "\t├── Participation: %s; a device asked over %d times is named", how, p.asks_planned)
        self._say_evaluation_refused()
        filtered = NoExampleWeights()
        FLOWER_LOGGER.addFilter(filtered)
        try:
            self.strategy.summary()
        finally:
            FLOWER_LOGGER.removeFilter(filtered)

    def _say_evaluation_refused(self) -> None:
        if not self._evaluate_refusal_logged:  # once, at the start
            self._evaluate_refusal_logged = True
            say_evaluation_refused(getattr(self.strategy, "fraction_evaluate", 0.0))

    # -- training: one round object per round (coordinator/rounds.py) --

    def _open_round(
        self,
        server_round: int,
        arrays: ArrayRecord,
        config: ConfigRecord,
        grid: Grid,
        run_log: RunLog,
        timeout: float | None,
        asks: AskCounter | None,
    ) -> LocalRound | SecureRound:
        return open_round(
            self._settings(),
            run_id=self.run_id(grid),
            server_round=server_round,
            arrays=arrays,
            config=config,
            grid=grid,
            inner=self.strategy,
            run_log=run_log,
            timeout=timeout,
            asks=asks,
        )

    def _outcome(self, released: RoundRelease) -> tuple[ArrayRecord | None, MetricRecord]:
        self.last_outcome = released.outcome
        fraction = released.unclipped_fraction
        if self.adaptive_clipping is not None and fraction is not None:
            # Andrew et al. 2021, Algorithm 1: the geometric step toward the target quantile.
            clip = next_clip(self.current_clip, fraction, self.adaptive_clipping)
            log(
                INFO,
                "fedfilter: adaptive clipping: %.3f of the reports were within the clip %.6g (noisy estimate); "
                "next clip %.6g",
                fraction,
                self.current_clip,
                clip,
            )
            self.current_clip = clip
        return released.arrays, released.metrics()

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """The inner strategy's messages, each with the round request added (none in distributed
        placement: they travel inside SecAgg+, run by ``aggregate_train``). Opens the round that
        ``aggregate_train`` releases; ``start`` drives its rounds without these two calls.

        Parameters
        ----------
        server_round : int
            The round.
        arrays : flwr.app.ArrayRecord
            The global model.
        config : flwr.app.ConfigRecord
            The train config the inner strategy sends.
        grid : flwr.serverapp.Grid
            Flower's grid (its nodes and run).

        Returns
        -------
        iterable of flwr.app.Message
            The train messages, each carrying the round request.

        Examples
        --------
        >>> from flwr.serverapp.strategy import FedAvg
        >>> strategy = IndividualFilterStrategy(FedAvg(), noise_multiplier=1.0, clip=0.5)
        >>> messages = strategy.configure_train(1, arrays, ConfigRecord(), grid)  # doctest: +SKIP
        >>> arrays, metrics = strategy.aggregate_train(1, grid.send_and_receive(messages))  # doctest: +SKIP
        """
        self._open = self._open_round(server_round, arrays, config, grid, self._run_log, None, self._asks)
        return self._open.ask()

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """The inner strategy's step from the plain mean of the checked reports; ``None`` arrays if dropped.

        Parameters
        ----------
        server_round : int
            The round ``configure_train`` opened.
        replies : iterable of flwr.app.Message
            The round's replies (ignored in distributed placement, where SecAgg+ collects them).

        Returns
        -------
        tuple of (flwr.app.ArrayRecord or None, flwr.app.MetricRecord or None)
            The new global model (``None`` if the round was dropped) and the round's public counts.

        Examples
        --------
        >>> from flwr.serverapp.strategy import FedAvg
        >>> strategy = IndividualFilterStrategy(FedAvg(), noise_multiplier=1.0, clip=0.5)
        >>> strategy.aggregate_train(1, [])
        Traceback (most recent call last):
        ...
        RuntimeError: aggregate_train(server_round=1) without configure_train for that round.
        """
        training = self._open
        if training is None or training.round_id != server_round:
            raise RuntimeError(f"aggregate_train(server_round={server_round}) without configure_train for that round.")
        self._open = None
        return self._outcome(training.aggregate(list(replies)))

    # -- evaluation: refused on clients --

    def configure_evaluate(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """Nothing: a client's metrics on its private data would be a release the filter cannot account.

        Parameters
        ----------
        server_round : int
            The round.
        arrays : flwr.app.ArrayRecord
            The global model (not sent).
        config : flwr.app.ConfigRecord
            The evaluate config (not sent).
        grid : flwr.serverapp.Grid
            Flower's grid (not used).

        Returns
        -------
        list
            Always empty.

        Examples
        --------
        >>> from flwr.serverapp.strategy import FedAvg
        >>> strategy = IndividualFilterStrategy(FedAvg(), noise_multiplier=1.0, clip=0.5)
        >>> strategy.configure_evaluate(1, ArrayRecord(), ConfigRecord(), None)
        []
        """
        self._say_evaluation_refused()  # said in summary() at the start; here if summary() was skipped
        return []

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]) -> MetricRecord | None:
        """Nothing to aggregate: ``configure_evaluate`` sends no message.

        Parameters
        ----------
        server_round : int
            The round.
        replies : iterable of flwr.app.Message
            The evaluate replies (none).

        Returns
        -------
        None
            Always.

        Examples
        --------
        >>> from flwr.serverapp.strategy import FedAvg
        >>> strategy = IndividualFilterStrategy(FedAvg(), noise_multiplier=1.0, clip=0.5)
        >>> strategy.aggregate_evaluate(1, []) is None
        True
        """
        return None

    # -- the run: Flower's loop, one round object per round, one public record per round --

    def start(
        self,
        grid: Grid,
        initial_arrays: ArrayRecord,
        num_rounds: int = 3,
        timeout: float = 3600,
        train_config: ConfigRecord | None = None,
        evaluate_config: ConfigRecord | None = None,
        evaluate_fn: Callable[[int, ArrayRecord], MetricRecord | None] | None = None,
    ) -> Result:
        """Flower's ``Strategy.start`` (flwr 1.41/1.42: its logging, ``Result``, client-side evaluate step
        and ``evaluate_fn`` at round 0 and after each round), each training round one round object
        (ask, collect, release), its public record appended after the server-side evaluation.

        Parameters
        ----------
        grid : flwr.serverapp.Grid
            Flower's grid.
        initial_arrays : flwr.app.ArrayRecord
            The initial global model.
        num_rounds : int, optional
            Training rounds.
        timeout : float, optional
            Seconds each round waits for replies (below the message TTL).
        train_config, evaluate_config : flwr.app.ConfigRecord, optional
            Configs for the inner strategy's train (and evaluate) messages.
        evaluate_fn : callable, optional
            ``evaluate_fn(server_round, arrays)``: server-side evaluation on held-out data; its
            numeric metrics join the round's public record.

        Returns
        -------
        flwr.serverapp.strategy.Result
            Flower's result: the final model and the metrics by round.

        Raises
        ------
        NothingReleasedError
            If no round was released (after the public ledger is closed).

        Examples
        --------
        >>> from flwr.serverapp.strategy import FedAvg
        >>> strategy = IndividualFilterStrategy(FedAvg(), noise_multiplier=1.0, clip=0.5)
        >>> result = strategy.start(grid=grid, initial_arrays=arrays, num_rounds=3)  # doctest: +SKIP
        """
        ttl = self.message_ttl_s if self.message_ttl_s is not None else DEFAULT_TTL
        check_message_ttl(ttl, timeout)
        self._run_shown = run_id = self.run_id(grid)
        self.current_clip = self.clip  # each run's clip starts where the operator set it
        run_log = self._new_run_log()
        asks = self._new_ask_counter()
        recorder = PublicRecorder(self.public_ledger)
        # Whether the coordinator saw only sums (SecAgg+) or each noisy report, with every run.
        with recorder.run(run_id, {**self._run_config(), "secure-aggregation": self.placement == "distributed"}):
            result = self._run_rounds(
                grid,
                initial_arrays,
                num_rounds,
                timeout,
                train_config,
                evaluate_config,
                evaluate_fn,
                run_log,
                recorder,
                asks,
            )
        failure = run_log.nothing_released(run_id, num_rounds)
        if failure is not None:
            raise NothingReleasedError(failure)
        return result

    def _run_rounds(
        self,
        grid: Grid,
        initial_arrays: ArrayRecord,
        num_rounds: int,
        timeout: float,
        train_config: ConfigRecord | None,
        evaluate_config: ConfigRecord | None,
        evaluate_fn: Callable[[int, ArrayRecord], MetricRecord | None] | None,
        run_log: RunLog,
        recorder: PublicRecorder,
        asks: AskCounter | None = None,
    ) -> Result:
        log(INFO, "Starting %s strategy:", self.__class__.__name__)
        log_strategy_start_info(num_rounds, initial_arrays, train_config, evaluate_config)
        self.summary()
        log(INFO, "")
        train_config = ConfigRecord() if train_config is None else train_config
        evaluate_config = ConfigRecord() if evaluate_config is None else evaluate_config
        result = Result()

        def evaluate(server_round: int, arrays: ArrayRecord) -> MetricRecord | None:
            return evaluate_fn(server_round, arrays) if evaluate_fn is not None else None

        # The server-side evaluation steps run (and log) whether or not evaluate_fn is given, as they
        # did when the public record rode on Flower's loop as its evaluate_fn.
        t_start = time.time()
        res = evaluate(0, initial_arrays)
        log(INFO, "Initial global evaluation results: %s", res)
        if res is not None:
            result.evaluate_metrics_serverapp[0] = res
        arrays = initial_arrays
        for current_round in range(1, num_rounds + 1):
            log(INFO, "")
            log(INFO, "[ROUND %s/%s]", current_round, num_rounds)
            # Training: one round object, asked, collected and released here; nothing of it outlives the round.
            training = self._open_round(current_round, arrays, train_config, grid, run_log, float(timeout), asks)
            released = training.run()  # ask, collect (the grid, or SecAgg+), release
            agg_arrays, agg_train_metrics = self._outcome(released)
            if agg_arrays is not None:
                result.arrays = agg_arrays
                arrays = agg_arrays
            log(INFO, "\t└──> Aggregated MetricRecord: %s", agg_train_metrics)
            result.train_metrics_clientapp[current_round] = agg_train_metrics
            # Client-side evaluation: Flower's step, to which configure_evaluate gives nothing to send.
            evaluate_replies = grid.send_and_receive(
                messages=self.configure_evaluate(current_round, arrays, evaluate_config, grid), timeout=timeout
            )
            agg_evaluate_metrics = self.aggregate_evaluate(current_round, evaluate_replies)
            if agg_evaluate_metrics is not None:
                log(INFO, "\t└──> Aggregated MetricRecord: %s", agg_evaluate_metrics)
                result.evaluate_metrics_clientapp[current_round] = agg_evaluate_metrics
            # Server-side evaluation, then the round's public record with its metrics.
            log(INFO, "Global evaluation")
            res = evaluate(current_round, arrays)
            log(INFO, "\t└──> MetricRecord: %s", res)
            if res is not None:
                result.evaluate_metrics_serverapp[current_round] = res
            recorder.append(released.record, res)
        log(INFO, "")
        log(INFO, "Strategy execution finished in %.2fs", time.time() - t_start)
        log(INFO, "")
        log(INFO, "Final results:")
        log(INFO, "")
        for line in io.StringIO(str(result)):
            log(INFO, "\t%s", line.strip("\n"))
        log(INFO, "")
        return result

    def _run_config(self) -> dict[str, Any]:
        if self.public_config is not None:
            return self.public_config
        config: dict[str, Any] = {
            "strategy": type(self.strategy).__name__,
            "noise-multiplier": self.noise_multiplier,
            "clip": self.clip,
            "placement": self.placement,
            "min-reports": self.min_reports,
            **_adaptive_config(self.adaptive_clipping),
        }
        if self.participation is not None:
            config["participation"] = self.participation.mode
            config["asks-planned"] = self.participation.asks_planned
        return config


def _adaptive_problems(adaptive: Any, noise_multiplier: Any) -> list[str]:
    """Adaptive clipping's settings, checked before any round (the default ``sigma_b`` is per round)."""
    if adaptive is None:
        return []
    if not isinstance(adaptive, AdaptiveClipping):
        return [f"adaptive_clipping must be an AdaptiveClipping or None. Found {short_repr(adaptive)}."]
    problems = adaptive.problems()
    sigma_b = adaptive.clipped_count_stddev
    if not problems and sigma_b is not None and isinstance(noise_multiplier, (int, float)):
        try:
            update_noise_multiplier(float(noise_multiplier), float(sigma_b))
        except ValueError as err:
            problems.append(str(err))
    return problems


def _adaptive_config(adaptive: AdaptiveClipping | None) -> dict[str, Any]:
    """The public run config's adaptive clipping settings (none for a fixed clip)."""
    if adaptive is None:
        return {}
    out: dict[str, Any] = {
        "target-clipped-quantile": adaptive.target_clipped_quantile,
        "clip-norm-lr": adaptive.clip_norm_lr,
    }
    if adaptive.clipped_count_stddev is not None:
        out["clipped-count-stddev"] = adaptive.clipped_count_stddev
    return out
