"""Float-safe noise (client/mechanisms/gaussian_noise.py, client/mechanisms/gaussian.py): exact sampling, no bits
to read."""

from __future__ import annotations

import math

import mpmath
import numpy as np
import pytest
from scipy import stats
from scipy.special import ndtri

from fedfilter.client.mechanisms import gaussian_noise as noise
from fedfilter.client.mechanisms.gaussian import add_grid_noise, noise_grid, snap_toward_zero
from fedfilter.client.mechanisms.gaussian_noise import NoiseStream, rounded_gaussian
from fedfilter.protocol.wire import REPLY_DTYPE


def test_ndtri_error_is_far_inside_the_fast_paths_widening():
    """The fast path assumes ndtri's relative error is below 2**-40; check 2**-44 against mpmath."""
    rng = np.random.default_rng(1)
    p = np.concatenate([2.0 ** -rng.uniform(1, 64, 3000), rng.uniform(1e-3, 0.5, 1000), [0.5, 2.0**-64]])
    worst = 0.0
    with mpmath.workdps(40):
        for x in p:
            exact = -mpmath.sqrt(2) * mpmath.erfinv(1 - 2 * mpmath.mpf(float(x))) if x < 0.4 else None
            if exact is None:  # near 1/2: erfinv of a small argument is accurate and direct
                exact = mpmath.sqrt(2) * mpmath.erfinv(2 * mpmath.mpf(float(x)) - 1)
            got = float(ndtri(x))
            if exact != 0:
                worst = max(worst, float(abs((got - exact) / exact)))
            else:
                assert got == 0.0
    assert worst < 2.0**-44, worst


def _rounded_gaussian_pmf(sigma, support):
    with mpmath.workdps(30):
        return np.array([float(mpmath.ncdf((j + 0.5) / sigma) - mpmath.ncdf((j - 0.5) / sigma)) for j in support])


@pytest.mark.parametrize("sigma", [1.0, 2.7, 40.0])
def test_samples_follow_the_exact_rounded_gaussian(sigma):
    n = 200_000
    sample = rounded_gaussian(sigma, n, NoiseStream.from_seed("pmf", sigma))
    assert sample.dtype == np.int64
    edge = int(math.ceil(4 * sigma))
    support = np.arange(-edge, edge + 1)
    expected = _rounded_gaussian_pmf(sigma, support) * n
    observed = np.array([(sample == j).sum() for j in support])
    tails = n - observed.sum(), n - expected.sum()
    stat = stats.chisquare(np.append(observed, tails[0]), np.append(expected, tails[1]))
    assert stat.pvalue > 1e-6, stat


def test_large_sigma_has_the_requested_std_and_no_bias():
    sigma = 2.0**16 * 1.37
    sample = rounded_gaussian(sigma, 400_000, NoiseStream.from_seed("std"))
    # Rounding adds variance 1/12 (Sheppard): invisible at this sigma, but exact in the formula.
    expected_var = sigma**2 + 1 / 12
    n = sample.size
    stat = (n - 1) * sample.astype(np.float64).var(ddof=1) / expected_var
    assert stats.chi2.ppf(5e-7, n - 1) < stat < stats.chi2.ppf(1 - 5e-7, n - 1)
    assert abs(sample.mean()) < 6 * sigma / math.sqrt(n)


def _fast(sigma, w):
    """The fast path's answer for the interval (w, w + 1) * 2**-64, or None if it cannot decide."""
    stream = _FixedStream([w])  # lower half: u = w
    m = rounded_gaussian(sigma, 1, stream)
    return None if stream.fell_back else int(-m[0])


class _FixedStream:
    """A stream that returns given words first, then a seeded tail (marks use of the exact path)."""

    def __init__(self, words):
        self.words, self.tail, self.fell_back = list(words), NoiseStream.from_seed("tail"), False

    def uint64(self, n):
        if self.words:
            out, self.words = np.array(self.words[:n], dtype=np.uint64), self.words[n:]
            return out
        self.fell_back = True
        return self.tail.uint64(n)


@pytest.mark.parametrize("sigma", [1.0, 3.3, 70_000.5])
def test_exact_path_decides_intervals_that_straddle_a_cell_boundary(sigma):
    """Put the first 64 bits right on a cell boundary: the fast path must defer, and the exact path
    must return the cell that the full-precision U (its 64 bits and the ones it drew) lies in."""
    for m in (0, 1, 5):
        with mpmath.workprec(300):
            boundary = mpmath.ncdf(-(m + mpmath.mpf(0.5)) / sigma)
            w = int(mpmath.floor(boundary * mpmath.mpf(2) ** 64))
        stream = _FixedStream([w])
        got = -int(rounded_gaussian(sigma, 1, stream)[0])
        assert stream.fell_back
        # Re-derive U from the words the sampler read and decide its cell independently.
        replay = NoiseStream.from_seed("tail")
        for extra in range(1, 8):
            numer = w
            words = replay.uint64(extra)
            replay = NoiseStream.from_seed("tail")
            for word in words:
                numer = (numer << 64) | int(word)
            bits = 64 * (extra + 1)
            with mpmath.workprec(bits + 100):
                lo, hi = mpmath.ldexp(numer, -bits), mpmath.ldexp(numer + 1, -bits)
                cells = {int(mpmath.floor(sigma * -mpmath.sqrt(2) * mpmath.erfinv(2 * p - 1) + 0.5)) for p in (lo, hi)}
            if len(cells) == 1:
                assert got == cells.pop()
                break
        else:
            pytest.fail("the replayed bits never decided the cell")


def test_fast_path_agrees_with_the_exact_path():
    rng = np.random.default_rng(5)
    for sigma in (1.0, 6.5, 2.0**16 * 1.9):
        for w in rng.integers(1, 2**63, size=40, dtype=np.uint64):
            fast = _fast(sigma, int(w))
            if fast is None:
                continue
            assert noise._exact_magnitude(sigma, int(w), NoiseStream.from_seed("x")) == fast


def test_grid_is_a_power_of_two_and_sigma_in_range():
    for std in (1e-6, 0.2, 1.0, 3.0, 85.0, 1e9):
        gamma, sigma_g = noise_grid(std)
        assert math.frexp(gamma)[0] == 0.5  # a power of two
        assert 2.0**16 <= sigma_g < 2.0**17 and sigma_g * gamma == std
    for bad in (0.0, -1.0, math.inf, math.nan, 2.0**101):
        with pytest.raises(ValueError, match="noise std"):
            noise_grid(bad)


def test_snapping_never_grows_a_coordinate():
    rng = np.random.default_rng(2)
    for dtype in (np.float16, np.float32, np.float64):
        a = rng.normal(size=1000).astype(dtype)
        gamma = 2.0**-9
        (k,) = snap_toward_zero([a], gamma)
        assert k.dtype == np.int64
        assert np.all(np.abs(k * gamma) <= np.abs(a.astype(np.float64)))
        assert np.all(np.abs(a.astype(np.float64) - k * gamma) < gamma)


# --- the low-order-bit distinguisher -----------------------------------------------------------------------
Z, C, DIM, REPLIES = 50.0, 1.0, 50, 10_000


def _bit_statistics(reply: np.ndarray, gamma: float) -> np.ndarray:
    """Generic bit statistics of one reply: grid membership, lowest mantissa bits, trailing zeros,
    and exact representability of reply / std in float32 and float16."""
    r = np.asarray(reply)
    as_float = r.astype(np.float64)
    scaled = as_float / gamma
    bits = r.astype(np.float32).view(np.uint32) & np.uint32(0x7FFFFF)
    trailing = np.array([(int(b) & -int(b)).bit_length() - 1 if b else 23 for b in bits])
    q = as_float / (Z * C)
    return np.array(
        [
            np.mean(scaled == np.round(scaled)),
            np.mean(bits & 1),
            np.mean((bits >> 1) & 1),
            np.mean(trailing),
            np.mean(q.astype(np.float32).astype(np.float64) == q),
            np.mean(q.astype(np.float16).astype(np.float64) == q),
        ]
    )


def _best_advantage(stats_a: np.ndarray, stats_b: np.ndarray) -> float:
    """Choose each statistic's best one-threshold test on the first halves, score it on the second."""
    half = len(stats_a) // 2
    best = 0.0
    for j in range(stats_a.shape[1]):
        fit_a, fit_b = stats_a[:half, j], stats_b[:half, j]
        cuts = np.unique(np.concatenate([fit_a, fit_b]))
        if cuts.size > 200:
            cuts = np.quantile(cuts, np.linspace(0, 1, 200))
        scores = [abs(np.mean(fit_a > t) - np.mean(fit_b > t)) for t in cuts]
        t = cuts[int(np.argmax(scores))]
        best = max(best, abs(np.mean(stats_a[half:, j] > t) - np.mean(stats_b[half:, j] > t)))
    return best


def _replies(update: np.ndarray | None, seed: str, *, snap: bool = True) -> np.ndarray:
    std = Z * C
    gamma, _ = noise_grid(std)
    out = []
    for i in range(REPLIES):
        base = np.zeros(DIM) if update is None else update
        k = snap_toward_zero([base], gamma) if snap else [base]
        (noisy,) = add_grid_noise(k, std, NoiseStream.from_seed(seed, i)) if snap else _unsnapped(k, std, seed, i)
        out.append(_bit_statistics(noisy, gamma))
    return np.array(out)


def _unsnapped(arrays, std, seed, i):
    """The mutant the test must catch: grid noise added to an update that was never snapped."""
    gamma, sigma_g = noise_grid(std)
    (a,) = arrays
    n = rounded_gaussian(sigma_g, a.size, NoiseStream.from_seed(seed, i))
    return [(a.astype(np.float64) + n * gamma).astype(REPLY_DTYPE)]


@pytest.mark.parametrize("model_dtype", [np.float16, np.float32, np.float64])
def test_low_order_bits_do_not_tell_data_from_no_data(model_dtype):
    rng = np.random.default_rng(3)
    u = rng.normal(size=DIM)
    u = (u / np.linalg.norm(u) * C * 0.999).astype(model_dtype)  # a clipped update of norm ~C
    with_data, without = _replies(u, "data"), _replies(None, "none")
    allowed = 2 * stats.norm.cdf(C / (Z * C) / 2) - 1  # TV of one mu-GDP reply, mu = C / (z C)
    slack = 1.96 * math.sqrt(2 * 0.25 / (REPLIES // 2))  # 95 % two-proportion half-width
    adv = _best_advantage(with_data, without)
    assert adv <= allowed + slack, (adv, allowed, slack)


def test_the_distinguisher_catches_an_unsnapped_update():
    u = (np.random.default_rng(4).normal(size=DIM) * 0.1).astype(np.float32)
    global REPLIES
    saved, REPLIES = REPLIES, 400
    try:
        adv = _best_advantage(_replies(u, "m", snap=False), _replies(None, "n"))
    finally:
        REPLIES = saved
    assert adv > 0.9


# --- through the real mod: the device, not the coordinator, decides the reply's dtype -----------
@pytest.mark.parametrize("model_dtype", [np.float16, np.float32, np.float64])
def test_mod_replies_float32_on_the_grid_for_any_model_dtype(tmp_path, model_dtype):
    from flwr.app import Array, ArrayRecord, Context, Message, RecordDict
    from helpers.mods import KEYS, SHAPES, spec, train_message

    def handler(msg, ctx):
        record = next(iter(msg.content.array_records.values()))
        new = {k: Array((record[k].numpy() + 0.01).astype(model_dtype)) for k in record.keys()}
        return Message(RecordDict({"arrays": ArrayRecord(new)}), reply_to=msg)

    from fedfilter.client.filter_mod import individual_filter_mod
    from fedfilter.client.settings.node_config import enrol_device

    # A budget that the first round(s) at z = 1, clip 1 exhaust: later rounds are noise-only.
    ctx = Context(
        run_id=7,
        node_id=42,
        state=RecordDict(),
        run_config={},
        node_config={
            "ledger-dir": str(tmp_path / "ledger"),
            "client-id": "a",
            "budget-epsilon": 0.5,
            "budget-delta": 1e-5,
            "reply-hold-s": 0,
        },
    )
    enrol_device(ctx.node_config)  # the owner's act, up front: the mod never enrols
    model = [np.full(s, 0.5, dtype=model_dtype) for s in SHAPES]
    replies = [
        individual_filter_mod(train_message(spec(r), arrays=model, message_id=f"m{r}"), ctx, handler)
        for r in (1, 2, 3, 4)
    ]
    gamma = noise_grid(1.0)[0]
    sizes = []
    for reply in replies:
        assert not reply.has_error(), reply.error
        record = reply.content.array_records["arrays"]
        assert [record[k].dtype for k in KEYS] == ["float32", "float32"]
        for k in KEYS:
            scaled = record[k].numpy().astype(np.float64) / gamma
            assert np.array_equal(scaled, np.round(scaled))
        sizes.append(sum(len(record[k].data) for k in KEYS))
    assert len(set(sizes)) == 1
    from fedfilter.client.ledger.budget import BudgetLedger

    ledger = BudgetLedger.open(tmp_path / "ledger")
    try:
        statuses = [r.status for r in ledger.records()]
        assert statuses[0] == "contributed" and statuses[-1] == "noise-only", statuses
    finally:
        ledger.close()
