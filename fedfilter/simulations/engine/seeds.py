"""Noise generators: the same (seed, client, round) gives the same noise as the Flower path.

A Flower device with ``--node-config "noise-seed=S"`` draws round ``r`` of run ``R`` from
``fedfilter.client.mechanisms.gaussian_noise.round_noise_stream(S, R, r)``. The engine gives client ``k`` of a study
seeded ``seed``
the device seed ``client_noise_seed(seed, k)`` and calls that very function, so a Flower
simulation whose devices get ``noise-seed = client_noise_seed(seed, k)`` (for example through
``fedfilter.client.filter_mod.simulated_device_config_mod``) releases bitwise the same reports.
"""

from __future__ import annotations

import functools

import numpy as np

from fedfilter.client.mechanisms.gaussian_noise import NoiseStream, round_noise_key, round_noise_stream, seed_key


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
    return int.from_bytes(seed_key("fedfilter.engine.client", int(seed), int(client))[:8], "little") >> 1


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
        int.from_bytes(seed_key("fedfilter.engine.aggregate", int(seed), run_id, int(round_id))[:16], "little")
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
    return make_rng(int.from_bytes(seed_key("fedfilter.engine.graph", int(seed), run_id, int(round_id))[:16], "little"))


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
    return make_rng(int.from_bytes(seed_key("fedfilter.engine.sampling", int(seed), run_id)[:16], "little"))


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


def _chacha20_first_words(keys: np.ndarray) -> np.ndarray:
    """The first 64-bit word of each key's ChaCha20 keystream (RFC 8439 section 2.3, counter 0, nonce 0:
    what ``NoiseStream(key).uint64(1)`` returns), for many keys at once.

    Parameters
    ----------
    keys : numpy.ndarray
        ``(n, 8)`` uint32: each 32-byte key read little-endian.

    Returns
    -------
    numpy.ndarray
        ``n`` uint64 words.
    """
    n = len(keys)
    state = np.zeros((16, n), dtype=np.uint32)
    state[0:4] = np.array([0x61707865, 0x3320646E, 0x79622D32, 0x6B206574], dtype=np.uint32)[
        :, None
    ]  # "expand 32-byte k"
    state[4:12] = keys.T
    x = state.copy()

    def rotl(v: np.ndarray, c: int) -> np.ndarray:
        return (v << np.uint32(c)) | (v >> np.uint32(32 - c))

    def quarter(a: int, b: int, c: int, d: int) -> None:
        x[a] += x[b]
        x[d] = rotl(x[d] ^ x[a], 16)
        x[c] += x[d]
        x[b] = rotl(x[b] ^ x[c], 12)
        x[a] += x[b]
        x[d] = rotl(x[d] ^ x[a], 8)
        x[c] += x[d]
        x[b] = rotl(x[b] ^ x[c], 7)

    with np.errstate(over="ignore"):
        for _ in range(10):  # 20 rounds: a column round and a diagonal round each
            for a, b, c, d in ((0, 4, 8, 12), (1, 5, 9, 13), (2, 6, 10, 14), (3, 7, 11, 15)):
                quarter(a, b, c, d)
            for a, b, c, d in ((0, 5, 10, 15), (1, 6, 11, 12), (2, 7, 8, 13), (3, 4, 9, 14)):
                quarter(a, b, c, d)
        out = x[0:2] + state[0:2]
    return out[0].astype(np.uint64) | (out[1].astype(np.uint64) << np.uint64(32))


def device_coins(seed: int, run_id: str, round_id: int, clients: np.ndarray, rates: np.ndarray) -> np.ndarray:
    """Each client's coin in round ``round_id``, as its device flips it: the first word of its own noise
    stream (``client_noise_stream``) against its rate (``fedfilter.client.mechanisms.sampled.coin``).

    The words are computed for all clients at once (``_chacha20_first_words``, checked against the
    device's ``NoiseStream`` in the tests): a round of 60,000 devices then takes milliseconds, not a
    second of one cipher object per device.

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
    >>> from fedfilter.client.mechanisms.sampled import coin
    >>> stream = client_noise_stream(0, 5, "run", 2)
    >>> bool(device_coins(0, "run", 2, np.array([5]), np.array([0.3]))[0]) == bool(coin(stream, 0.3))
    True
    """
    keys = np.frombuffer(
        b"".join(round_noise_key(_noise_seed(seed, int(c)), run_id, round_id) for c in clients), dtype="<u4"
    ).reshape(-1, 8)
    words = _chacha20_first_words(keys) if len(clients) else np.zeros(0, dtype=np.uint64)
    rates = np.asarray(rates, dtype=np.float64)
    keep = rates >= 1
    for rate in np.unique(rates[~keep]):  # coin(): keep when word < int(rate 2**64), in exact integers
        at = rates == rate
        keep[at] = words[at] < np.uint64(int(rate * 2.0**64))
    return keep


@functools.cache
def _noise_seed(seed: int, client: int) -> int:
    # client_noise_seed, kept: a population asks for the same 60,000 every round.
    return client_noise_seed(seed, client)
