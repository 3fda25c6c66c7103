"""One ``distributed`` round of the engine: every asked client's Skellam release, then SecAgg+'s sum.

Per client, the device's spend template with its Skellam steps (``EngineSkellam`` on a
``RowsAccount``; the allowances of all clients computed first with the device's ``l2_allowance``, as the
engine must know who trains; each chunk clipped at once) up to its noise, which the template adds after
the commit (``spend(..., noise=)``: the report joins the integer sum); then the sum the coordinator
unmasks: the reporting clients' integer reports added, wrapped mod ``q`` (the
quantization range SecAgg+ is set up with for the clients asked), released only with at least
``min_reports`` reports and when SecAgg+ can unmask it on its graph (``SecAggRing``).
A spent ``leave`` client drops out of the SecAgg+ round (no report); a spent ``noise-only`` client
reports its Skellam share alone. ``reports_seen`` counts the masked reports sent, released or not.

Noise (``noise_draw``): ``per-client`` draws each report's share ``Sk(mu_share)`` from the client's own
stream (``client_noise_stream``, as its device with ``noise-seed`` would), so the integer sum is
bitwise the one the devices' reports add up to; ``aggregate`` draws the sum's noise once,
``Sk(n * mu_share)`` (exact: independent Skellams add), and never forms the individual reports.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields, replace
from typing import Any

import numpy as np

from fedfilter.client.mechanisms.gaussian import clip_to_norm, snap_toward_zero
from fedfilter.client.mechanisms.sampled import SampledMechanism, coin
from fedfilter.client.mechanisms.skellam import CLIP_SLACK, SkellamGrid, l2_allowance
from fedfilter.client.mechanisms.spend import nothing_left, spend
from fedfilter.coordinator.secagg.secure_round import AUTO_SHARES
from fedfilter.coordinator.secagg.secure_round import round_graph as coordinator_round_graph
from fedfilter.privacy.sampling_rate import sampled_bound
from fedfilter.protocol.rules import reports_needed
from fedfilter.protocol.secagg.graph import SecAggGraph
from fedfilter.simulations.engine.accounts import RowsAccount
from fedfilter.simulations.engine.adaptive import RoundNumbers
from fedfilter.simulations.engine.mechanisms import EngineSkellam, EngineSkellamRows
from fedfilter.simulations.engine.norms import clip_rows
from fedfilter.simulations.engine.seeds import aggregate_noise_stream, client_noise_stream, device_coins, graph_rng
from fedfilter.simulations.engine.skellam_round import (
    SkellamRound,
    aggregate_skellam,
    per_client_noisy,
    wrap_centred,
)


def ring_unmasks(reporting_in_ring_order: np.ndarray, num_shares: int, threshold: int) -> bool:
    """Whether SecAgg+ can unmask a round on Flower's ring (``SecAggPlusWorkflow.setup_stage``).

    Node ``i`` of the ring holds shares of the nodes at offsets ``-h..h`` (``h = num_shares // 2``,
    itself included; the whole ring when ``num_shares`` reaches it). The coordinator needs, for
    every node, ``threshold`` shares from reporting holders: the self-mask seed of a reporting node,
    the mask key of one that dropped out after sharing its keys (a spent ``leave`` device drops at
    the masked-input stage). For a dropped node its own share is missing anyway, so both needs read
    "at least ``threshold`` reporting nodes among offsets ``-h..h``".

    Parameters
    ----------
    reporting_in_ring_order : numpy.ndarray
        1 (or True) where the node at that ring position sent its masked report.
    num_shares : int
        SecAgg+'s ``num_shares`` (k).
    threshold : int
        SecAgg+'s ``reconstruction_threshold`` (t).

    Returns
    -------
    bool

    Examples
    --------
    >>> import numpy as np
    >>> ring_unmasks(np.array([1, 1, 0, 1, 1, 1]), 2, 2)
    True
    >>> ring_unmasks(np.array([1, 0, 0, 1, 1, 1]), 2, 2)
    False
    """
    r = np.asarray(reporting_in_ring_order, dtype=np.int64)
    n = len(r)
    half = num_shares // 2
    if 2 * half + 1 >= n:
        return bool(r.sum() >= threshold)
    padded = np.concatenate([r[-half:], r, r[:half]])
    window = np.convolve(padded, np.ones(2 * half + 1, dtype=np.int64), mode="valid")
    return bool(window.min() >= threshold)


def round_graph(cfg, n_asked: int) -> SecAggGraph:
    """The SecAgg+ graph of a distributed round with ``n_asked`` clients: k and t from the coordinator's
    one rule (``coordinator.secure_round.round_graph``: ``"auto"`` for ``cfg.secagg_graph = "sparse"``,
    Flower's full graph 1.0 otherwise), which passes the devices' rule with ``cfg.secagg_colluders``,
    with its abort bound under the assumed drop-out rate.

    Parameters
    ----------
    cfg : EngineConfig
        Its ``min_reports`` and ``secagg_*`` fields are read.
    n_asked : int
        Clients asked in the round.

    Returns
    -------
    SecAggGraph

    Examples
    --------
    >>> from fedfilter.simulations.engine.config import EngineConfig
    >>> round_graph(EngineConfig(min_reports=2), 8)
    SecAggGraph(num_shares=8, threshold=5, abort_probability=0.0)
    >>> round_graph(EngineConfig(min_reports=2, secagg_graph="sparse"), 8)
    SecAggGraph(num_shares=3, threshold=2, abort_probability=0.0)
    """
    shares = AUTO_SHARES if cfg.secagg_graph == "sparse" else 1.0
    g = coordinator_round_graph(
        n_asked, cfg.min_reports, shares, colluders=cfg.secagg_colluders, dropout_rate=cfg.secagg_dropout_rate
    )
    return SecAggGraph(g.num_shares, g.threshold, g.abort_probability)


@dataclass
class DistributedOutcome:
    """What one distributed round produced (``mean`` is None when the round was not released).

    Attributes
    ----------
    out : numpy.ndarray
        Per asked client: True if it had nothing left.
    active : numpy.ndarray
        Clients whose data entered the sum.
    reporting : numpy.ndarray
        Spent noise-only clients (a Skellam share alone).
    mean : numpy.ndarray or None
        The float64 flat mean the coordinator steps with, or None.

    Examples
    --------
    >>> import numpy as np
    >>> outcome = DistributedOutcome(np.zeros(2, bool), np.array([0, 1]), np.array([], int), None)
    >>> outcome.mean is None
    True
    """

    out: np.ndarray  # per asked client: True if it had nothing left (exhausted)
    active: np.ndarray  # clients whose data entered the sum
    reporting: np.ndarray  # spent noise-only clients (a Skellam share alone)
    mean: np.ndarray | None  # float64 flat mean the coordinator steps with, or None


class KeptUpdates:
    """The updates of ``rows`` that enter a round's sum, formed only when ``snapped_sum`` asks.

    Parameters
    ----------
    engine : Engine
        The federation (its model, data and chunk size).
    rows : numpy.ndarray
        The clients whose update enters the sum (their coins kept it).

    Examples
    --------
    >>> import numpy as np
    >>> from fedfilter.simulations.engine.core import Engine
    >>> from fedfilter.simulations.engine.config import EngineConfig
    >>> engine = Engine(EngineConfig(num_clients=4, local_epochs=1))
    >>> KeptUpdates(engine, np.array([0, 2])).snapped_sum(0.5, 2.0**-10).shape
    (2410,)
    """

    def __init__(self, engine, rows: np.ndarray):
        self.engine, self.rows = engine, rows

    def snapped_sum(self, bound: float, gamma: float) -> np.ndarray:
        """Each row's update clipped to ``bound`` (the device's ``clip_to_norm``, or with ``norms`` other
        than ``device`` ``norms.clip_rows``: the same guarantee, certified norm at most it) and snapped
        toward zero onto the grid of step ``gamma`` (``snap_toward_zero``, the device's), summed.

        Parameters
        ----------
        bound : float
            The clip bound, model units.
        gamma : float
            The grid's step.

        Returns
        -------
        numpy.ndarray
            The int64 sum of the snapped updates (the release's flat layout).

        Examples
        --------
        >>> import numpy as np
        >>> from fedfilter.simulations.engine.core import Engine
        >>> from fedfilter.simulations.engine.config import EngineConfig
        >>> engine = Engine(EngineConfig(num_clients=4, local_epochs=1))
        >>> total = KeptUpdates(engine, np.array([1, 3])).snapped_sum(0.5, 2.0**-10)
        >>> total.dtype, bool(np.abs(total).sum() > 0)
        (dtype('int64'), True)
        """
        e, cfg, layout = self.engine, self.engine.config, self.engine.release_layout
        total = np.zeros(layout.dim, dtype=np.int64)
        for a in range(0, len(self.rows), cfg.chunk_size):
            updates = e._updates(self.rows[a : a + cfg.chunk_size])
            bad = ~np.isfinite(np.einsum("ij->i", updates, dtype=np.float64))
            updates[bad] = 0.0  # client.flower_mod: a non-finite update is released as a zero update
            if cfg.norms != "device":
                clip_rows(updates, np.full(len(updates), bound))
                total += snap_toward_zero([updates], gamma)[0].sum(axis=0)
                continue
            for row in updates:  # the device's own clip, as EngineSkellam.clip_and_snap runs it
                clipped, _ = clip_to_norm(layout.views(row), bound)
                total += np.concatenate([k.ravel() for k in snap_toward_zero(clipped, gamma)])
        return total


class DistributedPlacement:
    """The engine's distributed rounds: the device's Skellam mechanism on every budget group's rows.

    Parameters
    ----------
    engine : Engine
        An engine with ``placement="distributed"`` (it builds its own, ``engine._distributed``).

    Raises
    ------
    ValueError
        When the engine keeps no worst-case accounts, or a device would refuse the round's numbers.

    Examples
    --------
    >>> from fedfilter.simulations.engine.core import Engine
    >>> from fedfilter.simulations.engine.config import EngineConfig
    >>> engine = Engine(EngineConfig(num_clients=4, epsilon=2.0, worst_case_epsilon=4.0,
    ...                              placement="distributed", filter_kind="rdp", min_reports=2))
    >>> placement = DistributedPlacement(engine)
    >>> placement.graph
    SecAggGraph(num_shares=4, threshold=3, abort_probability=0.0)
    """

    def __init__(self, engine):
        cfg = engine.config
        self.engine = engine
        # The coordinator releases only sums of >= min_reports, and SecAgg+ unmasks only when every node
        # keeps `threshold` reporting share holders on this graph (full: max(m, 2), since Flower reads
        # a threshold of 1 as "all shares").
        self.graph = round_graph(cfg, engine.n_sampled)
        if engine.worst_filters is None:
            raise ValueError("distributed placement needs worst_case_epsilon (EngineConfig). Found None.")
        self._numbers: RoundNumbers | None = None
        self._setup(engine.round_numbers())
        # Devices that sample themselves: each client's rate this round (l2_allowance sets them) and coin.
        self.rates: dict[int, float] = {}
        self.kept: np.ndarray | None = None
        # Worst-case accounting with one aggregate draw spends rows of equal charges at once
        # (``_spend_rows``); False runs every client through the template alone (the tests compare them).
        self.batched = True

    def _setup(self, numbers: RoundNumbers) -> None:
        """The round's Skellam numbers, from its release (a fixed clip's request, or with adaptive
        clipping the augmented vector's ``z_eff`` and ``C_aug``): rebuilt only when the clip moved."""
        if numbers == self._numbers:
            return
        e, cfg = self.engine, self.engine.config
        request = (numbers.noise_multiplier, numbers.clip, cfg.min_reports, e.n_sampled)
        self.params = p = SkellamRound.from_request(*request, e.filters[0])  # alpha aside, the same for all
        # The device's SkellamGrid: its noise_std is the worst-case account's std, sqrt(mu_share) gamma.
        self.grid = SkellamGrid(p.gamma, p.mu_total, p.mu_share, p.q)
        layout = e.release_layout  # float32 arrays only (Layout): every one is released, the bit's too
        shapes = tuple(layout.shapes)
        self.mechanism = EngineSkellam(
            numbers.noise_multiplier, numbers.clip, p.sigma, self.grid, shapes, tuple(range(len(shapes))), layout.dim
        )
        self._numbers = numbers

    def l2_allowance(self, clients: np.ndarray) -> np.ndarray:
        """Each client's ``L2_allow`` (grid units), from the Gaussian allowances its ledger would give
        (the main account's at sigma, the worst-case account's at the share's std): the device's rule.

        Parameters
        ----------
        clients : numpy.ndarray
            Client positions.

        Returns
        -------
        numpy.ndarray
            One L2 allowance per client, grid units.

        Examples
        --------
        >>> import numpy as np
        >>> from fedfilter.simulations.engine.core import Engine
        >>> from fedfilter.simulations.engine.config import EngineConfig
        >>> engine = Engine(EngineConfig(num_clients=4, epsilon=2.0, worst_case_epsilon=4.0,
        ...                              placement="distributed", filter_kind="rdp", min_reports=2))
        >>> DistributedPlacement(engine).l2_allowance(np.arange(4)).round(2)
        array([1904.28, 1904.28, 1904.28, 1904.28])
        """
        self._setup(self.engine.round_numbers())
        e, m = self.engine, self.mechanism
        if e.config.planned_asks:
            return self._sampled_l2(clients)
        # Not capped at C (skellam.l2_allowance says why), as on the device.
        a_gauss = e.allowance(clients, clip=math.inf)
        a_worst = e.worst_allowance(clients, self.grid.noise_std, clip=math.inf)  # gamma, mu_share: the same for all
        out = np.zeros(len(clients))
        groups = e.group[clients]
        for g, (filt, worst) in enumerate(zip(e.filters, e.worst_filters)):
            at = groups == g
            if at.any():
                allow = l2_allowance(
                    filt, a_gauss[at], worst, a_worst[at], sigma=m.sigma, grid=self.grid, dim=m.dim, clip=m.clip
                )
                out[at] = np.asarray(allow, dtype=np.float64).reshape(np.shape(a_gauss[at]))
        return out

    def _sampler(self, rate=None, inner: EngineSkellam | None = None) -> SampledMechanism:
        cfg = self.engine.config
        base = self.mechanism if inner is None else inner
        return SampledMechanism(
            base,
            int(cfg.planned_asks),
            float(cfg.max_sampling_rate),
            cfg.exhausted_below,
            cfg.min_noise_multiplier,
            rate,
        )

    def _sampled_l2(self, clients: np.ndarray) -> np.ndarray:
        """Devices that sample themselves: each client's rate by the device's rule on its group's accounts
        (``SampledMechanism.rates``), and its L2 bound, the full clip or, spent, nothing (grid units)."""
        e, rates, gone = self.engine, np.zeros(len(clients)), np.zeros(len(clients), dtype=bool)
        groups = e.group[clients]
        for g in range(len(e.filters)):
            if (at := groups == g).any():
                # A rate reads only the row's states and asks: rows that hold the same are computed once.
                rows = clients[at]
                books = [e.state[rows], e.run_state[rows], e.asks_in_run[rows][:, None].astype(np.float64)]
                if e.worst_state is not None:
                    books.append(e.worst_state[rows])
                _, first, which = np.unique(
                    np.concatenate(books, axis=1), axis=0, return_index=True, return_inverse=True
                )
                distinct = RowsAccount(e, rows[first], g)
                rates[at] = self._sampler().rates(distinct)[which.ravel()]
                gone[at] = np.asarray(self._sampler().spent(distinct), dtype=bool)[which.ravel()]
        self.rates = {int(c): float(r) for c, r in zip(clients, rates)}
        bound = sampled_bound(gone, clip=self.mechanism.clip)
        return bound / self.grid.gamma

    def _exhausted(self, l2_allow: np.ndarray) -> np.ndarray:
        cfg, m = self.engine.config, self.mechanism  # the device's rule on SkellamMechanism.allowance
        allowance = np.asarray(l2_allow) * self.grid.gamma
        return nothing_left(allowance, clip=m.clip, floor=m.floor, exhausted_below=cfg.exhausted_below)

    def exhausted(self, clients: np.ndarray) -> np.ndarray:
        """True where a client has nothing left to give (the device's rule on its ``L2_allow``;
        under worst-case accounting, nothing left for a full round).

        Parameters
        ----------
        clients : numpy.ndarray
            Client positions.

        Returns
        -------
        numpy.ndarray
            Booleans, one per client.

        Examples
        --------
        >>> import numpy as np
        >>> from fedfilter.simulations.engine.core import Engine
        >>> from fedfilter.simulations.engine.config import EngineConfig
        >>> engine = Engine(EngineConfig(num_clients=4, epsilon=2.0, worst_case_epsilon=4.0,
        ...                              placement="distributed", filter_kind="rdp", min_reports=2))
        >>> DistributedPlacement(engine).exhausted(np.arange(4))
        array([False, False, False, False])
        """
        return self._exhausted(self.engine.uniform(clients, self.l2_allowance(clients)))

    def run(self, clients: np.ndarray, round_id: int) -> DistributedOutcome:
        """One distributed round of ``clients``: their Skellam releases, spent, and SecAgg+'s sum.

        Parameters
        ----------
        clients : numpy.ndarray
            The clients asked (sorted positions).
        round_id : int
            The round (keys the noise streams and the ring order).

        Returns
        -------
        DistributedOutcome

        Examples
        --------
        >>> import numpy as np
        >>> from fedfilter.simulations.engine.core import Engine
        >>> from fedfilter.simulations.engine.config import EngineConfig
        >>> engine = Engine(EngineConfig(num_clients=4, epsilon=2.0, worst_case_epsilon=4.0, local_epochs=1,
        ...                              placement="distributed", filter_kind="rdp", min_reports=2))
        >>> outcome = DistributedPlacement(engine).run(np.arange(4), 1)
        >>> outcome.active, outcome.mean.shape
        (array([0, 1, 2, 3]), (2410,))
        """
        e, cfg = self.engine, self.engine.config
        l2_allow = e.uniform(clients, self.l2_allowance(clients))  # sets up this round's numbers
        layout = e.release_layout
        at_bound = e.full_allowance is not None  # worst-case accounting: charged at L2_allow, not at k's norms
        out = self._exhausted(l2_allow)  # gamma and C are the same for all
        active, reporting = clients[~out], clients[out & ~e.leave[clients]]
        allow_active = l2_allow[~out]
        dim, per_client = layout.dim, cfg.noise_draw == "per-client"
        total = np.zeros(dim, dtype=np.int64)
        sampling = bool(cfg.planned_asks)
        kept = np.zeros(len(active), dtype=bool)
        batched = self.batched and at_bound and not per_client and e.adaptive is None
        if batched:
            kept = self._spend_rows(active, allow_active, total, round_id)
        for a in range(0, 0 if batched else len(active), cfg.chunk_size):
            chunk = active[a : a + cfg.chunk_size]
            updates = e._updates(chunk)
            if e.adaptive is not None:  # clipped to C, the bit appended: the row the release clips and charges
                updates = e.adaptive.augment(updates, e._clip_rows)
            bad = ~np.isfinite(np.einsum("ij->i", updates, dtype=np.float64))
            updates[bad] = 0.0  # client.flower_mod: a non-finite update is released as a zero update
            vectorised = cfg.norms != "device"
            if vectorised:  # the same guarantee as clip_to_norm: certified norm <= the clip bound
                bounds = np.asarray(allow_active[a : a + len(chunk)], dtype=np.float64) * self.grid.gamma * CLIP_SLACK
                clip_rows(updates, bounds)
            for j, c in enumerate(chunk):
                mechanism: Any = replace(
                    self.mechanism, l2_allow=float(allow_active[a + j]), clipped=vectorised, charge_at_bound=at_bound
                )
                if sampling:  # behind the coin, at the rate l2_allowance computed by the device's rule
                    mechanism = self._sampler(self.rates[int(c)], inner=mechanism)
                account = RowsAccount(e, np.array([c]), int(e.group[c]))

                def report(record, payload, c=c, row=a + j):
                    """After the commit: the client's report, ``k`` (times its coin when it samples itself)
                    and (per-client draws) its own ``Sk(mu_share)``, added to the integer sum; the payload
                    goes back unchanged."""
                    k = payload.k
                    stream = client_noise_stream(cfg.seed, int(c), cfg.run_id, round_id)
                    if sampling:  # the device's coin: the first word of its stream (mechanisms.sampled.noise)
                        keep = coin(stream, self.rates[int(c)])
                        kept[row] = bool(keep)
                        k = [x * keep for x in k]
                    if per_client:
                        k = per_client_noisy(k, self.params.mu_share, stream)
                    total[:] += np.concatenate([np.ravel(x) for x in k])
                    return payload

                spend(
                    account,
                    mechanism,
                    layout.views(updates[j]),
                    exhausted_below=cfg.exhausted_below,
                    after_exhaustion="noise-only",
                    noise=report,
                )
        n = len(active) + len(reporting)
        if per_client:
            zeros = np.zeros(dim, dtype=np.int64)
            for c in reporting:
                stream = client_noise_stream(cfg.seed, int(c), cfg.run_id, round_id)
                if sampling:  # its coin's word, drawn on the device whatever it is
                    stream.uint64(1)
                y = per_client_noisy(layout.views(zeros), self.params.mu_share, stream)
                total += np.concatenate([np.ravel(x) for x in y])
        elif n:
            stream = aggregate_noise_stream(cfg.seed, cfg.run_id, round_id)
            total += aggregate_skellam(n, self.params.mu_share, dim, stream)
        mean = None
        if n >= reports_needed("distributed", cfg.min_reports) and self.unmasks(clients, active, reporting, round_id):
            # SecAgg+ is set up for the clients asked (q = quantization_range(len(clients))).
            mean = wrap_centred(total, self.params.q).astype(np.float64) * self.params.gamma / e.divisor(n)
        self.kept = kept if sampling else None
        return DistributedOutcome(out, active, reporting, mean)

    def _spend_rows(self, active: np.ndarray, allow_active: np.ndarray, total: np.ndarray, round_id: int) -> np.ndarray:
        """Worst-case accounting with one aggregate draw: the charges are the bound's, whatever the updates,
        so the active rows that share a budget group, an ``L2_allow`` and a rate run the spend template
        once, as one account (``EngineSkellamRows``), and only the updates that enter the sum are
        trained (each client's coin is the device's, ``seeds.device_coins``; a dropped update is never
        formed). The integer sum and every state are the per-client loop's (tested); a population of
        60,000 clients then costs the updates its coins keep, not 60,000 of them. Adds the kept rows'
        snapped updates to ``total`` and returns the coins (True where the update entered the sum)."""
        e, cfg = self.engine, self.engine.config
        sampling = bool(cfg.planned_asks)
        rates = np.array([self.rates[int(c)] for c in active]) if sampling else np.ones(len(active))
        kept = device_coins(cfg.seed, cfg.run_id, round_id, active, rates) if sampling else np.ones(len(active), bool)
        keys = np.stack([e.group[active].astype(np.float64), allow_active, rates], axis=1)
        batches, which = np.unique(keys, axis=0, return_inverse=True)
        base = self.mechanism
        rows_mechanism = EngineSkellamRows(**{f.name: getattr(base, f.name) for f in fields(base)})
        for b, (group, l2, rate) in enumerate(batches):
            at = np.flatnonzero(which.ravel() == b)
            mechanism: Any = replace(rows_mechanism, l2_allow=float(l2), clipped=True, charge_at_bound=True)
            if sampling:
                mechanism = self._sampler(float(rate), inner=mechanism)

            def add(record, payload):
                """After the commit: the kept rows' snapped sum joins the round's integer sum."""
                total[:] += payload.k[0]
                return payload

            spend(
                RowsAccount(e, active[at], int(group)),
                mechanism,
                KeptUpdates(e, active[at][kept[at]]),
                exhausted_below=cfg.exhausted_below,
                after_exhaustion="noise-only",
                noise=add,
            )
        return kept

    def unmasks(self, clients: np.ndarray, active: np.ndarray, reporting: np.ndarray, round_id: int) -> bool:
        """SecAgg+ on this round's ring: the asked clients in an order drawn per round, unmasked only
        when every node keeps enough reporting holders (privacy does not depend on the drop-outs).

        Parameters
        ----------
        clients : numpy.ndarray
            The clients asked.
        active, reporting : numpy.ndarray
            Those that sent a report with data, and a noise-only one.
        round_id : int
            The round (keys the ring order).

        Returns
        -------
        bool

        Examples
        --------
        >>> import numpy as np
        >>> from fedfilter.simulations.engine.core import Engine
        >>> from fedfilter.simulations.engine.config import EngineConfig
        >>> engine = Engine(EngineConfig(num_clients=4, epsilon=2.0, worst_case_epsilon=4.0,
        ...                              placement="distributed", filter_kind="rdp", min_reports=2))
        >>> placement, asked = DistributedPlacement(engine), np.arange(4)
        >>> placement.unmasks(asked, asked[:3], asked[:0], 1), placement.unmasks(asked, asked[:1], asked[:0], 1)
        (True, False)
        """
        cfg = self.engine.config
        sent = np.isin(clients, active) | np.isin(clients, reporting)
        n = len(clients)
        order = graph_rng(cfg.seed, cfg.run_id, round_id).permutation(n)
        return ring_unmasks(sent[order], self.graph.num_shares, self.graph.threshold)
