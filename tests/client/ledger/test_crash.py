"""The design's invariant 2: a spend is durable before the report leaves; kill -9 at random moments."""

from harness.crash import run_cycles


def test_fifty_kills_never_lose_a_spend(tmp_path):
    history = run_cycles(tmp_path, cycles=50, max_delay=0.12, seed=2026)
    released = [h[0] for h in history]
    assert released[-1] > 50  # the spender really released rounds between kills
    assert all(b >= a for a, b in zip(released, released[1:]))
