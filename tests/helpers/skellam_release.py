"""A masked round's release as the mod makes it, without the mod: validate, then release with Skellam noise."""

from __future__ import annotations

from fedfilter.client.mechanisms.gaussian_noise import NoiseStream, round_noise_stream
from fedfilter.client.mechanisms.skellam import SkellamMechanism
from fedfilter.client.release import release
from fedfilter.client.settings.policy import check_request


def release_skellam(ledger, policy, spec, update, grid, *, noise_seed=None):
    """What the mod does for a masked round: validate the request, then release it with Skellam noise."""
    check_request(spec, policy)
    stream = NoiseStream() if noise_seed is None else round_noise_stream(noise_seed, spec.run_id, spec.round_id)
    return release(
        ledger,
        SkellamMechanism.for_update(spec, grid, update),
        update,
        run_id=spec.run_id,
        round_id=spec.round_id,
        exhausted_below=policy.exhausted_below,
        after_exhaustion=policy.after_exhaustion,
        stream=stream,
    )
