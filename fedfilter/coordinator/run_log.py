"""What the operator reads while a run goes on: one round's public outcome, logged with the noise
figure it should carry and the devices' refusals counted by code, and the reason a run that
released nothing fails. Everything here is public: counts, the request, the model's
size and the released mean's norm.

``IndividualFilterStrategy`` (``coordinator/strategy.py``) keeps one ``RunLog`` per run.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from logging import ERROR, INFO, WARNING
from pathlib import Path

import numpy as np

from fedfilter.coordinator.public_ledger import PublicLedger
from fedfilter.coordinator.replies import describe_refusals, keep_refusal_text
from fedfilter.coordinator.signal_check import NOISE_LIKE_ALPHA, SignalWatch, is_noise_like, noise_like_norm
from fedfilter.planning.federation import mean_noise_norm
from fedfilter.protocol.flower_api import log

__all__ = [
    "RoundOutcome",
    "NothingReleasedError",
    "RunLog",
    "public_ledger_shown",
    "released_dim",
    "say_evaluation_refused",
]


@dataclass
class RoundOutcome:
    """One round's public facts (counts only; nothing per client).

    Attributes
    ----------
    round_id : int
        The round.
    sampled : int
        Devices asked.
    reports, markers, dropped : int
        Replies that were reports, ``left`` markers, or dropped.
    released : bool
        Whether the round's mean was released.
    aggregate_norm : float
        The released mean's norm (0 if not released).
    expected_noise_norm : float
        The expected norm of the noise in the released mean (0 if not released).
    reasons : list of str
        Why replies were dropped.
    refusals : dict of str to int
        Device refusal code -> replies.
    refusal_texts : dict of str to list of str
        Device refusal code -> what the devices said with it (the operator's log only).

    Examples
    --------
    >>> RoundOutcome(round_id=1, sampled=4, reports=3, markers=1).released
    False
    """

    round_id: int
    sampled: int
    reports: int = 0
    markers: int = 0
    dropped: int = 0
    released: bool = False
    aggregate_norm: float = 0.0
    expected_noise_norm: float = 0.0  # of the released mean (round rules, reports count); 0 if not released
    reasons: list[str] = field(default_factory=list)
    refusals: dict[str, int] = field(default_factory=dict)  # device refusal code -> replies
    refusal_texts: dict[str, list[str]] = field(default_factory=dict)  # code -> the devices' texts (log only)

    @property
    def received(self) -> int:
        """Replies received: reports, ``left`` markers and dropped replies.

        Examples
        --------
        >>> RoundOutcome(round_id=1, sampled=5, reports=3, markers=1, dropped=1).received
        5
        """
        return self.reports + self.markers + self.dropped


class NothingReleasedError(RuntimeError):
    """A run in which no round was released: nothing was learned, and no model is returned.

    Raised by ``IndividualFilterStrategy.start`` after the public ledger is closed, so that the
    ServerApp fails (``flwr run`` reports the run as failed) and saves no untouched model.

    Examples
    --------
    >>> raise NothingReleasedError("fedfilter: no round of run 'run-1' was released")
    Traceback (most recent call last):
    ...
    fedfilter.coordinator.run_log.NothingReleasedError: fedfilter: no round of run 'run-1' was released
    """


def released_dim(template: Sequence[np.ndarray]) -> int:
    """The coordinates devices release: the floating-point ones (integer buffers travel as zeros).

    Parameters
    ----------
    template : sequence of numpy.ndarray
        The model's arrays.

    Returns
    -------
    int
        The number of floating-point coordinates.

    Examples
    --------
    >>> released_dim([np.zeros((10, 10), np.float32), np.zeros(3, np.int64)])
    100
    """
    return sum(int(t.size) for t in template if np.issubdtype(t.dtype, np.floating))


def public_ledger_shown(public_ledger: str | Path | PublicLedger | None, run_id: str | None) -> str:
    """Where the public ledger is written: an absolute path and the run (``deploy-local`` reads it
    from the log: ``fedfilter.deploy.command.ANNOUNCED_LEDGER``).

    Parameters
    ----------
    public_ledger : str, pathlib.Path, PublicLedger or None
        The ledger, its path, or none.
    run_id : str or None
        The run written to it.

    Returns
    -------
    str
        The absolute path and the run, or ``"(none)"``.

    Examples
    --------
    >>> public_ledger_shown(None, "run-1")
    '(none)'
    >>> public_ledger_shown("/srv/ledger.sqlite", "run-1")
    '/srv/ledger.sqlite (run run-1)'
    """
    if public_ledger is None:
        return "(none)"
    path = public_ledger.path if isinstance(public_ledger, PublicLedger) else Path(public_ledger)
    return str(path.resolve()) + (f" (run {run_id})" if run_id else "")


def say_evaluation_refused(fraction_evaluate: object) -> None:
    """Client-side evaluation is not sent, and why (a warning when the inner strategy asked for it).

    Parameters
    ----------
    fraction_evaluate : object
        The inner strategy's ``fraction_evaluate`` (a positive number logs a warning, else info).

    Examples
    --------
    >>> say_evaluation_refused(0.0)  # logs at INFO through Flower's logger
    """
    asked = isinstance(fraction_evaluate, (int, float)) and fraction_evaluate > 0
    log(
        WARNING if asked else INFO,
        "fedfilter: client-side evaluation is refused (the inner strategy's fraction_evaluate=%s is not "
        "used): a client's loss or accuracy on its private data would be an un-noised release outside its "
        "budget. Evaluate held-out data on the server with start(evaluate_fn=...).",
        fraction_evaluate,
    )


@dataclass
class RunLog:
    """The run's settings (the round request's) and what its rounds amounted to so far.

    Attributes
    ----------
    noise_multiplier : float
        The request's noise multiplier.
    clip : float
        The request's clipping norm.
    placement : str
        ``"local"`` or ``"distributed"``.
    min_reports : int
        The request's minimum number of reports.
    released_rounds : int
        Rounds released so far.
    refusals : dict of str to int
        Device refusal code -> replies, over the run.
    refusal_texts : dict of str to list of str
        Device refusal code -> what the devices said with it, over the run.
    drop_reasons : set of str
        Why other replies were dropped, over the run.
    noise_warned : bool
        Whether the mostly-noise warning was logged already.
    signal_watch : SignalWatch
        The released rounds in a row whose mean was noise-like (``signal_check``).

    Examples
    --------
    >>> run = RunLog(noise_multiplier=1.0, clip=1.0, placement="local", min_reports=1)
    >>> run.round(RoundOutcome(round_id=1, sampled=4, markers=4), [np.zeros(100, np.float32)])
    >>> run.released_rounds
    0
    """

    noise_multiplier: float
    clip: float
    placement: str
    min_reports: int
    released_rounds: int = 0
    refusals: dict[str, int] = field(default_factory=dict)
    refusal_texts: dict[str, list[str]] = field(default_factory=dict)
    drop_reasons: set[str] = field(default_factory=set)
    noise_warned: bool = False
    signal_watch: SignalWatch = field(default_factory=SignalWatch)

    def start_summary(self, *, noise_std: float, secagg_num_shares: object, public_ledger: str) -> None:
        """The wrapper's settings, at the start of the run (Flower's strategy summary format).

        Parameters
        ----------
        noise_std : float
            The noise standard deviation per report.
        secagg_num_shares : object
            SecAgg+'s ``num_shares`` setting, or ``None`` without secure aggregation.
        public_ledger : str
            Where the public ledger is written (``public_ledger_shown``).

        Examples
        --------
        >>> run = RunLog(noise_multiplier=1.0, clip=1.0, placement="local", min_reports=1)
        >>> run.start_summary(noise_std=1.0, secagg_num_shares=None, public_ledger="(none)")  # logs at INFO
        """
        log(INFO, "\t├──> Individual privacy filter settings (fedfilter):")
        log(INFO, "\t│\t├── Noise multiplier: %s | Clip: %s", self.noise_multiplier, self.clip)
        log(INFO, "\t│\t├── Placement: %s | min-reports: %d", self.placement, self.min_reports)
        log(INFO, "\t│\t├── Noise std per report: %.6g", noise_std)
        if secagg_num_shares is not None:
            msg = "\t│\t├── Secure aggregation: SecAgg+ (neighbourhoods: %s; per round: round_graph)"
            log(INFO, msg, secagg_num_shares)
        log(INFO, "\t│\t├── Public ledger: %s", public_ledger)
        log(
            INFO,
            "\t│\t└── Aggregate: plain mean of the valid noisy reports, one reply of weight 1 to the inner strategy",
        )

    def expected_noise_norm(self, template: Sequence[np.ndarray], reports: int) -> float:
        """The expected norm of the noise in the mean of ``reports`` reports (``plan``'s figure).

        Parameters
        ----------
        template : sequence of numpy.ndarray
            The model's arrays (their floating-point size).
        reports : int
            Reports in the mean.

        Returns
        -------
        float
            The expected noise norm (0 with no reports or nothing released).

        Examples
        --------
        >>> run = RunLog(noise_multiplier=1.0, clip=1.0, placement="local", min_reports=1)
        >>> round(run.expected_noise_norm([np.zeros(100, np.float32)], 4), 3)
        4.988
        """
        dim = released_dim(template)
        if dim == 0 or reports < 1:
            return 0.0
        return mean_noise_norm(
            noise_multiplier=self.noise_multiplier,
            clip=self.clip,
            placement=self.placement,
            min_reports=self.min_reports,
            devices=reports,
            dim=dim,
        )

    def round(self, outcome: RoundOutcome, template: Sequence[np.ndarray]) -> None:
        """Log one round: counts, the mean's norm against its noise (a warning once, when the noise
        exceeds the clip), the refusals with their fixes, the other dropped replies.

        Parameters
        ----------
        outcome : RoundOutcome
            The round's public facts.
        template : sequence of numpy.ndarray
            The model's arrays (their floating-point size, for the warning).

        Examples
        --------
        >>> run = RunLog(noise_multiplier=1.0, clip=1.0, placement="local", min_reports=1)
        >>> run.round(RoundOutcome(round_id=1, sampled=4, dropped=2, refusals={"replay": 2}), [np.zeros(3)])
        >>> run.refusals
        {'replay': 2}
        """
        r = outcome.round_id
        log(
            INFO,
            "fedfilter round %d: %d asked, %d replies received: %d valid reports, %d left (budget spent), "
            "%d dropped; released=%s",
            *(r, outcome.sampled, outcome.received, outcome.reports, outcome.markers, outcome.dropped),
            outcome.released,
        )
        if outcome.released:
            log(
                INFO,
                "fedfilter round %d: released mean norm %.4g; expected noise norm %.4g (clip %g bounds the signal)",
                *(r, outcome.aggregate_norm, outcome.expected_noise_norm, self.clip),
            )
            if outcome.expected_noise_norm > self.clip and not self.noise_warned:
                self.noise_warned = True
                log(
                    WARNING,
                    "fedfilter: the released mean is mostly noise: its expected noise norm %.4g exceeds the clip %g, "
                    "the most the devices' signal can be. Plan settings that learn with `fedfilter plan --devices %d "
                    "--params %d --noise-multiplier %g --clip %g --placement %s ...` (more devices per round, "
                    "distributed placement, fewer parameters, or a smaller noise multiplier).",
                    *(outcome.expected_noise_norm, self.clip, outcome.reports, released_dim(template)),
                    *(self.noise_multiplier, self.clip, self.placement),
                )
        if outcome.released:
            self._watch_signal(outcome, released_dim(template))
        for line in describe_refusals(outcome.refusals, outcome.refusal_texts):
            log(WARNING, "fedfilter round %d: %s", r, line)
        for reason in sorted(set(outcome.reasons)):
            log(WARNING, "fedfilter round %d: dropped a reply: %s", r, reason)
        self.released_rounds += int(outcome.released)
        for code, n in outcome.refusals.items():
            self.refusals[code] = self.refusals.get(code, 0) + n
        for code, said in outcome.refusal_texts.items():
            for text in said:
                keep_refusal_text(self.refusal_texts, code, text)
        self.drop_reasons.update(outcome.reasons)

    def handing_mean(self, outcome: RoundOutcome) -> None:
        """Say, just before the inner strategy aggregates, what its one result is: the inner strategy
        (Flower's ``FedAvg``) then logs ``aggregate_train: Received 1 results``, which counts that one
        result, not the devices.

        Parameters
        ----------
        outcome : RoundOutcome
            The round's counts so far.

        Examples
        --------
        >>> run = RunLog(noise_multiplier=1.0, clip=1.0, placement="local", min_reports=1)
        >>> run.handing_mean(RoundOutcome(round_id=1, sampled=10, reports=10))  # logs at INFO
        """
        log(
            INFO,
            "fedfilter round %d: handing the inner strategy the plain mean of %d valid reports (of %d replies "
            "received, %d asked) as one result of weight 1: its 'Received 1 results' below counts that mean",
            *(outcome.round_id, outcome.reports, outcome.received, outcome.sampled),
        )

    def _watch_signal(self, outcome: RoundOutcome, dim: int) -> None:
        """Warn once per streak of ``signal_watch.rounds`` released rounds whose mean is noise-like."""
        if dim < 1 or not outcome.expected_noise_norm > 0:
            return
        noise_like = is_noise_like(outcome.aggregate_norm, outcome.expected_noise_norm, dim, NOISE_LIKE_ALPHA)
        if self.signal_watch.observe(noise_like):
            log(
                WARNING,
                "fedfilter: the released means of the last %d released rounds (to round %d) carry no signal the "
                "noise does not explain: each norm is within what the round's Gaussian noise alone stays below with "
                "probability %.10g (in the last round %.4g). The model is not learning from them. Likely causes: "
                "the devices' budgets are spent and they "
                "send noise only (after-exhaustion='noise-only' makes that look like a report, by design), or the "
                "noise multiplier %g is too large for %d reports (check with `fedfilter plan --devices %d "
                "--params %d --noise-multiplier %g --clip %g --placement %s ...`).",
                self.signal_watch.rounds,
                outcome.round_id,
                1 - NOISE_LIKE_ALPHA,
                noise_like_norm(outcome.expected_noise_norm, dim, NOISE_LIKE_ALPHA),
                *(self.noise_multiplier, outcome.reports, outcome.reports, dim),
                *(self.noise_multiplier, self.clip, self.placement),
            )

    def nothing_released(self, run_id: str, num_rounds: int) -> str | None:
        """Why the run failed, if ``num_rounds >= 1`` rounds released nothing; else ``None``. A failed
        run is also logged at ERROR, one line per cause with its fix, for the operator who reads only
        the log (``flwr run`` exits 0 even when the ServerApp raised).

        Parameters
        ----------
        run_id : str
            The run.
        num_rounds : int
            Rounds the run had.

        Returns
        -------
        str or None
            The message for ``NothingReleasedError``, or ``None`` if a round was released.

        Examples
        --------
        >>> run = RunLog(noise_multiplier=1.0, clip=1.0, placement="local", min_reports=1)
        >>> print(run.nothing_released("run-1", 2))  # doctest: +ELLIPSIS
        fedfilter: no round of run 'run-1' was released in 2 round(s), so nothing was learned ...
        """
        if num_rounds < 1 or self.released_rounds > 0:
            return None
        why = describe_refusals(self.refusals, self.refusal_texts)
        why += [f"dropped: {r}" for r in sorted(self.drop_reasons)]
        if not why:
            why = ["no device replied with a report (none sampled, all left, or the replies timed out)"]
        if self.placement == "distributed":
            why.append(f"a distributed round needs at least min_reports={self.min_reports} reports")
        log(
            ERROR,
            "fedfilter: NOTHING RELEASED: no round of run %r was released in %d round(s); the run fails with "
            "NothingReleasedError (`flwr run` itself exits 0: this line and the run's status say it failed). "
            "Over the run:",
            run_id,
            num_rounds,
        )
        for line in why:
            log(ERROR, "fedfilter:   %s", line.strip())
        return (
            f"fedfilter: no round of run {run_id!r} was released in {num_rounds} round(s), so nothing was learned "
            "and no model is returned. Over the run: " + "; ".join(line.strip() for line in why) + "."
        )
