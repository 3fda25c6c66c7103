"""``IndividualFilterStrategy``: any Flower Message-API strategy, fed only checked, noisy reports.

Each device runs ``fedfilter.client.filter_mod.individual_filter_mod``: it pays for its clipped
update from its own budget and replies with a noisy *update* (or a ``left`` marker). Per round:

* ``configure_train``: the inner strategy samples nodes and builds its messages (its config, its
  arrays); the wrapper adds the round request (``fedfilter.protocol.wire.request_record``) to each,
  and remembers the nodes asked and the global arrays.
* ``aggregate_train``: replies are sorted into reports, markers and dropped
  (``fedfilter.coordinator.replies``; a bad reply never fails the round). A round with no report is
  dropped: ``None`` arrays, the model stays. Otherwise the round releases the plain mean of the
  reports, and the inner strategy gets exactly that: one reply
  holding ``global + mean`` in the model's dtypes and a MetricRecord whose weight is the constant 1
  (no example count exists here). FedAvg's result is then the plain-mean step bitwise; FedAvgM,
  FedAdam, FedYogi, FedAdagrad apply their server step to the mean update.
* ``distributed`` placement runs each training round through Flower's SecAgg+
  (``fedfilter.coordinator.secagg.secure_round``): ``configure_train`` keeps the messages (and returns none
  for Flower's loop to send), ``aggregate_train`` sends them inside SecAgg+'s masked-vector stage and
  gets only the sum of the devices' integer reports. The round is released only when that sum holds
  at least ``min_reports`` reports (fewer would carry less than the accounted noise, DESIGN.md
  section 1; SecAgg+ itself halts below its threshold, which is ``min_reports``); then the mean is
  ``decode_sum(sum) * grid_step(clip) / n`` and the inner strategy steps as for local rounds. The
  coordinator never holds an individual report.
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

import math
import time
from collections.abc import Callable, Iterable, Mapping
from logging import WARNING
from pathlib import Path
from typing import Any

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Result, Strategy

from fedfilter.checks import positive_finite, short_repr
from fedfilter.coordinator.inner_strategy import (
    AGGREGATE_WEIGHT,
    MEAN_STRATEGIES,
    NoExampleWeights,
    check_inner_strategy,
    inner_step,
    is_mean_strategy,
)
from fedfilter.coordinator.public_ledger import PublicLedger
from fedfilter.coordinator.public_record import PublicRecorder
from fedfilter.coordinator.replies import (
    RoundTally,
    classify_reply,
    l2_norm,
    plain_mean,
    report_norm_bound,
    tally_replies,
)
from fedfilter.coordinator.run_log import (
    NothingReleasedError,
    RoundOutcome,
    RunLog,
    public_ledger_shown,
    say_evaluation_refused,
)
from fedfilter.coordinator.secagg.secure_round import (
    AUTO_SHARES,
    SecureSum,
    check_num_shares,
    released_mean,
    run_secure_round,
)
from fedfilter.protocol.flower_api import DEFAULT_TTL, FLOWER_LOGGER, log
from fedfilter.protocol.request import RoundSpec, request_problems
from fedfilter.protocol.rules import added_noise_std, check_message_ttl, reports_needed, run_id_for
from fedfilter.protocol.wire import ARRAYS_RECORD, REQUEST_RECORD, request_proto, request_record
from fedfilter.protos import fedfilter_pb2

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
    clip : float
        ``C``: the L2 norm each device clips its update to (model units). Finite, > 0.
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
            )
        )
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
        self.last_outcome: RoundOutcome | None = None
        self._asked: list[int] = []
        self._keys: list[str] = []
        self._template: list[np.ndarray] = []
        self._spec: RoundSpec | None = None
        self._request_extra: dict[str, Any] = {}
        self._started_at = 0.0
        self._recorder = PublicRecorder(public_ledger)
        self._evaluate_refusal_logged = False
        self._run_shown: str | None = None  # the run id start() records under, shown with the ledger's path
        self._run_log = self._new_run_log()
        # Distributed placement: the messages SecAgg+ delivers in its masked stage, and where to send them.
        self._secure_messages: list[Message] = []
        self._grid: Grid | None = None
        self._round_timeout: float | None = None
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

    # -- the round rules (fedfilter.protocol.rules; not re-derived here) --

    def per_client_noise_std(self) -> float:
        return added_noise_std(self.noise_multiplier, self.clip, self.placement, self.min_reports)

    def reports_needed(self) -> int:
        return reports_needed(self.placement, self.min_reports)

    def expected_noise_norm(self, reports: int) -> float:
        """The expected norm of the noise in the mean of ``reports`` reports (public: the request, the
        model's size and the count), over the floating-point coordinates the devices release."""
        return self._run_log.expected_noise_norm(self._template, reports)

    def _new_run_log(self) -> RunLog:
        return RunLog(self.noise_multiplier, self.clip, self.placement, self.min_reports)

    def run_id(self, grid: Grid) -> str:
        return self.run_name or run_id_for(grid.run.run_id)

    def summary(self) -> None:
        self._run_log.start_summary(
            noise_std=self.per_client_noise_std(),
            secagg_num_shares=self.secagg_num_shares if self.placement == "distributed" else None,
            public_ledger=public_ledger_shown(self.public_ledger, self._run_shown),
        )
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

    # -- training --

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """The inner strategy's messages, each with the round request added."""
        self._started_at = time.time()
        self._keys = list(arrays.keys())
        self._template = [arrays[k].numpy() for k in self._keys]
        self._spec = RoundSpec(
            run_id=self.run_id(grid),
            round_id=int(server_round),
            noise_multiplier=self.noise_multiplier,
            clip=self.clip,
            placement=self.placement,
            min_reports=self.min_reports,
        )
        # The public record repeats the training settings sent, when the config names them.
        self._request_extra = {
            "local_epochs": _int_or_zero(config.get("local-epochs")),
            "learning_rate": _float_or_zero(config.get("lr")),
        }
        request = request_record(self._spec)
        messages = list(self.strategy.configure_train(server_round, arrays, config, grid))
        for msg in messages:
            content = RecordDict(dict(msg.content.items()))  # a copy: inner strategies share one RecordDict
            content[REQUEST_RECORD] = request
            msg.content = content
            if self.message_ttl_s is not None:
                msg.metadata.ttl = float(self.message_ttl_s)
        self._asked = [int(m.metadata.dst_node_id) for m in messages]
        if self.placement == "distributed":
            if len(set(self._asked)) != len(self._asked):
                raise RuntimeError(f"the inner strategy addressed a node twice: {sorted(self._asked)}.")
            # Sent by aggregate_train inside SecAgg+'s masked-vector stage, never in the clear.
            self._secure_messages, self._grid = messages, grid
            return []
        return messages

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """The inner strategy's step from the plain mean of the checked reports; ``None`` arrays if dropped."""
        if self._spec is None or self._spec.round_id != server_round:
            raise RuntimeError(f"aggregate_train(server_round={server_round}) without configure_train for that round.")
        replies = list(replies)
        if self.placement == "distributed":
            return self._aggregate_secure(server_round, replies)
        bound = report_norm_bound(
            clip=self.clip, noise_std=self.per_client_noise_std(), dim=sum(int(t.size) for t in self._template)
        )
        tally = tally_replies(replies, self._asked, self._keys, self._template, bound)
        outcome = RoundOutcome(
            round_id=server_round,
            sampled=len(self._asked),
            reports=len(tally.reports),
            markers=tally.markers,
            dropped=tally.dropped,
            reasons=tally.reasons,
            refusals=tally.refusals,
        )
        arrays: ArrayRecord | None = None
        if tally.reports and len(tally.reports) >= self.reports_needed():
            mean = plain_mean(tally.reports, self._template)
            outcome.released = True
            outcome.aggregate_norm = l2_norm(mean)
            outcome.expected_noise_norm = self.expected_noise_norm(len(tally.reports))
            first = next(m for m in replies if int(m.metadata.src_node_id) == tally.report_sources[0])
            arrays = inner_step(self.strategy, server_round, first, self._keys, self._template, mean)
        return arrays, self._finish_round(outcome)

    def _aggregate_secure(
        self, server_round: int, stray: list[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """A distributed round: SecAgg+ over the kept messages, then the release rule on the sum."""
        messages, self._secure_messages = self._secure_messages, []
        if self._grid is None:
            raise RuntimeError("a distributed round needs configure_train's grid.")
        secure: SecureSum = run_secure_round(
            self._grid,
            {int(m.metadata.dst_node_id): m.content for m in messages},
            server_round=server_round,
            min_reports=self.min_reports,
            num_shares=self.secagg_num_shares,
            colluders=self.secagg_colluders,
            timeout=self._round_timeout,
        )
        n = secure.reports
        outcome = RoundOutcome(
            round_id=server_round,
            sampled=secure.sampled,
            reports=n,
            dropped=secure.sampled - n + len(stray),
            reasons=[secure.reason] if secure.reason else [],
            refusals=secure.refusals,
        )
        if stray:
            outcome.reasons.append("a reply outside secure aggregation in a distributed round")
        arrays: ArrayRecord | None = None
        mean, reason = released_mean(secure, template=self._template, clip=self.clip, min_reports=self.min_reports)
        if reason:
            outcome.reasons.append(reason)
        if mean is not None:
            outcome.released = True
            outcome.aggregate_norm = l2_norm(mean)
            outcome.expected_noise_norm = self.expected_noise_norm(n)
            arrays = inner_step(self.strategy, server_round, messages[0], self._keys, self._template, mean)
        return arrays, self._finish_round(outcome)

    def _finish_round(self, outcome: RoundOutcome) -> MetricRecord:
        self.last_outcome = outcome
        assert self._spec is not None
        record = fedfilter_pb2.PublicRoundRecord(
            run_id=self._spec.run_id,
            round_id=outcome.round_id,
            request=request_proto(self._spec, **self._request_extra),
            clients_sampled=outcome.sampled,
            reports_received=outcome.reports,
            markers_received=outcome.markers,
            replies_dropped=outcome.dropped,
            released=outcome.released,
            aggregate_norm=outcome.aggregate_norm if math.isfinite(outcome.aggregate_norm) else 0.0,
            expected_noise_norm=outcome.expected_noise_norm,
            started_at_unix=self._started_at,
        )
        self._recorder.hold(record)
        self._run_log.round(outcome, self._template)
        return MetricRecord(
            {
                "reports-received": outcome.reports,
                "markers-received": outcome.markers,
                "replies-dropped": outcome.dropped,
                "released": int(outcome.released),
            }
        )

    # -- evaluation: refused on clients --

    def configure_evaluate(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """Nothing: a client's metrics on its private data would be a release the filter cannot account."""
        self._say_evaluation_refused()  # said in summary() at the start; here if summary() was skipped
        return []

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]) -> MetricRecord | None:
        return None

    # -- the run: public ledger around Flower's loop --

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
        """Flower's loop, with one public record per round appended after the server-side evaluation."""
        ttl = self.message_ttl_s if self.message_ttl_s is not None else DEFAULT_TTL
        check_message_ttl(ttl, timeout)
        self._run_shown = run_id = self.run_id(grid)
        self._round_timeout = float(timeout)
        self._run_log = self._new_run_log()

        def evaluate_and_record(server_round: int, arrays: ArrayRecord) -> MetricRecord | None:
            metrics = evaluate_fn(server_round, arrays) if evaluate_fn is not None else None
            if server_round > 0:
                self._recorder.append_held(metrics)
            return metrics

        # Whether the coordinator saw only sums (SecAgg+) or each noisy report, with every run.
        with self._recorder.run(run_id, {**self._run_config(), "secure-aggregation": self.placement == "distributed"}):
            result = super().start(
                grid,
                initial_arrays,
                num_rounds=num_rounds,
                timeout=timeout,
                train_config=train_config,
                evaluate_config=evaluate_config,
                evaluate_fn=evaluate_and_record,
            )
        failure = self._run_log.nothing_released(run_id, num_rounds)
        if failure is not None:
            raise NothingReleasedError(failure)
        return result

    def _run_config(self) -> dict[str, Any]:
        if self.public_config is not None:
            return self.public_config
        return {
            "strategy": type(self.strategy).__name__,
            "noise-multiplier": self.noise_multiplier,
            "clip": self.clip,
            "placement": self.placement,
            "min-reports": self.min_reports,
        }


def _int_or_zero(value: Any) -> int:
    return int(value) if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


def _float_or_zero(value: Any) -> float:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    return float(value) if ok else 0.0
