"""The per-round release: a hostile coordinator's requests, NaN updates, the noise actually
added (measured), and what an exhausted client sends."""

import math

import numpy as np
import pytest
from scipy import stats

from fedfilter.client.ledger.budget import BudgetLedger
from fedfilter.client.mechanisms.gaussian import NonFiniteUpdateError, certified_norm, clip_to_norm
from fedfilter.client.release import FilteredClient
from fedfilter.client.settings.policy import ClientPolicy
from fedfilter.protocol.request import RoundSpec, RoundSpecError

UPDATE = [np.full((3, 4), 0.5, dtype=np.float32), np.full(5, -0.25, dtype=np.float32)]


@pytest.fixture
def client(tmp_path):
    ledger = BudgetLedger.enrol(tmp_path, client_id="dev", epsilon=1.0, delta=1e-5)
    return FilteredClient(ledger, ClientPolicy(min_noise_multiplier=0.5), noise_seed=7)


@pytest.mark.parametrize(
    "spec,field",
    [
        (RoundSpec("r", 0, 1e-9, 1.0), "noise_multiplier"),  # below the device's minimum
        (RoundSpec("r", 0, float("nan"), 1.0), "noise_multiplier"),
        (RoundSpec("r", 0, float("inf"), 1.0), "noise_multiplier"),
        (RoundSpec("r", 0, 0.0, 1.0), "noise_multiplier"),
        (RoundSpec("r", 0, -2.0, 1.0), "noise_multiplier"),
        (RoundSpec("r", 0, 1.0, float("nan")), "clip"),
        (RoundSpec("r", 0, 1.0, 0.0), "clip"),
        (RoundSpec("r", 0, 1.0, -1.0), "clip"),
        (RoundSpec("r", 0, 1.0, float("inf")), "clip"),
        (RoundSpec("r", -1, 1.0, 1.0), "round_id"),
        (RoundSpec("", 0, 1.0, 1.0), "run_id"),
        (RoundSpec("r", 0, 1.0, 1.0, placement="everywhere"), "placement"),
        (RoundSpec("r", 0, 1.0, 1.0, placement="distributed", min_reports=10), "secure aggregation"),
        (RoundSpec("r", 0, 1.0, 1.0, min_reports=0), "min_reports"),
    ],
)
def test_hostile_requests_are_refused_and_nothing_is_spent(client, spec, field):
    with pytest.raises(RoundSpecError, match=field):
        client.release(spec, UPDATE)
    assert client.ledger.records() == []


def test_every_problem_is_reported_at_once(client):
    with pytest.raises(RoundSpecError) as err:
        client.release(RoundSpec("r", 0, float("nan"), -1.0, placement="x"), UPDATE)
    assert all(f in str(err.value) for f in ("noise_multiplier", "clip", "placement"))


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_non_finite_update_is_refused_and_nothing_is_spent(client, bad):
    upd = [a.copy() for a in UPDATE]
    upd[1][2] = bad
    with pytest.raises(NonFiniteUpdateError, match=r"update\[1\]"):
        client.release(RoundSpec("r", 0, 1.0, 1.0), upd)
    assert client.ledger.records() == []


def test_huge_clip_cannot_buy_more_than_the_budget(client):
    """A huge clip comes with proportionally huge noise: the loss is norm / (z C), never more."""
    for r in range(50):
        client.release(RoundSpec("r", r, 0.5, 1e12), [np.full(10, 1e6)])
    assert client.ledger.state()[0] <= client.ledger.filter.budget[0]
    assert client.ledger.spent_epsilon() <= 1.0


def test_exhaustion_is_reached_exactly_and_then_pure_noise(client):
    statuses = [client.release(RoundSpec("r", t, 0.5, 1.0), UPDATE) for t in range(6)]
    kinds = [s.status for s in statuses]
    assert kinds[0] == "contributed" and kinds[-1] == "noise-only"
    # float32 updates land on the budget to within their own resolution (2**-24 ~ 6e-8 in norm).
    assert client.ledger.spent_epsilon() == pytest.approx(1.0, rel=1e-6)
    assert client.ledger.spent_epsilon() <= 1.0
    last = statuses[-1]
    assert [a.shape for a in last.arrays] == [a.shape for a in UPDATE]
    assert [a.dtype for a in last.arrays] == [a.dtype for a in UPDATE]


def test_leave_mode_sends_a_marker(tmp_path):
    ledger = BudgetLedger.enrol(tmp_path, client_id="dev", epsilon=0.5, delta=1e-5)
    client = FilteredClient(ledger, ClientPolicy(after_exhaustion="leave"))
    out = [client.release(RoundSpec("r", t, 0.5, 1.0), UPDATE) for t in range(5)]
    assert out[-1].status == "left" and out[-1].arrays is None


def _noise_sample(client, spec, n_rounds=1):
    zeros = [np.zeros(20000, dtype=np.float64)]
    return np.concatenate([client.release(spec(t), zeros).arrays[0] for t in range(n_rounds)])


@pytest.mark.parametrize("placement,m", [("local", 1), ("distributed", 16)])
def test_measured_noise_std(tmp_path, placement, m):
    """The noise added is N(0, (zC)^2) locally and N(0, (zC)^2 / m) per share when distributed."""
    ledger = BudgetLedger.enrol(tmp_path, client_id="dev", epsilon=1.0, delta=1e-5, worst_case_epsilon=1000.0)
    client = FilteredClient(ledger, ClientPolicy(allow_distributed=True), noise_seed=11)
    z, c = 2.0, 0.75
    sample = _noise_sample(client, lambda t: RoundSpec("r", t, z, c, placement=placement, min_reports=m), 5)
    expected = z * c / math.sqrt(m)
    # The sample variance of n normals: (n-1) s^2 / sigma^2 ~ chi2(n-1); a 1e-6 two-sided test.
    n = sample.size
    stat = (n - 1) * sample.var(ddof=1) / expected**2
    assert stats.chi2.ppf(5e-7, n - 1) < stat < stats.chi2.ppf(1 - 5e-7, n - 1)
    assert abs(sample.mean()) < 6 * expected / math.sqrt(n)
    assert stats.kstest(sample / expected, "norm").pvalue > 1e-6


def test_explicit_seed_reproduces_and_default_does_not(tmp_path):
    a = BudgetLedger.enrol(tmp_path / "a", client_id="a", epsilon=5.0, delta=1e-5)
    b = BudgetLedger.enrol(tmp_path / "b", client_id="b", epsilon=5.0, delta=1e-5)
    ra = FilteredClient(a, noise_seed=3).release(RoundSpec("r", 0, 1.0, 1.0), UPDATE)
    rb = FilteredClient(b, noise_seed=3).release(RoundSpec("r", 0, 1.0, 1.0), UPDATE)
    assert all(np.array_equal(x, y) for x, y in zip(ra.arrays, rb.arrays))
    c = BudgetLedger.enrol(tmp_path / "c", client_id="c", epsilon=5.0, delta=1e-5)
    d = BudgetLedger.enrol(tmp_path / "d", client_id="d", epsilon=5.0, delta=1e-5)
    rc = FilteredClient(c).release(RoundSpec("r", 0, 1.0, 1.0), UPDATE)
    rd = FilteredClient(d).release(RoundSpec("r", 0, 1.0, 1.0), UPDATE)
    assert not np.array_equal(rc.arrays[0], rd.arrays[0])


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
def test_clipped_norm_is_certified(dtype):
    rng = np.random.default_rng(0)
    arrays = [rng.normal(size=(100, 37)).astype(dtype), rng.normal(size=513).astype(dtype)]
    for target in (1e-3, 0.7, 3.0):
        clipped, norm = clip_to_norm(arrays, target)
        assert norm <= target
        exact = math.sqrt(sum(float(np.sum(np.asarray(a, dtype=np.float64) ** 2)) for a in clipped))
        assert exact <= norm and [c.dtype for c in clipped] == [dtype, dtype]
    assert certified_norm([np.zeros(3)]) == 0.0
    # Squares that would underflow or overflow in float64 still give a certified bound.
    for v in (1e-200, 1e200, 5e-324):
        assert v * math.sqrt(4) <= certified_norm([np.full(4, v)]) <= v * 2 * (1 + 1e-12) + 5e-324
