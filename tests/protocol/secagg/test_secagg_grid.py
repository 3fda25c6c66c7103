"""The integer grid over SecAgg+: Flower's own quantization must be exact on it, and the server's
float result must decode to the integer sum (mod q) whatever wraps."""

from __future__ import annotations

import numpy as np
import pytest
from flwr.common.secure_aggregation.quantization import quantize

from fedfilter.client.secagg.neighbourhood import check_secagg_state
from fedfilter.protocol.secagg.grid import (
    MODULUS_RANGE,
    decode_sum,
    encode_report,
    grid_step,
    quantization_range,
    secaggplus_settings,
)


def _flower_sum(ys, settings):
    """What Flower's client mod and unmask stage compute from the devices' encoded reports (weight 1)."""
    q, c, m = settings["quantization_range"], settings["clipping_range"], settings["modulus_range"]
    n = len(ys)
    quantized = [quantize(encode_report([y], q), c, q)[0] for y in ys]
    recon = sum(a.astype(np.int64) for a in quantized) % m
    total_ratio = np.int64((n * round(1.0 * q)) % m)
    vec = recon.astype(float) * (2 * c / q) - c  # dequantize
    vec += -(n - 1) * c
    vec *= q / total_ratio
    return quantized, vec


@pytest.mark.parametrize("n", [2, 3, 10, 17, 100, 255, 1000])
def test_flower_quantization_is_exact_and_the_sum_decodes(n):
    settings = secaggplus_settings(n)
    q = settings["quantization_range"]
    assert n * q < MODULUS_RANGE and settings["max_weight"] == 1.0
    rng = np.random.default_rng(n)
    ys = [rng.integers(-q // (2 * n), q // (2 * n), size=500) for _ in range(n)]
    ys[0][:4] = [q, -q, 5 * q + 3, -(q // 2)]  # values past the range wrap on the device
    quantized, vec = _flower_sum(ys, settings)
    for a, y in zip(quantized, ys):
        np.testing.assert_array_equal(a, np.mod(y, q))  # Flower's stochastic rounding was a no-op
    (decoded,) = decode_sum([vec], n, q)
    total = sum(ys)
    np.testing.assert_array_equal(decoded, np.mod(total + q // 2, q) - q // 2)
    inside = np.abs(total) < q // 2
    np.testing.assert_array_equal(decoded[inside], total[inside])


def test_grid_step_is_a_power_of_two_below_the_clip():
    for clip in (1e-6, 0.1, 0.5, 1.0, 3.0, 1e6):
        step = grid_step(clip)
        assert np.frexp(step)[0] == 0.5
        assert 2**12 <= clip / step < 2**13
    with pytest.raises(ValueError, match="clip"):
        grid_step(float("nan"))


def test_quantization_range_fits_the_modulus():
    for n in (1, 2, 3, 4, 255, 256, 4095):
        q = quantization_range(n)
        assert n * q < MODULUS_RANGE and (2 * q > 2**30 or n * 2 * q >= MODULUS_RANGE)


def _state(**over):
    base = {"target_range": 2**24, "clipping_range": 2.0**23, "mod_range": 2**32, "max_weight": 1.0}
    base.update({"sample_num": 10, "threshold": 5, "share_num": 9})
    base.update(over)
    return base


def test_device_accepts_the_coordinators_settings_only_when_exact():
    assert check_secagg_state(_state(), min_reports=5) == []
    bad = {
        "max_weight": 1000.0,  # Flower's default: the factor scales reports by 1/1000
        "clipping_range": 8.0,
        "target_range": 3 * 2**20,
        "mod_range": 2**31 + 1,
    }
    for key, value in bad.items():
        problems = check_secagg_state(_state(**{key: value}), min_reports=5)
        assert problems and key.split("_")[0] in " ".join(problems), (key, problems)
    assert "threshold" in " ".join(check_secagg_state(_state(threshold=4), min_reports=5))
    assert "sample_num" in " ".join(check_secagg_state(_state(sample_num=300), min_reports=5))
    assert check_secagg_state({}, min_reports=1)
