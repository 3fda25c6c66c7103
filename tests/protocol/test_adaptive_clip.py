"""Adaptive clipping's rules against independent references: Flower's own adaptive clipping code
(``compute_adaptive_noise_params`` and the wrapper's geometric update) and the Gaussian mechanism's
exact composition (the bit as one more coordinate costs exactly what a separate release of it would)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from fedfilter.protocol.adaptive_clip import (
    AdaptiveClipping,
    accounted_noise_multiplier,
    augmented_clip,
    bit_coordinate,
    bit_scale,
    next_clip,
    unclipped_fraction,
    update_noise_multiplier,
)

try:  # flwr 1.42
    from flwr.supercore.differential_privacy import compute_adaptive_noise_params
except ImportError:  # flwr 1.41
    from flwr.common.differential_privacy import compute_adaptive_noise_params


@given(
    z_eff=st.floats(0.05, 50.0),
    sigma_b=st.floats(0.05, 500.0),
)
def test_the_update_multiplier_is_flowers(z_eff, sigma_b):
    if z_eff >= 2 * sigma_b:
        with pytest.raises(ValueError, match="noise_multiplier must be below 2 \\* clipped_count_stddev"):
            update_noise_multiplier(z_eff, sigma_b)
        return
    flower_sigma, flower_z = compute_adaptive_noise_params(z_eff, 1.0, sigma_b)
    assert flower_sigma == sigma_b
    assert update_noise_multiplier(z_eff, sigma_b) == pytest.approx(flower_z, rel=1e-12)
    assert accounted_noise_multiplier(update_noise_multiplier(z_eff, sigma_b), sigma_b) == pytest.approx(
        z_eff, rel=1e-9
    )


@given(z=st.floats(0.05, 50.0), clip=st.floats(1e-3, 1e3), sigma_b=st.floats(0.05, 500.0))
def test_one_release_of_the_augmented_vector_costs_the_update_and_the_bit_composed(z, clip, sigma_b):
    # Gaussian mechanism, noise std z C on every coordinate. The update alone (norm C) costs mu = 1/z;
    # the bit as its own release (sensitivity 1/2 in bits, noise sigma_b) costs 1/(2 sigma_b); mu^2 add
    # (Dong, Roth and Su 2022, Corollary 3.3). One release of the vector costs C_aug / (z C).
    joint = augmented_clip(clip, z, sigma_b) / (z * clip)
    composed = math.hypot(1.0 / z, 1.0 / (2.0 * sigma_b))
    assert joint == pytest.approx(composed, rel=1e-12)
    assert 1.0 / accounted_noise_multiplier(z, sigma_b) == pytest.approx(composed, rel=1e-12)
    # the bit's noise, in bits, is sigma_b: the coordinate's noise z C over the scale c
    assert z * clip / bit_scale(z, clip, sigma_b) == pytest.approx(sigma_b, rel=1e-12)


def test_the_geometric_step_is_flowers():
    from flwr.serverapp.strategy import DifferentialPrivacyServerSideAdaptiveClipping, FedAvg

    rng = np.random.default_rng(0)
    for _ in range(200):
        clip, gamma, lr, frac = rng.uniform(0.01, 10), rng.uniform(0, 1), rng.uniform(0.01, 1), rng.uniform(-0.5, 1.5)
        flower = DifferentialPrivacyServerSideAdaptiveClipping(
            FedAvg(),
            noise_multiplier=0.0,
            num_sampled_clients=10,
            initial_clipping_norm=clip,
            target_clipped_quantile=gamma,
            clip_norm_lr=lr,
        )
        flower._geometric_update(frac)
        ours = next_clip(clip, frac, AdaptiveClipping(gamma, lr))
        assert ours == pytest.approx(flower.clipping_norm, rel=1e-12)


def test_the_mean_bit_estimates_the_unclipped_fraction_without_noise():
    norms = np.array([0.1, 0.5, 0.99, 1.0, 1.01, 3.0, float("inf"), float("nan")])
    c = bit_scale(2.0, 1.0, 4.0)
    mean = np.mean([bit_coordinate(float(n), 1.0, c) for n in norms])
    assert unclipped_fraction(mean, c) == pytest.approx(4 / 8)
    # a spent device sends a zero vector: it counts as one half
    assert unclipped_fraction(0.0, c) == 0.5


def test_bad_settings_are_named_with_their_values():
    assert AdaptiveClipping(target_clipped_quantile=float("nan"), clip_norm_lr=-1.0).problems() == [
        "target_clipped_quantile must be a number in [0, 1]. Found nan.",
        "clip_norm_lr must be a positive finite number. Found -1.0.",
    ]


@given(
    z=st.floats(5e-324, 1.7e308),
    clip=st.floats(5e-324, 1.7e308),
    sigma_b=st.floats(5e-324, 1.7e308),
)
def test_no_request_value_makes_the_rules_raise(z, clip, sigma_b):
    # The coordinator chooses these: the device must be able to compute (and then refuse) any of them.
    from fedfilter.protocol.adaptive_clip import released_vector_spec
    from fedfilter.protocol.request import RoundSpec

    z_eff = accounted_noise_multiplier(z, sigma_b)
    assert 0.0 <= z_eff <= z
    assert augmented_clip(clip, z, sigma_b) >= clip
    released_vector_spec(RoundSpec("run", 1, z, clip, clipped_count_stddev=sigma_b))
