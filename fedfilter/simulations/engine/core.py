"""The vectorised engine: the Flower path's privacy code applied to every client at once.

Per round, for the clients asked (``FilteredClient.release`` for each, in vectorised form), the
device's spend template (``fedfilter.client.mechanisms.spend.spend``) runs once for the whole round
on ``RoundRows`` (every budget group's rows; one admits check, one spend per state and group):

1. allowance ``fedfilter.privacy.filters.round_allowance`` on the ``(n_clients, dim)`` states
   (lifetime filter and run-quota filter, as the ledger holds them); ``spend.nothing_left`` decides who
   has nothing left (noise-only report, or a ``left`` marker);
2. update (per-example gradient, or local SGD) of the others only, certified norm and clip with
   ``fedfilter.client.mechanisms.gaussian.certified_norm`` / ``clip_to_norm`` on each client's arrays (the very
   functions the device runs, so sensitivities, hence charges and states, are bitwise equal);
   ``norms="vectorised"`` certifies a whole chunk at once, ``norms="fast"`` computes the
   certified norms and the clipped sum layer by layer (``fedfilter.simulations.engine.layerwise``)
   (``gaussian_round.GaussianReports.clip``);
3. the charges at those norms, committed;
4. only then noise: per client with the device's generator, or one aggregate draw (``noise_draw``;
   ``GaussianReports.noise``);
5. the coordinator: plain mean of the reports, then ``w + server_lr * mean``
   (``fedfilter.coordinator.strategy``).

``distributed`` placement runs the device's other mechanism instead: Skellam noise on the SecAgg+
integer grid, charged to the rdp filter at alpha*, and the coordinator's mean from the wrapped
integer sum of at least ``min_reports`` reports (``fedfilter.simulations.engine.distributed_round``).
``central`` placement (simulation only, no device runs it) is Feldman & Zrnic's trusted curator: the clipped
updates are summed in the clear and one ``N(0, (z C)^2 I)`` draw is added to the sum.

With adaptive clipping each round's release is the augmented vector (``fedfilter.simulations.engine.adaptive``:
the update clipped to the round's ``C`` and its bit) in every placement; the released mean's bit sets
the next round's clip and its model part steps the model.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import asdict
from typing import Any

import numpy as np
import torch

from fedfilter.client.ledger.worst_case import worst_case_filter
from fedfilter.client.mechanisms.gaussian import (
    add_grid_noise,
    certified_norm,
    clip_to_norm,
    noise_grid,
    snap_toward_zero,
)
from fedfilter.client.mechanisms.sampled import SampledMechanism
from fedfilter.client.mechanisms.spend import nothing_left, spend
from fedfilter.planning.participation import BalancedSchedule
from fedfilter.planning.sampled_rounds import enrolment_order
from fedfilter.privacy.filters import make_filter
from fedfilter.protocol.rules import model_step, reports_needed
from fedfilter.simulations.engine.accounts import (
    RoundRows,
    RowsAccount,
    all_or_nothing,
    full_round_allowance,
    spent_epsilon,
)
from fedfilter.simulations.engine.adaptive import AdaptiveClip, RoundNumbers
from fedfilter.simulations.engine.config import EngineConfig, EngineResult, RoundRecord
from fedfilter.simulations.engine.distributed_round import DistributedPlacement
from fedfilter.simulations.engine.gaussian_round import GaussianReports
from fedfilter.simulations.engine.layerwise import LayerwiseClippedSum, supported
from fedfilter.simulations.engine.mechanisms import EngineGaussian
from fedfilter.simulations.engine.norms import certified_row_norms, clip_rows
from fedfilter.simulations.engine.seeds import client_noise_stream, sampling_rng
from fedfilter.simulations.engine.updates import Layout, PerExampleGradients, local_seed, local_sgd_update
from fedfilter.simulations.tasks.training import evaluate, get_weights, set_weights


class Engine:
    """A federation of ``task.num_clients`` clients, stepped one round at a time.

    Parameters
    ----------
    config : EngineConfig
        The federation, its budgets and the round requests.
    task : Task, optional
        A prebuilt task; by default ``load_task`` on the config's task arguments.

    Raises
    ------
    ValueError
        When a client has no data, or ``client_mode="single-example"`` meets a larger client.

    Examples
    --------
    >>> engine = Engine(EngineConfig(num_clients=4, epsilon=2.0, local_epochs=1))
    >>> engine.n, engine.mode
    (4, 'multi-example')
    >>> engine.step().contributing
    4
    """

    def __init__(self, config: EngineConfig, task=None):
        from fedfilter.simulations.tasks.registry import load_task

        self.config = cfg = config
        if cfg.torch_threads is not None:
            torch.set_num_threads(int(cfg.torch_threads))
        self.task = (
            task
            if task is not None
            else load_task(
                cfg.task, num_clients=cfg.num_clients, partition=cfg.partition, alpha=cfg.alpha, seed=cfg.partition_seed
            )
        )
        n = self.n = self.task.num_clients
        sizes = np.array([len(y) for _, y in self.task.train_data])
        mode = cfg.client_mode
        if mode == "auto":
            mode = "single-example" if np.all(sizes == 1) else "multi-example"
        if mode == "single-example" and not np.all(sizes == 1):
            raise ValueError(
                f"client_mode='single-example' needs one example per client. Found sizes "
                f"from {sizes.min()} to {sizes.max()}."
            )
        if np.any(sizes == 0):
            raise ValueError(f"every client needs data. Found {int((sizes == 0).sum())} empty client(s).")
        self.mode = mode

        torch.manual_seed(cfg.seed)  # the ServerApp's initial model
        self.model = (cfg.model_fn or self.task.model_fn)()
        self.weights = get_weights(self.model)
        self.layout = Layout(self.weights)

        eps = np.broadcast_to(np.asarray(cfg.epsilon, dtype=np.float64), (n,))
        # One group per distinct (budget, worst-case budget): the worst-case account (client/ledger/worst_case.py)
        # is kept in distributed placement only (in local placement it is charged the main charges
        # against a budget at least as large, so it never binds; a self-sampling device's could, at its
        # own order, so the config refuses that combination).
        keep_worst = cfg.placement == "distributed" and cfg.worst_case_epsilon is not None
        worst = np.broadcast_to(np.asarray(cfg.worst_case_epsilon, dtype=np.float64), (n,)) if keep_worst else eps
        values, group = np.unique(np.stack([eps, worst], axis=1), axis=0, return_inverse=True)
        self.group = np.asarray(group).reshape(-1)
        self.filters = [make_filter(cfg.filter_kind, float(e), cfg.delta, self._orders(float(e))) for e, _ in values]
        self.run_filters = [f.scaled(cfg.run_quota) for f in self.filters]
        self.worst_filters = (
            [worst_case_filter(f, float(w)) for f, (_, w) in zip(self.filters, values)] if keep_worst else None
        )
        worst_filters = self.worst_filters or []  # the run quota caps both accounts (client/ledger/quota.py)
        self.worst_run_filters = [w.scaled(cfg.run_quota) for w in worst_filters] if keep_worst else None
        self.state = self.filters[0].initial_state(n)
        self.run_state = self.filters[0].initial_state(n)
        self.worst_state = self.filters[0].initial_state(n) if keep_worst else None
        after = np.broadcast_to(np.asarray(cfg.after_exhaustion, dtype=object), (n,))
        self.leave = np.array([a == "leave" for a in after], dtype=bool)
        self.exhausted_round = np.full(n, -1, dtype=np.int64)
        self.asks_in_run = np.zeros(n, dtype=np.int64)  # rounds each client was asked (a ledger's spends of the run)
        self.round_id = 0
        self.records: list[RoundRecord] = []
        self._last_kept: np.ndarray | None = None  # the last round's coins (devices that sample themselves)
        self.last_groups: dict[str, float] | None = None
        self._sampler = sampling_rng(cfg.seed, cfg.run_id) if cfg.fraction < 1 else None
        self._schedule = self._balanced_schedule()
        # Adaptive clipping: the clip of the next round, and the release's layout (the model's arrays
        # and the bit's one coordinate).
        self.adaptive = (
            None
            if cfg.adaptive_clipping is None
            else AdaptiveClip(
                cfg.adaptive_clipping, noise_multiplier=cfg.noise_multiplier, clip=cfg.clip, asked=self.n_sampled
            )
        )
        self.release_layout = (
            self.layout if self.adaptive is None else Layout([*self.weights, np.zeros(1, dtype=np.float32)])
        )

        if mode == "single-example":
            self.x = torch.from_numpy(np.ascontiguousarray(np.concatenate([x for x, _ in self.task.train_data])))
            self.y = torch.from_numpy(np.concatenate([y for _, y in self.task.train_data]).astype(np.int64))
            self._grads = PerExampleGradients(self.model, self.task.loss)
        # norms="fast": layer by layer for single-example clients on Linear/Conv2d models; otherwise
        # (local SGD updates, other layers) the chunk-vectorised norms of the materialised updates.
        self.fast_fallback = None
        self._fast = None
        if cfg.norms == "fast":
            self.fast_fallback = (
                "distributed placement needs each client's integer update on the SecAgg+ grid (its Skellam "
                "charge is at its exact integer norms), which the fast mode never forms"
                if cfg.placement == "distributed"
                else "adaptive clipping appends each client's bit to its update, which the fast mode never forms"
                if cfg.adaptive_clipping is not None
                else "multi-example clients' updates come from local SGD"
                if mode != "single-example"
                else supported(self.model)
            )
            if self.fast_fallback is None:
                self._fast = LayerwiseClippedSum(self.model, self.task.loss)
        self._distributed = DistributedPlacement(self) if cfg.placement == "distributed" else None
        self.graph_rounds = np.zeros(n, dtype=np.int64)  # distributed rounds each client reported in
        # accounting="worst-case": a full round's allowance, on the fresh states (``accounts.all_or_nothing``)
        self.full_allowance = full_round_allowance(self) if cfg.accounting == "worst-case" else None

    def round_numbers(self) -> RoundNumbers:
        """The next round's release: its accounted multiplier and norm bound, the clip ``C`` and the bit's scale.

        Returns
        -------
        RoundNumbers
            The config's ``noise_multiplier`` and ``clip`` with a fixed clip; with adaptive clipping
            ``z_eff``, ``C_aug``, the current ``C`` and ``c`` (``adaptive.AdaptiveClip.numbers``).

        Examples
        --------
        >>> Engine(EngineConfig(num_clients=4, noise_multiplier=2.0, clip=0.5)).round_numbers()
        RoundNumbers(noise_multiplier=2.0, clip=0.5, request_clip=0.5, bit_scale=None)
        """
        if self.adaptive is not None:
            return self.adaptive.numbers()
        cfg = self.config
        return RoundNumbers(float(cfg.noise_multiplier), float(cfg.clip), float(cfg.clip))

    def uniform(self, clients: np.ndarray, allowance: np.ndarray) -> np.ndarray:
        """The allowance under ``config.accounting`` (``accounts.all_or_nothing``; identity if individual).

        Parameters
        ----------
        clients : numpy.ndarray
            Client positions.
        allowance : numpy.ndarray
            Their individual allowances.

        Returns
        -------
        numpy.ndarray
            ``allowance`` unchanged, or under ``worst-case`` accounting the full round's allowance
            where a client still admits it and 0 elsewhere.

        Examples
        --------
        >>> import numpy as np
        >>> engine = Engine(EngineConfig(num_clients=4, epsilon=2.0, accounting="worst-case"))
        >>> engine.uniform(np.arange(4), np.array([1.0, 0.5, 0.3, 0.0])).round(4)
        array([0.5016, 0.    , 0.    , 0.    ])
        """
        return all_or_nothing(allowance, None if self.full_allowance is None else self.full_allowance[clients])

    # --- privacy: the filters, vectorised over clients ------------------------------------------
    def _by_budget(self, clients: np.ndarray, ask) -> np.ndarray:
        """``ask(RowsAccount)`` once per distinct budget among ``clients``, scattered back to their rows."""
        out, groups = np.zeros(len(clients)), self.group[clients]
        for g in range(len(self.filters)):
            if (at := groups == g).any():
                out[at] = ask(RowsAccount(self, clients[at], g))
        return out

    def allowance(self, clients: np.ndarray, clip: float | None = None) -> np.ndarray:
        """``round_allowance`` for each client in ``clients``, at most ``clip`` (default the round's release
        bound: the request's C, or ``C_aug`` with adaptive clipping; ``inf`` for the Skellam rule,
        ``skellam.l2_allowance``), at the round's accounted std.

        Parameters
        ----------
        clients : numpy.ndarray
            Client positions.
        clip : float, optional
            The cap; default the round's release bound (``round_numbers().clip``).

        Returns
        -------
        numpy.ndarray
            The L2 norm each client's filters still admit this round.

        Examples
        --------
        >>> import numpy as np
        >>> engine = Engine(EngineConfig(num_clients=4, epsilon=2.0))
        >>> engine.allowance(np.arange(4)).round(4)
        array([0.5016, 0.5016, 0.5016, 0.5016])
        >>> engine.allowance(np.arange(4), clip=0.2)
        array([0.2, 0.2, 0.2, 0.2])
        """
        numbers = self.round_numbers()
        std, top = numbers.accounted_std, numbers.clip if clip is None else clip
        return self._by_budget(clients, lambda account: account.allowance(noise_std=std, clip=top))

    def has_budget(self, clients: np.ndarray) -> np.ndarray:
        """True where a client would still contribute data this round (the placement's exhaustion rule:
        the Gaussian allowance, or in distributed placement the Skellam one on the integer grid).

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
        >>> Engine(EngineConfig(num_clients=4, epsilon=2.0)).has_budget(np.arange(4))
        array([ True,  True,  True,  True])
        """
        if self._distributed is not None:
            return ~self._distributed.exhausted(clients)
        if self.config.planned_asks:  # a self-sampling device: not spent (sampling_rate.spent)
            return ~np.asarray(self._gaussian_mechanism().spent(RoundRows(self, clients)), dtype=bool)
        return ~self._gaussian_out(self.uniform(clients, self.allowance(clients)))

    def _gaussian_out(self, allow: np.ndarray) -> np.ndarray:
        """The device's exhaustion rule (``spend.nothing_left``) for the Gaussian release."""
        clip = self.round_numbers().clip
        return nothing_left(allow, clip=clip, floor=EngineGaussian.floor, exhausted_below=self.config.exhausted_below)

    def worst_allowance(self, clients: np.ndarray, noise_std: float, clip: float | None = None) -> np.ndarray:
        """What each client's worst-case account still admits at its share's std (``tx.worst_allowance``),
        at most ``clip`` (default the round's release bound, ``round_numbers().clip``).

        Parameters
        ----------
        clients : numpy.ndarray
            Client positions.
        noise_std : float
            The std of one client's share of the noise.
        clip : float, optional
            The cap; default the request's clip.

        Returns
        -------
        numpy.ndarray
            The L2 norm each client's worst-case account still admits.

        Examples
        --------
        >>> import numpy as np
        >>> config = EngineConfig(num_clients=4, epsilon=2.0, worst_case_epsilon=4.0, placement="distributed",
        ...                       filter_kind="rdp", min_reports=2)
        >>> Engine(config).worst_allowance(np.arange(4), noise_std=1.0).round(4)
        array([0.8639, 0.8639, 0.8639, 0.8639])
        """
        top = self.round_numbers().clip if clip is None else clip
        return self._by_budget(clients, lambda account: account.worst_allowance(noise_std=noise_std, clip=top))

    # --- one round ------------------------------------------------------------------------------
    @property
    def n_sampled(self) -> int:
        """Clients asked per round.

        Examples
        --------
        >>> Engine(EngineConfig(num_clients=4, fraction=0.5)).n_sampled
        2
        """
        return self.n if self._sampler is None else max(1, math.ceil(self.config.fraction * self.n))

    def _balanced_schedule(self) -> BalancedSchedule | None:
        """``participation="balanced"``: passes over the population, shuffled by the sampling generator."""
        if self.config.participation != "balanced" or self._sampler is None:
            return None
        return BalancedSchedule(self.n, self.n_sampled, self._sampler)

    def _sample(self) -> np.ndarray:
        if self._sampler is None:
            return np.arange(self.n)
        if self._schedule is not None:
            return np.sort(self._schedule.next_round())
        if self.config.participation == "poisson":  # each client on its own coin, the server's
            return np.flatnonzero(self._sampler.random(self.n) < self.config.fraction)
        return np.sort(self._sampler.choice(self.n, size=self.n_sampled, replace=False))

    def _updates(self, clients: np.ndarray) -> np.ndarray:
        """Flat float32 updates ``(len(clients), dim)`` before clipping."""
        cfg = self.config
        if self.mode == "single-example":
            return self._grads(self.weights, *self._examples(clients), lr=cfg.lr)
        out = np.empty((len(clients), self.layout.dim), dtype=np.float32)
        for j, c in enumerate(clients):
            x, y = self.task.train_data[c]
            upd = local_sgd_update(
                self.model,
                self.weights,
                x,
                y,
                epochs=cfg.local_epochs,
                lr=cfg.lr,
                batch_size=cfg.batch_size,
                seed=local_seed(self.round_id, c),
                loss_fn=self.task.loss,
            )
            out[j] = self.layout.flatten(upd)
        return out

    def _examples(self, clients: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        """The examples of single-example ``clients`` (sorted): a view when they are consecutive,
        as in every full-participation round (a gather of a 512-client chunk costs ~5 ms)."""
        if len(clients) and clients[-1] - clients[0] == len(clients) - 1:
            return self.x[clients[0] : clients[-1] + 1], self.y[clients[0] : clients[-1] + 1]
        idx = torch.from_numpy(clients)
        return self.x[idx], self.y[idx]

    def _clip_rows(
        self, updates: np.ndarray, allowance: np.ndarray, layout: Layout | None = None, before: np.ndarray | None = None
    ) -> np.ndarray:
        """Clip each row to its allowance in place with the device's own functions; certified norms.

        ``layout``: the rows' arrays (default the model's); ``before``: filled with each row's
        certified norm before clipping (NaN for a non-finite row)."""
        layout = self.layout if layout is None else layout
        norms = np.zeros(len(updates))
        # A row sum is finite iff every entry is (finite float32 values cannot overflow a float64 sum).
        bad = ~np.isfinite(np.einsum("ij->i", updates, dtype=np.float64))
        updates[bad] = 0.0  # client.flower_mod: a non-finite update is released as a zero update
        if self.config.norms != "device":
            if before is not None:
                before[:] = np.where(bad, np.nan, certified_row_norms(updates))
            return clip_rows(updates, allowance)
        # certified_norm casts each array to float64 first; handing it float64 views of a reused
        # buffer holding the very same values gives the same result without a large allocation
        # (and page faults) per client.
        row64 = np.empty(layout.dim, dtype=np.float64)
        views64 = layout.views(row64)
        for j in range(len(updates)):
            np.copyto(row64, updates[j])
            norm = certified_norm(views64)
            if before is not None:
                before[j] = np.nan if bad[j] else norm
            if norm > allowance[j]:
                clipped, norm = clip_to_norm(layout.views(updates[j]), float(allowance[j]))
                updates[j] = layout.flatten(clipped)
            norms[j] = norm
        return norms

    def _gaussian_round(self, clients: np.ndarray):
        """Local (and central) placement: Gaussian noise on the float grid, the Gaussian filters.

        The device's spend template runs once for the round (``RoundRows``, ``EngineGaussian``): every
        row's allowance and exhaustion, then the updates of the rows with something left trained and
        clipped (``GaussianReports.clip``), the charges committed, and only then the noise
        (``GaussianReports.noise``). Returns ``(out, active, reporting, mean)``: who had nothing left,
        who contributed data, who sent pure noise, and the mean the coordinator steps with (None if
        not released)."""
        cfg, numbers = self.config, self.round_numbers()
        if len(clients) == 0:  # a Poisson round that asked nobody: nothing to release
            return np.zeros(0, dtype=bool), clients, clients, None
        mechanism = self._gaussian_mechanism()
        reports = GaussianReports(self, clients, numbers, sampled=mechanism if cfg.planned_asks else None)
        self._last_kept = reports.kept
        _, total = spend(
            RoundRows(self, clients),
            mechanism,
            reports,
            exhausted_below=cfg.exhausted_below,
            after_exhaustion="noise-only",
            noise=reports.noise,
        )
        active, reporting = reports.reporting()
        n = len(active) + len(reporting)
        if n < reports_needed(cfg.placement, cfg.min_reports):
            return reports.out, active, reporting, None
        if cfg.participation == "poisson":  # the expected count: the mean's sensitivity is C / (q N)
            return reports.out, active, reporting, total / (cfg.fraction * self.n)
        return reports.out, active, reporting, total / self.divisor(n)  # the coordinator's mean

    def _gaussian_mechanism(self) -> Any:
        """The round's Gaussian mechanism (``EngineGaussian``), behind the device's coin when devices
        sample themselves (``SampledMechanism`` over the round's rows)."""
        cfg, numbers = self.config, self.round_numbers()
        added = numbers.added_std(cfg.placement, cfg.min_reports)  # central: the coordinator's one draw
        mechanism: Any = EngineGaussian(
            cfg.placement, numbers.noise_multiplier, numbers.clip, numbers.accounted_std, added, noise_grid(added)[0]
        )
        if cfg.planned_asks:
            return SampledMechanism(
                mechanism,
                int(cfg.planned_asks),
                float(cfg.max_sampling_rate),
                cfg.exhausted_below,
                cfg.min_noise_multiplier,
            )
        return mechanism

    def divisor(self, reports: int) -> float:
        """What the coordinator divides the sum of ``reports`` by: their number, times the plan's expected
        rate when devices sample themselves (public: ``EngineConfig.expected_rate``).

        Parameters
        ----------
        reports : int
            The reports in the sum.

        Returns
        -------
        float

        Examples
        --------
        >>> Engine(EngineConfig(num_clients=4, local_epochs=1)).divisor(4)
        4.0
        """
        return float(reports) * float(self.config.expected_rate)

    def step(self) -> RoundRecord:
        """Run one round and return its record (the model is updated in place).

        Returns
        -------
        RoundRecord
            The round as the engine and the coordinator saw it.

        Examples
        --------
        >>> record = Engine(EngineConfig(num_clients=4, epsilon=2.0, local_epochs=1)).step()
        >>> record.round_id, record.contributing, record.released
        (1, 4, True)
        """
        cfg, started = self.config, time.perf_counter()
        self.round_id += 1
        clip = self.round_numbers().request_clip
        clients = self._sample()
        self._last_kept = None
        if self._distributed is not None:
            outcome = self._distributed.run(clients, self.round_id)
            out, active, reporting, mean = outcome.out, outcome.active, outcome.reporting, outcome.mean
            self._last_kept = self._distributed.kept
            # a masked report sent is a round whose graph may fail for this client (released or not)
            self.graph_rounds[active] += 1
            self.graph_rounds[reporting] += 1
        else:
            out, active, reporting, mean = self._gaussian_round(clients)
        self.asks_in_run[clients] += 1  # each asked device recorded the round (any status)
        newly = clients[out & (self.exhausted_round[clients] < 0)]
        self.exhausted_round[newly] = self.round_id
        reports = len(active) + len(reporting)
        released = mean is not None
        agg_norm, fraction = 0.0, None
        if mean is not None:
            if self.adaptive is not None:  # the bit sets the next clip; the model part steps the model
                fraction = self.adaptive.observe(float(mean[-1]))
                mean = mean[:-1]
                if self.full_allowance is not None:  # worst-case accounting: the next round's full round
                    self.full_allowance = full_round_allowance(self)
            if self._distributed is None:
                mean = mean.astype(np.float32)  # the coordinator's float32 mean of the float32 reports
            agg_norm = float(np.sqrt(np.sum(np.square(mean, dtype=np.float64))))
            self.weights = model_step(self.weights, self.layout.views(mean), cfg.server_lr)

        record = RoundRecord(
            round_id=self.round_id,
            sampled=len(clients),
            contributing=len(active),
            noise_only=len(reporting),
            left=len(clients) - reports,
            reports_seen=reports,
            released=released,
            exhausted_total=int((self.exhausted_round >= 0).sum()),
            aggregate_norm=agg_norm,
            clip=clip,
            unclipped_fraction=fraction,
            kept=None if self._last_kept is None else int(np.sum(self._last_kept)),
        )
        if self.round_id % cfg.eval_every == 0 or self.round_id == cfg.rounds:
            record.loss, record.accuracy, record.group_accuracy = self.evaluate()
        record.seconds = time.perf_counter() - started
        self.records.append(record)
        return record

    def _orders(self, epsilon: float) -> list[float] | None:
        """The rdp order a client of budget ``epsilon`` enrols at (``EngineConfig.rdp_order``)."""
        cfg, order = self.config, self.config.rdp_order
        if order is None:
            return None
        if order == "plan":
            return [
                float(
                    enrolment_order(
                        epsilon=epsilon,
                        delta=cfg.delta,
                        noise_multiplier=float(cfg.noise_multiplier),
                        asks=int(cfg.planned_asks),
                        cap=float(cfg.max_sampling_rate),
                    )
                )
            ]
        return [float(order)]

    def _noisy_report(self, client: int, update: np.ndarray, skip: int = 0) -> np.ndarray:
        """The client's report exactly as its device sends it (float32), as float64; ``skip``: the
        words its stream spent first (a sampling device's coin)."""
        cfg, layout = self.config, self.release_layout
        std = self.round_numbers().added_std(cfg.placement, cfg.min_reports)
        stream = client_noise_stream(cfg.seed, int(client), cfg.run_id, self.round_id)
        if skip:
            stream.uint64(skip)
        snapped = snap_toward_zero(layout.views(update), noise_grid(std)[0])
        noisy = add_grid_noise(snapped, std, stream)
        return np.concatenate([a.ravel() for a in noisy]).astype(np.float64)

    # --- evaluation -----------------------------------------------------------------------------
    def evaluate(self) -> tuple[float, float, dict[str, float] | None]:
        """Test loss and accuracy of the current model, and accuracy per group (``group_by``).

        Returns
        -------
        tuple of (float, float, dict or None)
            Loss, accuracy, and accuracy per group (None for ``group_by="none"``).

        Examples
        --------
        >>> loss, accuracy, groups = Engine(EngineConfig(num_clients=4)).evaluate()
        >>> 0 <= accuracy <= 1, sorted(groups)[:3]
        (True, ['0', '1', '2'])
        """
        set_weights(self.model, self.weights)
        x, y = self.task.test_data
        loss, acc = evaluate(self.model, x, y, loss_fn=self.task.loss)
        groups = None
        if self.config.group_by == "label":
            pred = self._predict(x)
            groups = {str(int(c)): float(np.mean(pred[y == c] == c)) for c in np.unique(y)}
        elif self.config.group_by == "client":
            groups = {}
            for cid, (cx, cy) in zip(self.task.client_ids, self.task.train_data):
                groups[cid] = float(np.mean(self._predict(cx) == cy))
        self.last_groups = groups
        return float(loss), float(acc), groups

    @torch.no_grad()
    def _predict(self, x: np.ndarray, batch: int = 4096) -> np.ndarray:
        set_weights(self.model, self.weights)
        self.model.eval()
        out = [
            self.model(torch.from_numpy(np.array(x[a : a + batch]))).argmax(1).numpy() for a in range(0, len(x), batch)
        ]
        return np.concatenate(out)

    def train_accuracy(self) -> float:
        """Accuracy of the current model on every client's training data (a linear query).

        Returns
        -------
        float

        Examples
        --------
        >>> 0 <= Engine(EngineConfig(num_clients=4)).train_accuracy() <= 1
        True
        """
        correct = total = 0
        for x, y in [(self.x.numpy(), self.y.numpy())] if self.mode == "single-example" else self.task.train_data:
            correct += int((self._predict(x) == np.asarray(y)).sum())
            total += len(y)
        return correct / total

    # --- checkpoints ----------------------------------------------------------------------------
    def snapshot(self) -> dict:
        """Everything a round changes, as arrays and JSON-ready values (``restore`` undoes nothing
        else: noise generators are derived from (seed, run_id, round_id), the model from weights).

        Returns
        -------
        dict
            Round, weights, filter states, exhaustion, records and the sampler's state.

        Examples
        --------
        >>> engine = Engine(EngineConfig(num_clients=4, local_epochs=1))
        >>> _ = engine.step()
        >>> engine.snapshot()["round_id"]
        1
        """
        return {
            "round_id": self.round_id,
            "weights": [w.copy() for w in self.weights],
            "state": self.state.copy(),
            "run_state": self.run_state.copy(),
            "worst_state": None if self.worst_state is None else self.worst_state.copy(),
            "exhausted_round": self.exhausted_round.copy(),
            "asks_in_run": self.asks_in_run.copy(),
            "graph_rounds": self.graph_rounds.copy(),
            "records": [asdict(r) for r in self.records],
            "last_groups": self.last_groups,
            "sampler": None if self._sampler is None else self._sampler.bit_generator.state,
            "adaptive_clip": None if self.adaptive is None else self.adaptive.clip,
        }

    def restore(self, snap: dict) -> None:
        """Continue from ``snapshot()`` of an engine with the same config and task.

        Parameters
        ----------
        snap : dict
            What ``snapshot()`` returned (or ``load_checkpoint`` read back).

        Raises
        ------
        ValueError
            When the snapshot does not fit this engine.

        Examples
        --------
        >>> config = EngineConfig(num_clients=4, local_epochs=1)
        >>> first = Engine(config)
        >>> _ = first.step()
        >>> second = Engine(config)
        >>> second.restore(first.snapshot())
        >>> second.round_id, bool((second.state == first.state).all())
        (1, True)
        """
        shapes = [tuple(np.shape(w)) for w in snap["weights"]]
        if shapes != self.layout.shapes or np.shape(snap["state"]) != self.state.shape:
            raise ValueError(
                f"snapshot does not fit this engine: weights {shapes} and state "
                f"{np.shape(snap['state'])}, expected {self.layout.shapes} and {self.state.shape}."
            )
        self.round_id = int(snap["round_id"])
        self.weights = [np.array(w, dtype=np.float32) for w in snap["weights"]]
        self.state = np.array(snap["state"], dtype=self.state.dtype)
        self.run_state = np.array(snap["run_state"], dtype=self.run_state.dtype)
        if self.worst_state is not None:
            if snap.get("worst_state") is None:
                raise ValueError(
                    "checkpoint 'worst_state': this engine keeps worst-case accounts; the checkpoint has none."
                )
            self.worst_state = np.array(snap["worst_state"], dtype=self.worst_state.dtype)
        self.exhausted_round = np.array(snap["exhausted_round"], dtype=np.int64)
        if snap.get("asks_in_run") is not None:
            self.asks_in_run = np.array(snap["asks_in_run"], dtype=np.int64)
        elif self.config.planned_asks and self.round_id:
            raise ValueError("checkpoint 'asks_in_run' is missing: it predates devices that sample themselves.")
        if "graph_rounds" in snap:
            self.graph_rounds = np.array(snap["graph_rounds"], dtype=np.int64)
        elif self._distributed is not None and self.round_id:
            raise ValueError(
                "checkpoint 'graph_rounds' is missing: it predates the SecAgg+ graph's accounting; "
                "rerun the distributed run from round 0."
            )
        self.records = [RoundRecord(**r) for r in snap["records"]]
        self.last_groups = snap["last_groups"]
        if snap["sampler"] is not None:
            if self._sampler is None:
                raise ValueError(
                    "checkpoint 'sampler': this engine asks every client (fraction 1); the checkpoint does not."
                )
            self._sampler.bit_generator.state = snap["sampler"]
        if self._schedule is not None:  # its passes replayed from the seed: the same queue and generator
            self._sampler = sampling_rng(self.config.seed, self.config.run_id)
            schedule = self._balanced_schedule()
            if schedule is not None:
                for _ in range(self.round_id):
                    schedule.next_round()
            self._schedule = schedule
        if self.adaptive is not None:
            if snap.get("adaptive_clip") is None:
                raise ValueError("checkpoint 'adaptive_clip': this engine adapts its clip; the checkpoint has none.")
            self.adaptive.clip = float(snap["adaptive_clip"])
            if self.full_allowance is not None:  # worst-case accounting: a full round at the restored clip
                self.full_allowance = full_round_allowance(self)

    # --- results --------------------------------------------------------------------------------
    def result(self) -> EngineResult:
        """The run so far: records, spent budgets, filter states and the model.

        Returns
        -------
        EngineResult

        Examples
        --------
        >>> engine = Engine(EngineConfig(num_clients=4, epsilon=2.0, local_epochs=1))
        >>> _ = engine.step()
        >>> result = engine.result()
        >>> result.spent_epsilon.round(3), result.exhausted_round
        (array([1.511, 1.523, 1.481, 1.535]), array([-1, -1, -1, -1]))
        """
        spent = np.zeros(self.n)
        frac = np.zeros(self.n)
        for g, filt in enumerate(self.filters):
            at = self.group == g
            spent[at] = spent_epsilon(filt, self.state[at])
            frac[at] = 1.0 - filt.remaining_fraction(self.state[at])
        return EngineResult(
            config=self.config,
            rounds=list(self.records),
            client_ids=list(self.task.client_ids),
            exhausted_round=self.exhausted_round.copy(),
            spent_epsilon=spent,
            spent_fraction=frac,
            state=self.state.copy(),
            run_state=self.run_state.copy(),
            weights=[w.copy() for w in self.weights],
            group_accuracy=self.last_groups,
            graph=None if self._distributed is None else self._distributed.graph,
            graph_rounds=None if self._distributed is None else self.graph_rounds.copy(),
            worst_state=None if self.worst_state is None else self.worst_state.copy(),
        )


def run_engine(
    config: EngineConfig, progress: Callable[[RoundRecord], object] | None = None, *, task=None
) -> EngineResult:
    """Run ``config.rounds`` rounds; ``progress(record)`` after each. ``task``: a prebuilt Task.

    Parameters
    ----------
    config : EngineConfig
        The study.
    progress : callable, optional
        Called with each round's ``RoundRecord``.
    task : Task, optional
        A prebuilt task (default: loaded from the config).

    Returns
    -------
    EngineResult

    Examples
    --------
    >>> result = run_engine(EngineConfig(num_clients=4, rounds=2, epsilon=2.0, local_epochs=1))
    >>> result.contributing, result.spent_epsilon.round(3)
    ([4, 4], array([2., 2., 2., 2.]))
    """
    engine = Engine(config, task=task)
    for _ in range(config.rounds):
        record = engine.step()
        if progress is not None:
            progress(record)
    return engine.result()
