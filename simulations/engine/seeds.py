"""Noise generators: the same (seed, client, round) gives the same noise as the Flower path.

A Flower device with ``--node-config "noise-seed=S"`` draws round ``r`` of run ``R`` from
``client.flower_mod._noise_rng(S, spec)``. The engine gives client ``k`` of a study seeded ``seed``
the device seed ``client_noise_seed(seed, k)`` and calls that very function, so a Flower
simulation whose devices get ``noise-seed = client_noise_seed(seed, k)`` (for example through
``client.flower_mod.simulated_device_config_mod``) releases bitwise the same reports.
"""

from __future__ import annotations

import hashlib
from functools import lru_cache

import numpy as np

from client.mechanism import make_rng
from client.release import RoundSpec


def _digest(*parts) -> bytes:
    return hashlib.sha256("\x00".join(str(p) for p in parts).encode()).digest()


def client_noise_seed(seed: int, client: int) -> int:
    """The ``noise-seed`` device ``client`` of a study seeded ``seed`` gets (fits Flower's int64)."""
    return int.from_bytes(_digest("fedfilter.engine.client", int(seed), int(client))[:8], "little") >> 1


@lru_cache(maxsize=1)
def _flower_noise_rng():
    # Imported lazily: only the per-client noise draw needs it, and it imports flwr.
    from client.flower_mod import _noise_rng

    return _noise_rng


def client_noise_rng(seed: int, client: int, run_id: str, round_id: int) -> np.random.Generator:
    """Client ``client``'s noise generator for one round, exactly as its Flower device makes it."""
    spec = RoundSpec(run_id=run_id, round_id=int(round_id), noise_multiplier=1.0, clip=1.0)
    return _flower_noise_rng()(client_noise_seed(seed, client), spec)


def aggregate_noise_rng(seed: int, run_id: str, round_id: int) -> np.random.Generator:
    """The generator of the one aggregate draw per round (``noise_draw="aggregate"``)."""
    return make_rng(int.from_bytes(_digest("fedfilter.engine.aggregate", int(seed), run_id, int(round_id))[:16], "little"))


def sampling_rng(seed: int, run_id: str) -> np.random.Generator:
    """The generator the engine samples clients with when ``fraction < 1``."""
    return make_rng(int.from_bytes(_digest("fedfilter.engine.sampling", int(seed), run_id)[:16], "little"))
