"""One Gaussian round's updates, as the engine's spend template trains, clips and noises them.

``GaussianReports`` is what the engine hands ``spend`` as the release's ``arrays`` for a local (or
central) round: ``clip(bound)`` runs after the template has computed every row's allowance and
exhaustion (a row with nothing left has bound 0 and does not train), trains the other rows in chunks,
clips each to its bound with the device's functions and sums them; ``noise(record, total)`` runs
after the commit and adds the round's noise. The sum it returns is the sum of the reports:

* per-client draws: each client's report is the device's, ``(k + R) gamma`` with ``k`` its update
  snapped onto the noise grid and ``R`` its rounded Gaussian (``add_grid_noise``). ``clip`` sums the
  ``k gamma``, ``noise`` the ``R gamma`` of every report (spent noise-only clients too). Every term is
  an integer multiple of the power of two ``gamma`` below ``2**24 gamma``, so float64 holds every
  partial sum exactly: the total is the sum of the devices' float32 reports, bitwise, in any order;
* one aggregate draw: ``clip`` sums the clipped updates, ``noise`` adds one draw for the sum.
"""

from __future__ import annotations

import math

import numpy as np

from fedfilter.client.mechanisms.gaussian import noise_grid, snap_toward_zero
from fedfilter.client.mechanisms.spend import ReleaseRecord
from fedfilter.simulations.engine.adaptive import RoundNumbers
from fedfilter.simulations.engine.seeds import aggregate_noise_rng, device_coins

__all__ = ["GaussianReports"]


class GaussianReports:
    """The updates of ``clients`` in one Gaussian round of ``engine``, trained and clipped by ``clip``.

    Parameters
    ----------
    engine : Engine
        The federation (its model, data, chunk size, noise draws).
    clients : numpy.ndarray
        The round's clients (sorted indices).
    numbers : RoundNumbers, optional
        The round's release (default ``engine.round_numbers()``); with adaptive clipping each
        update is clipped to ``C`` and carries its bit (``adaptive.AdaptiveClip.augment``), and the
        rows, their sum and the noise have the release's one more coordinate.

    Examples
    --------
    >>> from fedfilter.client.mechanisms.spend import spend
    >>> from fedfilter.simulations.engine.accounts import RoundRows
    >>> from fedfilter.simulations.engine.core import Engine
    >>> from fedfilter.simulations.engine.config import EngineConfig
    >>> from fedfilter.simulations.engine.mechanisms import EngineGaussian
    >>> engine = Engine(EngineConfig(num_clients=4, epsilon=2.0, local_epochs=1))
    >>> engine.round_id, clients = 1, np.arange(4)
    >>> mechanism = EngineGaussian("local", 1.0, 1.0, 1.0, 1.0, 2.0**-16)
    >>> reports = GaussianReports(engine, clients)
    >>> record, total = spend(RoundRows(engine, clients), mechanism, reports, exhausted_below=0.0,
    ...                       after_exhaustion="noise-only", noise=reports.noise)
    >>> record.status.tolist(), total.shape
    (['contributed', 'contributed', 'contributed', 'contributed'], (2410,))
    """

    def __init__(self, engine, clients: np.ndarray, numbers: RoundNumbers | None = None, sampled=None):
        self.engine, self.clients = engine, clients
        self.numbers = engine.round_numbers() if numbers is None else numbers
        self.added_std = self.numbers.added_std(engine.config.placement, engine.config.min_reports)
        self.out = np.zeros(len(clients), dtype=bool)  # rows with nothing left (set by clip)
        # Devices that sample themselves: the round's SampledMechanism (its rates are set by the
        # template's allowance, before ``clip``), and which rows' coins kept their update.
        self.sampled = sampled
        self.kept = np.zeros(len(clients), dtype=bool)

    def clip(self, bound: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Train the rows with something left (bound > 0), clip each to its bound; ``(sum, sensitivity)``.

        Parameters
        ----------
        bound : numpy.ndarray
            Each row's allowance, 0 where it has nothing left (the template's exhaustion rule).

        Returns
        -------
        tuple of (numpy.ndarray, numpy.ndarray)
            The float64 sum of the clipped (per-client draws: snapped) updates, and each row's
            certified norm (0 for a row with nothing left).

        Examples
        --------
        >>> import numpy as np
        >>> from fedfilter.simulations.engine.core import Engine
        >>> from fedfilter.simulations.engine.config import EngineConfig
        >>> reports = GaussianReports(Engine(EngineConfig(num_clients=4, local_epochs=1)), np.arange(4))
        >>> total, norms = reports.clip(np.array([0.5, 0.5, 0.0, 0.5]))
        >>> bool((norms <= 0.5).all()), float(norms[2]), reports.out.tolist()
        (True, 0.0, [False, False, True, False])
        """
        e, cfg, layout = self.engine, self.engine.config, self.engine.release_layout
        self.out = out = ~(bound > 0)
        active, allow_active = self.clients[~out], bound[~out]
        keep = self._coins(active, out)
        total = np.zeros(layout.dim, dtype=np.float64)
        norms = np.zeros(len(active))
        per_client = cfg.noise_draw == "per-client"
        gamma = noise_grid(self.added_std)[0] if per_client else 0.0  # the reports' grid (the device's)
        for a in range(0, len(active), cfg.chunk_size):
            chunk = active[a : a + cfg.chunk_size]
            if e._fast is not None:
                x, y = e._examples(chunk)
                chunk_sum, norms[a : a + len(chunk)] = e._fast(
                    e.weights,
                    x,
                    y,
                    lr=cfg.lr,
                    allowance=allow_active[a : a + len(chunk)],
                    keep=None if self.sampled is None else keep[a : a + len(chunk)],
                )
                total += chunk_sum
                continue
            updates = e._updates(chunk)
            if e.adaptive is not None:  # clipped to C, the bit appended: the row the release clips and charges
                updates = e.adaptive.augment(updates, e._clip_rows)
            norms[a : a + len(chunk)] = e._clip_rows(updates, allow_active[a : a + len(chunk)], layout)
            kept = keep[a : a + len(chunk)]
            if per_client:
                for j in np.flatnonzero(kept):
                    snapped = snap_toward_zero(layout.views(updates[j]), gamma)
                    total += np.concatenate([k.ravel() for k in snapped]).astype(np.float64) * gamma  # exact
            else:
                total += updates[kept].sum(axis=0, dtype=np.float64)
        sensitivity = np.zeros(len(self.clients))
        sensitivity[~out] = norms if e.full_allowance is None else allow_active  # worst-case: charged at the bound
        return total, sensitivity

    def _coins(self, active: np.ndarray, out: np.ndarray) -> np.ndarray:
        """Which of the ``active`` rows' updates enter the sum: all of them, or each device's coin at its
        rate, the first word of its noise stream as on the device (``mechanisms.sampled.coin``). The
        charges were computed from the norms and rates alone, so drawing the coin here, before the
        commit, changes nothing they say (the simulation has no observer to hide it from)."""
        if self.sampled is None:
            keep = np.ones(len(active), dtype=bool)
        else:
            e, cfg = self.engine, self.engine.config
            rates = np.broadcast_to(np.asarray(self.sampled.rate, dtype=np.float64), out.shape)[~out]
            keep = device_coins(cfg.seed, cfg.run_id, e.round_id, active, rates)
        self.kept[:] = False
        self.kept[~out] = keep
        return keep

    def reporting(self) -> tuple[np.ndarray, np.ndarray]:
        """``(active, reporting)``: the clients whose data is in the sum, and the spent noise-only ones.

        Returns
        -------
        tuple of (numpy.ndarray, numpy.ndarray)

        Examples
        --------
        >>> import numpy as np
        >>> from fedfilter.simulations.engine.core import Engine
        >>> from fedfilter.simulations.engine.config import EngineConfig
        >>> reports = GaussianReports(Engine(EngineConfig(num_clients=4, local_epochs=1)), np.arange(4))
        >>> _ = reports.clip(np.array([0.5, 0.5, 0.0, 0.5]))
        >>> reports.reporting()
        (array([0, 1, 3]), array([2]))
        """
        e = self.engine
        return self.clients[~self.out], self.clients[self.out & ~e.leave[self.clients]]

    def noise(self, record: ReleaseRecord, total: np.ndarray) -> np.ndarray:
        """The round's noise on ``total``, after the commit: every report's, or one draw for the sum.

        Parameters
        ----------
        record : ReleaseRecord
            What the round spent (its statuses say who had nothing left).
        total : numpy.ndarray
            ``clip``'s sum.

        Returns
        -------
        numpy.ndarray
            ``total`` with the noise added (in place).

        Raises
        ------
        RuntimeError
            When the record's statuses disagree with the rows ``clip`` trained.

        Examples
        --------
        >>> import numpy as np
        >>> from fedfilter.client.mechanisms.spend import ReleaseRecord
        >>> from fedfilter.simulations.engine.core import Engine
        >>> from fedfilter.simulations.engine.config import EngineConfig
        >>> engine = Engine(EngineConfig(num_clients=2, local_epochs=1))
        >>> engine.round_id = 1
        >>> reports = GaussianReports(engine, np.arange(2))
        >>> total, norms = reports.clip(np.array([0.5, 0.0]))
        >>> status = np.array(["contributed", "noise-only"])
        >>> record = ReleaseRecord(status, "local", norms, 1.0, 1.0, 1.0, np.zeros((2, 1)), None)
        >>> reports.noise(record, total).shape == (engine.layout.dim,)
        True
        """
        e, cfg = self.engine, self.engine.config
        if not np.array_equal(np.asarray(record.status) != "contributed", self.out):
            raise RuntimeError("internal error: the rows trained are not the rows the spend says contributed")
        active, reporting = self.reporting()
        reports = len(active) + len(reporting)
        dim = e.release_layout.dim
        if cfg.noise_draw == "per-client":
            zero = np.zeros(dim, dtype=np.float32)
            skip = 0 if self.sampled is None else 1  # a sampling device's stream opens with its coin's word
            for c in np.concatenate([active, reporting]):
                total += e._noisy_report(c, zero, skip=skip)  # R gamma: a noise-only report is the noise alone
        elif reports:
            # One draw for the sum. Local: the sum of `reports` independent N(0, s^2 I) reports is
            # exactly N(0, reports * s^2 I), s = z C; only the aggregate is formed, never the
            # individual reports. A device's float-safe report is the Gaussian rounded to a grid 2**16
            # times finer than s (client/mechanisms/gaussian_noise.py): its variance is about s^2 (1 + 2**-32 / 12), a
            # difference this simulated draw leaves out. Central: the coordinator's one N(0, (z C)^2 I).
            # With adaptive clipping the bit's coordinate gets its share of the draw: in central placement
            # N(0, sigma_b^2) on the count, Flower's server-side adaptive clipping's noise.
            std = self.added_std if cfg.placement == "central" else self.added_std * math.sqrt(reports)
            rng = aggregate_noise_rng(cfg.seed, cfg.run_id, e.round_id)
            total += rng.normal(0.0, std, size=dim)
        return total
