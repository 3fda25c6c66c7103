"""One distributed round through Flower's SecAgg+: the coordinator gets the sum of the reports, never one.

``IndividualFilterStrategy`` (Message API) calls ``run_secure_round`` with the content its inner
strategy built for each sampled node (``"arrays"``, ``"config"``, the round request). Flower 1.41.0
runs SecAgg+ only on its legacy server path, so this module keeps that path an internal detail:

* ``_SampledNodes``, a legacy ``Strategy`` adapter: ``configure_fit`` returns the nodes the inner
  strategy sampled; ``aggregate_fit`` keeps only Flower's unmasked aggregate, how many reports it
  sums, and whether every report had weight 1 (a device sends ``num_examples = 1``; any other value
  would make Flower's weight factor, and so ``decode_sum``, wrong). Nothing per node is kept.
* ``_MessageApiSecAggPlus``, a ``SecAggPlusWorkflow`` whose COLLECT_MASKED_VECTORS messages carry
  exactly the Message-API content given (it replaces ``state.nid_to_fitins`` after
  ``setup_stage``) and which counts the masked vectors it collected. The protocol's four stages are
  Flower's own; ``ConsistencyCheckedSecAggPlus`` adds the consistency round the devices require
  before unmasking (``coordinator/secagg/consistency.py``).

The SecAgg+ parameters: ``secaggplus_settings(n_sampled)`` (exact quantization of integer reports,
``fedfilter.protocol.secagg.grid``) and the neighbourhood graph ``round_graph`` chooses for the nodes
sampled (``num_shares`` k and ``threshold`` t; by default the sparse graph of
``fedfilter.protocol.secagg.graph.choose_graph``). Every graph passes the rule the devices check
(``fedfilter.protocol.secagg.rule.graph_problems``: ``t - c >= min_reports`` and ``2 t > k + c``), so
every sum a coordinator can unmask holds ``min_reports`` honest reports, whatever it claims. Flower's mask
generator and Shamir sharing are replaced by ``fedfilter.protocol.secagg.masks`` for the round
(devices install the same ones).
A consistency round runs before any share is revealed (``ConsistencyCheckedSecAggPlus``,
``fedfilter.coordinator.secagg.consistency``): devices refuse to unmask otherwise.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from logging import INFO

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Context, RecordDict
from flwr.serverapp import Grid

from fedfilter.coordinator.secagg.consistency import ConsistencyCheckedSecAggPlus
from fedfilter.protocol.flower_api import (
    ClientManager,
    ClientProxy,
    FitIns,
    GridClientProxy,
    LegacyContext,
    LegacyStrategy,
    Parameters,
    ServerConfig,
    WorkflowState,
    log,
    parameters_to_ndarrays,
)
from fedfilter.protocol.secagg.graph import choose_graph, graph_abort_probability
from fedfilter.protocol.secagg.grid import DEFAULT_DROPOUT_RATE, decode_sum, grid_step, secaggplus_settings
from fedfilter.protocol.secagg.masks import cryptographic_masks
from fedfilter.protocol.secagg.rule import graph_problems, smallest_threshold
from fedfilter.protocol.wire import LEGACY_CONFIGS_RECORD, LEGACY_CURRENT_ROUND, LEGACY_PARAMS_RECORD

__all__ = [
    "AUTO_SHARES",
    "RoundGraph",
    "SecureSum",
    "check_num_shares",
    "released_mean",
    "round_graph",
    "run_secure_round",
]

AUTO_SHARES = "auto"  # num_shares: the sparse graph choose_graph picks for the number sampled


@dataclass
class SecureSum:
    """What one SecAgg+ round gave the coordinator: counts, and the unmasked sum when it completed.

    Attributes
    ----------
    sampled : int
        Nodes sampled.
    masked_vectors : int
        Masked reports collected (each hides its report; none is kept).
    reports : int
        Reports in the unmasked sum; 0 when the protocol halted.
    aggregate : list of numpy.ndarray or None
        Flower's dequantized sum (decode with ``decode_sum``).
    quantization_range : int
        SecAgg+'s quantization range.
    threshold : int
        SecAgg+'s reconstruction threshold.
    reason : str
        Why there is no usable sum, for the log.
    num_shares : int
        The graph's neighbourhood size k (== ``sampled``: the full graph).
    refusals : dict of str to int
        Refusal code -> error replies, over all stages.

    Examples
    --------
    >>> SecureSum(sampled=5, reason="SecAgg+ halted").reports
    0
    """

    sampled: int
    masked_vectors: int = 0  # masked reports collected (each hides its report; none is kept)
    reports: int = 0  # reports in the unmasked sum; 0 when the protocol halted
    aggregate: list[np.ndarray] | None = None  # Flower's dequantized sum (decode with decode_sum)
    quantization_range: int = 0
    threshold: int = 0
    reason: str = ""  # why there is no usable sum, for the log
    num_shares: int = 0  # the graph's neighbourhood size k (== sampled: the full graph)
    refusals: dict[str, int] = field(default_factory=dict)  # refusal code -> error replies, all stages


def check_num_shares(num_shares: int | float | str, min_reports: int) -> int | float | str:
    """``num_shares`` as the strategy takes it: ``"auto"`` (the sparse graph ``choose_graph`` picks for
    the number sampled), a fraction in (0, 1] of the sampled nodes, or an odd integer >= 3 (the same
    as strings, as a run config holds them).

    Parameters
    ----------
    num_shares : int, float or str
        The setting to check.
    min_reports : int
        The request's ``min_reports``.

    Returns
    -------
    int, float or str
        ``"auto"``, the fraction or the integer.

    Examples
    --------
    >>> check_num_shares("auto", 4), check_num_shares("0.5", 4), check_num_shares(5, 4)
    ('auto', 0.5, 5)
    >>> check_num_shares(4, 4)
    Traceback (most recent call last):
    ...
    ValueError: secagg_num_shares as an integer must be odd and >= 3. Found 4.
    """
    if isinstance(num_shares, str):
        if num_shares == AUTO_SHARES:
            return num_shares
        try:
            num_shares = float(num_shares) if "." in num_shares else int(num_shares)
        except ValueError:
            raise ValueError(
                f"secagg_num_shares must be 'auto', a fraction in (0, 1] or an odd integer. Found {num_shares!r}."
            ) from None
    if isinstance(num_shares, bool) or not isinstance(num_shares, (int, float)):
        raise ValueError(f"secagg_num_shares must be 'auto' or a number. Found {num_shares!r}.")
    if isinstance(num_shares, float):
        if not (math.isfinite(num_shares) and 0 < num_shares <= 1):
            raise ValueError(f"secagg_num_shares as a fraction must be in (0, 1]. Found {num_shares!r}.")
        return num_shares
    if num_shares < 3 or num_shares % 2 == 0:
        # flwr 1.41.0: an even share count below the number sampled makes clients fail (IndexError in
        # _share_keys); 1 and 2 are not share counts.
        raise ValueError(f"secagg_num_shares as an integer must be odd and >= 3. Found {num_shares!r}.")
    return num_shares


@dataclass(frozen=True)
class RoundGraph:
    """One round's SecAgg+ neighbourhood: ``num_shares`` holders per node (itself included; == the
    number sampled for the full graph), ``threshold`` shares to rebuild a secret, and the per-round
    bound on the probability that the round aborts under the assumed drop-out rate (1.0 when no
    round among the nodes sampled can be unmasked).

    Attributes
    ----------
    num_shares : int
        Share holders per node ``k``, itself included.
    threshold : int
        Shares needed to rebuild a secret ``t``.
    abort_probability : float
        Bound on the probability the round aborts at the assumed drop-out rate.

    Examples
    --------
    >>> RoundGraph(num_shares=5, threshold=4, abort_probability=0.0).threshold
    4
    """

    num_shares: int
    threshold: int
    abort_probability: float


def round_graph(
    n_sampled: int,
    min_reports: int,
    num_shares: int | float | str = AUTO_SHARES,
    *,
    colluders: int = 0,
    dropout_rate: float = DEFAULT_DROPOUT_RATE,
) -> RoundGraph:
    """The graph for ``n_sampled`` nodes (>= 2), the one place the coordinator chooses k and t.

    k: ``choose_graph``'s for ``"auto"``; Flower's rule for a fraction (``round(f n)``, made odd, at
    least 3); an integer as given, at most n. t: the smallest the devices' rule allows for that k
    (``smallest_threshold``: ``t - c >= m``, ``2 t > k + c``), with k raised to hold t where a given k
    is too small. With fewer nodes than ``m + c`` no round can be unmasked: the graph then has
    ``threshold = m + c`` (Flower halts after its setup stage) and abort probability 1. Devices check
    the rule again (``check_secagg_state``).

    Parameters
    ----------
    n_sampled : int
        Nodes sampled (>= 2).
    min_reports : int
        The request's ``min_reports`` ``m``.
    num_shares : int, float or str, optional
        ``"auto"``, a fraction of the nodes sampled, or an odd integer (``check_num_shares``).
    colluders : int, optional
        Colluders ``c`` the threshold leaves room for.
    dropout_rate : float, optional
        The assumed drop-out rate, for the abort bound.

    Returns
    -------
    RoundGraph
        ``k``, ``t`` and the abort bound.

    Examples
    --------
    >>> round_graph(10, 4)
    RoundGraph(num_shares=5, threshold=4, abort_probability=0.0)
    >>> round_graph(10, 4, 1.0)
    RoundGraph(num_shares=10, threshold=6, abort_probability=0.0)
    >>> round_graph(3, 4).abort_probability
    1.0
    """
    n, m, c = int(n_sampled), int(min_reports), int(colluders)
    if n < 2:
        raise ValueError(f"n_sampled must be >= 2 for SecAgg+. Found {n_sampled!r}.")
    if isinstance(colluders, bool) or not isinstance(colluders, int) or c < 0:
        raise ValueError(f"secagg_colluders must be an integer >= 0. Found {colluders!r}.")
    shares = check_num_shares(num_shares, m)
    if m + c > n:  # fewer sampled than the sum needs: Flower halts after its setup stage, nothing is unmasked
        return RoundGraph(n, max(2, m + c), 1.0)
    if shares == AUTO_SHARES:
        chosen = choose_graph(n, min_reports=m, colluders=c, dropout_rate=dropout_rate)
        return RoundGraph(chosen.num_shares, chosen.threshold, chosen.abort_probability)
    if isinstance(shares, float):  # flwr 1.42 setup_stage's rule for a fraction
        k = round(shares * n)
        k = k + 1 if k < n and k % 2 == 0 else k
        k = n if k <= 2 else min(k, n)
    else:
        k = min(int(shares), n)
    t = smallest_threshold(k, min_reports=m, colluders=c)
    while t > k and k < n:  # the given k cannot hold the threshold the rule needs: the next allowed one
        k = min(n, t if t % 2 == 1 or t == n else t + 1)
        t = smallest_threshold(k, min_reports=m, colluders=c)
    if problems := graph_problems(sample_num=n, share_num=k, threshold=t, min_reports=m, colluders=c):
        raise ValueError(
            f"no SecAgg+ graph among {n} sampled nodes holds min_reports {m} with {c} colluders: " + " ".join(problems)
        )
    return RoundGraph(k, t, graph_abort_probability(n, k, t, dropout_rate=dropout_rate))


class _SampledNodes(LegacyStrategy):
    """A legacy strategy that samples the given nodes and keeps only the unmasked aggregate."""

    def __init__(self, proxies: list[ClientProxy]) -> None:
        self.proxies = proxies
        self.aggregate: list[np.ndarray] | None = None
        self.reports = 0
        self.unit_weights = False

    def __repr__(self) -> str:
        return "fedfilter._SampledNodes"

    def initialize_parameters(self, client_manager: ClientManager) -> Parameters | None:
        return None

    def configure_fit(self, server_round, parameters, client_manager):
        # The fit instructions are replaced by the Message-API content after setup (_MessageApiSecAggPlus).
        return [(proxy, FitIns(parameters, {})) for proxy in self.proxies]

    def aggregate_fit(self, server_round, results, failures):
        # Flower (1.41.0, unmask_stage) sets every result's parameters to the one unmasked aggregate.
        if results:
            self.aggregate = parameters_to_ndarrays(results[0][1].parameters)
            self.reports = len(results)
            self.unit_weights = all(fitres.num_examples == 1 for _, fitres in results)
        return None, {}

    def configure_evaluate(self, server_round, parameters, client_manager):
        return []

    def aggregate_evaluate(self, server_round, results, failures):
        return None, {}

    def evaluate(self, server_round, parameters):
        return None


class _MessageApiSecAggPlus(ConsistencyCheckedSecAggPlus):
    """Flower's SecAgg+ workflow with the devices' consistency round (``ConsistencyCheckedSecAggPlus``),
    sending the Message-API content given per node in its masked stage."""

    def __init__(self, contents: Mapping[int, RecordDict], graph: RoundGraph, **kwargs) -> None:
        super().__init__(**kwargs)
        self.contents = dict(contents)
        self.graph = graph
        self.masked_vectors = 0
        self.threshold = 0

    def setup_stage(self, grid: Grid, context: LegacyContext, state: WorkflowState) -> bool:
        ok = super().setup_stage(grid, context, state)
        # Override (flwr 1.41.0): collect_masked_vectors_stage sends state.nid_to_fitins[nid] (plus its
        # protocol config) to each node; send the inner strategy's messages instead of legacy FitIns.
        if state.nid_to_fitins and set(state.nid_to_fitins) != set(self.contents):
            raise RuntimeError("SecAgg+ sampled other nodes than the inner strategy.")
        state.nid_to_fitins = {nid: self.contents[nid] for nid in state.nid_to_fitins}
        self.threshold = state.threshold
        return ok

    def collect_masked_vectors_stage(self, grid: Grid, context: LegacyContext, state: WorkflowState) -> bool:
        ok = super().collect_masked_vectors_stage(grid, context, state)
        # Count only (flwr 1.41.0 leaves the survivors in state.active_node_ids after this stage).
        self.masked_vectors = len(state.active_node_ids)
        return ok


def run_secure_round(
    grid: Grid,
    contents: Mapping[int, RecordDict],
    *,
    server_round: int,
    min_reports: int,
    num_shares: int | float | str = AUTO_SHARES,
    colluders: int = 0,
    timeout: float | None = None,
) -> SecureSum:
    """Run Flower's SecAgg+ once over the nodes in ``contents`` (node id -> train message content).

    ``timeout`` bounds each of the four stages' waits (Flower's own rule), so a round takes at most
    about four times it; Flower builds the stages' messages with its default TTL (12 h).

    Parameters
    ----------
    grid : Grid
        Flower's grid.
    contents : Mapping of int to RecordDict
        Node id -> the content of its train message.
    server_round : int
        The round.
    min_reports : int
        The request's ``min_reports``.
    num_shares : int, float or str, optional
        The SecAgg+ neighbourhood (``round_graph``).
    colluders : int, optional
        Colluders the threshold leaves room for.
    timeout : float or None, optional
        Each stage's wait, in seconds.

    Returns
    -------
    SecureSum
        The round's counts and, when it completed, the unmasked sum.

    Examples
    --------
    >>> secure = run_secure_round(grid, contents, server_round=1, min_reports=4)  # doctest: +SKIP
    >>> run_secure_round(None, {7: RecordDict()}, server_round=1, min_reports=1).reason
    'SecAgg+ needs at least 2 sampled nodes. Found 1.'
    """
    out = SecureSum(sampled=len(contents))
    if len(contents) < 2:
        out.reason = f"SecAgg+ needs at least 2 sampled nodes. Found {len(contents)}."
        return out
    graph = round_graph(len(contents), min_reports, num_shares, colluders=colluders)
    out.num_shares = graph.num_shares
    settings = secaggplus_settings(len(contents))
    out.quantization_range = int(settings["quantization_range"])
    adapter = _SampledNodes([GridClientProxy(int(nid), grid, int(grid.run.run_id)) for nid in contents])
    workflow = _MessageApiSecAggPlus(
        contents,
        graph,
        # The full graph as Flower's fraction 1.0 (an integer k = n with t < k is refused by Flower).
        num_shares=1.0 if graph.num_shares == len(contents) else graph.num_shares,
        reconstruction_threshold=graph.threshold,
        timeout=timeout,
        **settings,
    )
    base = Context(run_id=int(grid.run.run_id), node_id=0, node_config={}, state=RecordDict(), run_config={})
    context = LegacyContext(base, config=ServerConfig(num_rounds=1), strategy=adapter)
    # The LegacyContext records Flower's SecAgg+ workflow reads.
    context.state.config_records[LEGACY_CONFIGS_RECORD] = ConfigRecord({LEGACY_CURRENT_ROUND: int(server_round)})
    context.state.array_records[LEGACY_PARAMS_RECORD] = ArrayRecord()
    failure = ""
    with cryptographic_masks():
        try:
            workflow(grid, context)
        except (KeyError, TypeError, ValueError, IndexError) as err:
            # flwr 1.41.0 indexes replies without checking them: a malformed reply raises. The round is
            # then not released (nothing reached aggregate_fit), and one bad node cannot stop the run.
            failure = f"SecAgg+ failed on a malformed reply ({type(err).__name__}: {err})"
    out.masked_vectors = workflow.masked_vectors
    out.refusals = dict(workflow.refusals)
    out.threshold = workflow.threshold
    if failure:
        out.reason = failure
    elif adapter.aggregate is None:
        out.reason = f"SecAgg+ halted: fewer than its threshold {workflow.threshold} nodes stayed"
    elif not adapter.unit_weights:
        out.reason = "a report's weight (num_examples) is not 1: the unmasked sum cannot be decoded"
    else:
        out.reports = adapter.reports
        out.aggregate = adapter.aggregate
    log(
        INFO,
        "fedfilter secure round %d: %d sampled, %d masked vectors, %d in the sum "
        "(SecAgg+ graph: %d shares, threshold %d, abort probability <= %.3g at the assumed drop-outs)",
        server_round,
        out.sampled,
        out.masked_vectors,
        out.reports,
        graph.num_shares,
        graph.threshold,
        graph.abort_probability,
    )
    return out


def released_mean(
    secure: SecureSum, *, template: Sequence[np.ndarray], clip: float, min_reports: int
) -> tuple[list[np.ndarray] | None, str]:
    """The round's mean update ``decode_sum(sum) * grid_step(clip) / n`` in float64, or ``None`` and why.

    Released only when the sum holds at least ``min_reports`` reports: fewer carry less than the
    accounted noise (each share is calibrated to ``min_reports``). SecAgg+ already halts below its
    threshold (``min_reports``); this checks again.

    Parameters
    ----------
    secure : SecureSum
        What the SecAgg+ round gave.
    template : sequence of numpy.ndarray
        The model's arrays (their shapes).
    clip : float
        The request's clip (it sets the grid step).
    min_reports : int
        The fewest reports a released sum holds.

    Returns
    -------
    tuple of (list of numpy.ndarray or None, str)
        The mean update, or ``None`` and why (``""`` when the protocol gave no sum).

    Examples
    --------
    One report ``(3, -2)`` on the grid, as Flower hands it over with quantization range 8:

    >>> secure = SecureSum(sampled=2, reports=1, aggregate=[np.array([-1.0, 2.0])], quantization_range=8)
    >>> mean, why = released_mean(secure, template=[np.zeros(2, np.float32)], clip=1.0, min_reports=1)
    >>> mean[0] / grid_step(1.0), why
    (array([ 3., -2.]), '')
    >>> released_mean(secure, template=[np.zeros(2, np.float32)], clip=1.0, min_reports=2)
    (None, 'the sum holds 1 reports, fewer than min-reports 2')
    """
    n = secure.reports
    if secure.aggregate is None:
        return None, ""
    if n < min_reports:
        return None, f"the sum holds {n} reports, fewer than min-reports {min_reports}"
    shapes = [tuple(a.shape) for a in secure.aggregate]
    if shapes != [tuple(np.shape(t)) for t in template]:
        return None, f"the unmasked sum has shapes {shapes}, not the model's"
    gamma = grid_step(clip)
    sums = decode_sum(secure.aggregate, n, secure.quantization_range)
    return [s.astype(np.float64) * gamma / n for s in sums], ""
