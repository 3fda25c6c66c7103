"""One ``distributed`` round of the engine: every asked client's Skellam release, then SecAgg+'s sum.

Per client, ``fedfilter.simulations.engine.skellam_round.ClientRule`` (the device's steps); then the
sum the coordinator unmasks: the reporting clients' integer reports added, wrapped mod ``q`` (the
quantization range SecAgg+ is set up with for the clients asked), released only with at least
``min_reports`` reports and SecAgg+'s threshold (``coordinator.secure_round.reconstruction_threshold``).
A spent ``leave`` client drops out of the SecAgg+ round (no report); a spent ``noise-only`` client
reports its Skellam share alone. ``reports_seen`` counts the masked reports sent, released or not.

Noise (``noise_draw``): ``per-client`` draws each report's share ``Sk(mu_share)`` from the client's own
stream (``client_noise_stream``, as its device with ``noise-seed`` would), so the integer sum is
bitwise the one the devices' reports add up to; ``aggregate`` draws the sum's noise once,
``Sk(n * mu_share)`` (exact: independent Skellams add), and never forms the individual reports.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fedfilter.client.round_rules import reports_needed
from fedfilter.coordinator.secure_round import reconstruction_threshold
from fedfilter.simulations.engine.norms import clip_rows
from fedfilter.simulations.engine.seeds import aggregate_noise_stream, client_noise_stream
from fedfilter.simulations.engine.skellam_round import (
    ClientRule,
    SkellamRound,
    aggregate_skellam,
    per_client_noisy,
    wrap_centred,
)


@dataclass
class DistributedOutcome:
    """What one distributed round produced (``mean`` is None when the round was not released)."""

    out: np.ndarray  # per asked client: True if it had nothing left (exhausted)
    active: np.ndarray  # clients whose data entered the sum
    reporting: np.ndarray  # spent noise-only clients (a Skellam share alone)
    mean: np.ndarray | None  # float64 flat mean the coordinator steps with, or None


class DistributedPlacement:
    """The engine's distributed rounds: one ``ClientRule`` per distinct budget."""

    def __init__(self, engine):
        cfg = engine.config
        self.engine = engine
        request = (cfg.noise_multiplier, cfg.clip, cfg.min_reports, engine.n_sampled)
        self.params = SkellamRound.from_request(*request, engine.filters[0])  # alpha aside, the same for all
        # SecAgg+ unmasks only sums of >= its threshold (max(m, 2): Flower reads a threshold of 1 as "all
        # shares"), and the coordinator releases only sums of >= min_reports.
        self.threshold = max(reports_needed("distributed", cfg.min_reports), reconstruction_threshold(cfg.min_reports))
        if engine.worst_filters is None:
            raise ValueError("distributed placement needs worst_case_epsilon (EngineConfig). Found None.")
        self.rules = [
            ClientRule(SkellamRound.from_request(*request, f), f, rf, cfg.clip, engine.layout.dim, w)
            for f, rf, w in zip(engine.filters, engine.run_filters, engine.worst_filters)
        ]

    def l2_allowance(self, clients: np.ndarray) -> np.ndarray:
        """Each client's ``L2_allow`` (grid units), from the Gaussian allowances its ledger would give
        (the main account's at sigma, the worst-case account's at the share's std)."""
        e = self.engine
        a_gauss = e.allowance(clients)
        a_worst = e.worst_allowance(clients, self.rules[0].grid.noise_std)  # gamma, mu_share: the same for all
        out = np.zeros(len(clients))
        groups = e.group[clients]
        for g, rule in enumerate(self.rules):
            at = groups == g
            if at.any():
                out[at] = rule.l2_allowance(a_gauss[at], a_worst[at])
        return out

    def exhausted(self, clients: np.ndarray) -> np.ndarray:
        return self.rules[0].exhausted(self.l2_allowance(clients), self.engine.config.exhausted_below)

    def run(self, clients: np.ndarray, round_id: int) -> DistributedOutcome:
        e, cfg = self.engine, self.engine.config
        l2_allow = self.l2_allowance(clients)
        out = self.rules[0].exhausted(l2_allow, cfg.exhausted_below)  # gamma and C are the same for all
        active, reporting = clients[~out], clients[out & ~e.leave[clients]]
        allow_active = l2_allow[~out]
        dim, per_client = e.layout.dim, cfg.noise_draw == "per-client"
        total = np.zeros(dim, dtype=np.int64)
        for a in range(0, len(active), cfg.chunk_size):
            chunk = active[a : a + cfg.chunk_size]
            updates = e._updates(chunk)
            bad = ~np.isfinite(np.einsum("ij->i", updates, dtype=np.float64))
            updates[bad] = 0.0  # client.flower_mod: a non-finite update is released as a zero update
            vectorised = cfg.norms != "device"
            if vectorised:  # the same guarantee as clip_to_norm: certified norm <= the clip bound
                clip_rows(updates, self.rules[0].clip_bound(allow_active[a : a + len(chunk)]))
            for j, c in enumerate(chunk):
                rule = self.rules[e.group[c]]
                k = rule.snap(e.layout.views(updates[j]), allow_active[a + j], clipped=vectorised)
                e._skellam_spend(int(c), rule, rule.charge(k)[0], k)
                if per_client:
                    stream = client_noise_stream(cfg.seed, int(c), cfg.run_id, round_id)
                    k = per_client_noisy(k, rule.p.mu_share, stream)
                total += np.concatenate([np.ravel(x) for x in k])
        n = len(active) + len(reporting)
        if per_client:
            zeros = np.zeros(dim, dtype=np.int64)
            for c in reporting:
                stream = client_noise_stream(cfg.seed, int(c), cfg.run_id, round_id)
                y = per_client_noisy(e.layout.views(zeros), self.params.mu_share, stream)
                total += np.concatenate([np.ravel(x) for x in y])
        elif n:
            stream = aggregate_noise_stream(cfg.seed, cfg.run_id, round_id)
            total += aggregate_skellam(n, self.params.mu_share, dim, stream)
        mean = None
        if n >= self.threshold:
            # SecAgg+ is set up for the clients asked (q = quantization_range(len(clients))).
            mean = wrap_centred(total, self.params.q).astype(np.float64) * self.params.gamma / n
        return DistributedOutcome(out, active, reporting, mean)
