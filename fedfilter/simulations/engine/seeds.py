"""Noise generators: the same (seed, client, round) gives the same noise as the Flower path.

A Flower device with ``--node-config "noise-seed=S"`` draws round ``r`` of run ``R`` from
``fedfilter.client.mechanisms.gaussian_noise.round_noise_stream(S, R, r)``. The engine gives client ``k`` of a study
seeded ``seed``
the device seed ``client_noise_seed(seed, k)`` and calls that very function, so a Flower
simulation whose devices get ``noise-seed = client_noise_seed(seed, k)`` (for example through
``fedfilter.client.filter_mod.simulated_device_config_mod``) releases bitwise the same reports.
"""

from __future__ import annotations

import hashlib

import numpy as np

from fedfilter.client.mechanisms.gaussian_noise import NoiseStream, round_noise_stream
from fedfilter.client.mechanisms.sampled import coin


def _digest(*parts) -> bytes:
    return hashlib.sha256("\x00".join(str(p) for p in parts).encode()).digest()


def client_noise_seed(seed: int, client: int) -> int:
    """The ``noise-seed`` device ``client`` of a study seeded ``seed`` gets (fits Flower's int64).

    Parameters
    ----------
    seed : int
        The study's seed.
    client : int
        The client's index in the study.

    Returns
    -------
    int
        A non-negative seed below ``2**63``.

    Examples
    --------
    >>> client_noise_seed(0, 3)
    6427069734746266676
    >>> client_noise_seed(0, 3) < 2**63
    True
    """
    return int.from_bytes(_digest("fedfilter.engine.client", int(seed), int(client))[:8], "little") >> 1


def client_noise_stream(seed: int, client: int, run_id: str, round_id: int) -> NoiseStream:
    """Client ``client``'s noise stream for one round, exactly as its Flower device makes it.

    Parameters
    ----------
    seed : int
        The study's seed.
    client : int
        The client's index in the study.
    run_id : str
        The run the round belongs to.
    round_id : int
        The round.

    Returns
    -------
    NoiseStream
        The stream ``round_noise_stream(client_noise_seed(seed, client), run_id, round_id)``.

    Examples
    --------
    >>> a = client_noise_stream(0, 3, "run", 1).uint64(4)
    >>> b = client_noise_stream(0, 3, "run", 1).uint64(4)
    >>> bool((a == b).all())
    True
    """
    return round_noise_stream(client_noise_seed(seed, client), run_id, int(round_id))


def make_rng(seed: int) -> np.random.Generator:
    """A statistical generator for what the engine simulates in aggregate (never a device's noise).

    Parameters
    ----------
    seed : int
        Seed of the PCG64 bit generator.

    Returns
    -------
    numpy.random.Generator

    Examples
    --------
    >>> make_rng(0).integers(10, size=3)
    array([8, 6, 5])
    """
    return np.random.Generator(np.random.PCG64(seed))


def aggregate_noise_rng(seed: int, run_id: str, round_id: int) -> np.random.Generator:
    """The generator of the one aggregate draw per round (``noise_draw="aggregate"``).

    Parameters
    ----------
    seed : int
        The study's seed.
    run_id : str
        The run.
    round_id : int
        The round.

    Returns
    -------
    numpy.random.Generator

    Examples
    --------
    >>> aggregate_noise_rng(0, "run", 1).integers(10, size=3)
    array([3, 0, 5])
    """
    return make_rng(
        int.from_bytes(_digest("fedfilter.engine.aggregate", int(seed), run_id, int(round_id))[:16], "little")
    )


def graph_rng(seed: int, run_id: str, round_id: int) -> np.random.Generator:
    """The generator of one distributed round's SecAgg+ ring order (Flower shuffles with its own).

    Parameters
    ----------
    seed : int
        The study's seed.
    run_id : str
        The run.
    round_id : int
        The round.

    Returns
    -------
    numpy.random.Generator

    Examples
    --------
    >>> graph_rng(0, "run", 1).permutation(4)
    array([2, 3, 0, 1])
    """
    return make_rng(int.from_bytes(_digest("fedfilter.engine.graph", int(seed), run_id, int(round_id))[:16], "little"))


def sampling_rng(seed: int, run_id: str) -> np.random.Generator:
    """The generator the engine samples clients with when ``fraction < 1``.

    Parameters
    ----------
    seed : int
        The study's seed.
    run_id : str
        The run.

    Returns
    -------
    numpy.random.Generator

    Examples
    --------
    >>> a = sampling_rng(0, "run").random(3)
    >>> bool((a == sampling_rng(0, "run").random(3)).all())
    True
    """
    return make_rng(int.from_bytes(_digest("fedfilter.engine.sampling", int(seed), run_id)[:16], "little"))


def aggregate_noise_stream(seed: int, run_id: str, round_id: int) -> NoiseStream:
    """The stream of the one Skellam draw per distributed round (``noise_draw="aggregate"``): a
    ChaCha20 stream like a device's, keyed apart from every client's (simulation only).

    Parameters
    ----------
    seed : int
        The study's seed.
    run_id : str
        The run.
    round_id : int
        The round.

    Returns
    -------
    NoiseStream

    Examples
    --------
    >>> a = aggregate_noise_stream(0, "run", 1).uint64(2)
    >>> b = client_noise_stream(0, 0, "run", 1).uint64(2)
    >>> bool((a == b).any())
    False
    """
    return NoiseStream.from_seed("fedfilter.engine.aggregate-skellam", int(seed), run_id, int(round_id))


def device_coins(seed: int, run_id: str, round_id: int, clients: np.ndarray, rates: np.ndarray) -> np.ndarray:
    """Each client's coin in round ``round_id``, as its device flips it: the first word of its own noise
    stream (``client_noise_stream``) against its rate (``fedfilter.client.mechanisms.sampled.coin``).

    Parameters
    ----------
    seed : int
        The study's seed.
    run_id : str
        The run.
    round_id : int
        The round.
    clients : numpy.ndarray
        Client positions.
    rates : numpy.ndarray
        Each client's rate this round.

    Returns
    -------
    numpy.ndarray
        True where the client's update enters its report.

    Examples
    --------
    >>> device_coins(0, "run", 1, np.arange(3), np.array([1.0, 0.0, 1.0])).tolist()
    [True, False, True]
    """
    return np.array(
        [bool(coin(client_noise_stream(seed, int(c), run_id, round_id), float(r))) for c, r in zip(clients, rates)],
        dtype=bool,
    )
