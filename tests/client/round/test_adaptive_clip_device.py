"""Adaptive clipping on the device: the clip bit rides in the report as one more coordinate, and the
device's filter charges the report vector, bit included, at its actual norm.

References: the charge of one Gaussian release is ``mu = ||x|| / sigma`` (Dong, Roth and Su 2022,
Theorem 2.7); releasing the update and the bit as one vector costs what the two releases composed cost
(``mu^2`` add, their Corollary 3.3), which is what Andrew et al. (NeurIPS 2021, Section 3.1) charge.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from helpers.mods import KEYS, Handler, context, records, train_message
from helpers.secagg import DTYPES as SECAGG_DTYPES
from helpers.secagg import ledger_records, run_round

from fedfilter.client.filter_mod import individual_filter_mod
from fedfilter.client.mechanisms.gaussian import GaussianMechanism, noise_grid
from fedfilter.protocol.adaptive_clip import accounted_noise_multiplier, augmented_clip, bit_scale
from fedfilter.protocol.refusals import refusal_code
from fedfilter.protocol.request import RoundSpec
from fedfilter.protocol.wire import ARRAYS_RECORD, CLIP_BIT_KEY

SECAGG_FLOATING = [d for d in SECAGG_DTYPES if np.dtype(d).kind == "f"]


def adaptive(round_id=1, *, z=1.0, clip=1.0, sigma_b=2.0, placement="local", m=1) -> RoundSpec:
    return RoundSpec("run-a", round_id, z, clip, placement, m, clipped_count_stddev=sigma_b)


@pytest.mark.parametrize("step,within", [(1.0, False), (1e-4, True)])
def test_a_local_report_carries_the_bit_and_is_charged_for_the_whole_vector(tmp_path, step, within):
    z, clip, sigma_b = 5.0, 1.0, 2.0  # a full round fits the budget and its run quota
    spec = adaptive(z=z, clip=clip, sigma_b=sigma_b)
    reply = individual_filter_mod(train_message(spec), context(tmp_path, filter="gdp"), Handler(step=step))
    assert not reply.has_error(), reply.error.reason if reply.has_error() else ""
    assert list(reply.content[ARRAYS_RECORD].keys()) == [*KEYS, CLIP_BIT_KEY]
    assert reply.content[ARRAYS_RECORD][CLIP_BIT_KEY].numpy().shape == (1,)
    (record,), _, _ = records(tmp_path)
    c = bit_scale(z, clip, sigma_b)
    update_norm = min(clip, step * math.sqrt(40 * 50 + 50))
    expected = math.hypot(update_norm, c / 2)  # the bit's coordinate is +-c/2 either way
    assert record.sensitivity == pytest.approx(expected, rel=1e-4)
    assert record.clip == pytest.approx(augmented_clip(clip, z, sigma_b), rel=1e-12)
    assert record.noise_multiplier == pytest.approx(accounted_noise_multiplier(z, sigma_b), rel=1e-12)
    assert record.noise_std == pytest.approx(z * clip, rel=1e-12)  # the noise itself is the request's z C


@pytest.mark.parametrize("step,sign", [(1.0, -1.0), (1e-5, 1.0)])
def test_the_bit_says_whether_the_update_was_within_the_clip(tmp_path, monkeypatch, step, sign):
    # The noise switched off after the spend, to read the coordinate the device computed.
    def noiseless(self, payload, stream):
        gamma, _ = noise_grid(self.added_std)
        return [(k.astype(np.float64) * gamma).astype(np.float32) for k in payload]

    monkeypatch.setattr(GaussianMechanism, "noise", noiseless)
    z, clip, sigma_b = 5.0, 1.0, 2.0
    reply = individual_filter_mod(
        train_message(adaptive(z=z, clip=clip, sigma_b=sigma_b)), context(tmp_path), Handler(step)
    )
    bit = float(reply.content[ARRAYS_RECORD][CLIP_BIT_KEY].numpy()[0])
    assert bit == pytest.approx(sign * bit_scale(z, clip, sigma_b) / 2, rel=1e-3)


def test_the_owners_minimum_applies_to_the_reports_accounted_multiplier(tmp_path):
    # z = 0.6 alone passes a minimum of 0.5, but with the bit the report's multiplier is
    # (0.6^-2 + 0.4^-2)^-1/2 = 0.333: refused, nothing trained or spent.
    handler = Handler()
    reply = individual_filter_mod(train_message(adaptive(z=0.6, sigma_b=0.2)), context(tmp_path), handler)
    assert refusal_code(reply.error.reason) == "noise-below-minimum"
    assert "0.3328" in reply.error.reason and handler.calls == 0
    assert records(tmp_path)[0] == []


def test_a_fixed_clip_request_has_no_bit(tmp_path):
    spec = RoundSpec("run-a", 1, 1.0, 1.0)
    reply = individual_filter_mod(train_message(spec), context(tmp_path), Handler())
    assert list(reply.content[ARRAYS_RECORD].keys()) == KEYS


def test_a_bad_clipped_count_stddev_is_refused_by_name(tmp_path):
    handler = Handler()
    reply = individual_filter_mod(train_message(adaptive(sigma_b=-1.0)), context(tmp_path), handler)
    assert refusal_code(reply.error.reason) == "bad-request"
    assert "clipped_count_stddev must be a finite number >= 0" in reply.error.reason and handler.calls == 0


def test_a_masked_round_sums_the_bit_with_the_update(tmp_path, monkeypatch):
    n, sigma_b = 6, 1.0
    spec = RoundSpec("run-sa", 1, 1.0, 1.0, placement="distributed", min_reports=4, clipped_count_stddev=sigma_b)
    result = run_round(tmp_path, monkeypatch, n, spec=spec)
    assert result.strategy.aggregated
    for k in result.captured.k.values():
        assert len(k) == len(SECAGG_FLOATING) + 1  # the model's floating-point arrays, then the bit's
        assert k[-1].shape == (1,)
    for i in range(n):
        (record,), _, _ = ledger_records(tmp_path, i)
        assert record.clip == pytest.approx(augmented_clip(1.0, 1.0, sigma_b), rel=1e-12)
        assert record.sensitivity >= bit_scale(1.0, 1.0, sigma_b) / 2 * (1 - 1e-3)  # the bit is charged


@pytest.mark.parametrize("sigma_b", [1e-300, 5e-324])
def test_a_clipped_count_stddev_that_would_overflow_the_norm_bound_is_refused(tmp_path, sigma_b):
    # Even for an owner whose minimum noise admits it: the report's norm bound must stay finite.
    handler = Handler()
    ctx = context(tmp_path, **{"min-noise-multiplier": 1e-300})
    reply = individual_filter_mod(train_message(adaptive(sigma_b=sigma_b)), ctx, handler)
    assert refusal_code(reply.error.reason) in {"bad-request", "noise-below-minimum"}
    assert handler.calls == 0 and records(tmp_path)[0] == []
