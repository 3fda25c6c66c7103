"""Exhaustion of either account (``client/mechanisms/spend.py``, ``nothing_left``): a distributed device
whose worst-case account is spent while its main account has budget left does what its owner chose for
exhaustion: ``leave`` leaves, ``noise-only`` records noise-only, and the owner's ledger reads so.

The devices keep the owner's default threshold (``ClientPolicy.exhausted_below``) and release diffuse
updates of 2000 coordinates. Before the one rule had its floor (``SkellamMechanism.floor``, sqrt(dim)
grid steps), the worst-case account bound a few grid steps above the threshold: the update, clipped to
those few steps, snapped to zero, was charged 0, so no account moved; the device recorded "contributed"
rounds of sensitivity 0 for ever and a ``leave`` device never left.
"""

from __future__ import annotations

import json

import numpy as np
from helpers.skellam_release import release_skellam

from fedfilter.cli import main
from fedfilter.client.ledger.budget import BudgetLedger
from fedfilter.client.ledger.report import device_report
from fedfilter.client.mechanisms.skellam import skellam_grid
from fedfilter.client.settings.policy import ClientPolicy
from fedfilter.protocol.request import RoundSpec
from fedfilter.protocol.secagg.grid import secaggplus_settings

N_SAMPLED, M, ROUNDS, RUN = 10, 10, 40, "run-x"
Q = secaggplus_settings(N_SAMPLED)["quantization_range"]


def policy(after_exhaustion: str) -> ClientPolicy:
    return ClientPolicy(allow_distributed=True, after_exhaustion=after_exhaustion)


def run_device(tmp_path, name: str, after_exhaustion: str, *, worst: float):
    """ROUNDS distributed rounds (m = 10) on a real ledger at epsilon 8: the statuses and the replies."""
    ledger = BudgetLedger.enrol(
        tmp_path / name, client_id=name, epsilon=8.0, delta=1e-5, filter_kind="rdp", worst_case_epsilon=worst
    )
    statuses, replies, rng = [], [], np.random.default_rng(3)
    for r in range(ROUNDS):
        spec = RoundSpec(RUN, r, 1.0, 1.0, placement="distributed", min_reports=M)
        grid = skellam_grid(spec, target_range=Q, sample_num=N_SAMPLED)
        update = [(rng.normal(size=2000) * 0.05).astype(np.float32), np.zeros(3, dtype=np.int64)]
        rel = release_skellam(ledger, policy(after_exhaustion), spec, update, grid, noise_seed=5)
        statuses.append(rel.status)
        replies.append(rel.arrays)
    return ledger, statuses, replies


def spent_after(statuses: list[str]) -> int:
    first = next(i for i, s in enumerate(statuses) if s != "contributed")
    assert set(statuses[first:]) == {statuses[first]}  # once spent, stays spent
    return first


def test_a_leave_device_whose_worst_case_account_binds_first_leaves_and_its_ledger_says_so(tmp_path, capsys):
    ledger, statuses, replies = run_device(tmp_path, "leaver", "leave", worst=8.0)  # the share binds first
    try:
        assert statuses[0] == "contributed" and statuses[-1] == "left"
        first = spent_after(statuses)
        assert all(r is None for r in replies[first:])  # a device that left sends no report
        # The main account is far from spent: it was the worst-case account that bound.
        assert ledger.filter.remaining_fraction(ledger.state()) > 0.5
        records = ledger.records()
        assert all(rec.sensitivity > 0 for rec in records[:first])  # every contribution carried data
        assert all(float(rec.charge[0]) == 0.0 == float(rec.worst_charge[0]) for rec in records[first:])
        summary = ledger.summary()
    finally:
        ledger.close()
    (run,) = summary["runs"]
    assert (run["contributed"], run["noise_only"], run["left"]) == (first, 0, ROUNDS - first)
    # The owner's report reads the round it ran out, and the rounds it contributed to.
    report = device_report(tmp_path / "leaver", RUN)
    assert report["exhausted_round"] == first and report["contributed_rounds"] == list(range(first))
    assert main(["ledger", "show", "--dir", str(tmp_path / "leaver"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["runs"][0]["left"] == ROUNDS - first
    assert main(["ledger", "show", "--dir", str(tmp_path / "leaver")]) == 0
    row = next(line for line in capsys.readouterr().out.splitlines() if line.strip().startswith(RUN))
    assert row.split()[1:5] == [str(ROUNDS), str(first), "0", str(ROUNDS - first)]


def test_a_noise_only_device_records_noise_only_and_its_reply_does_not_tell_which_account_bound(tmp_path):
    worst_bound, statuses, replies = run_device(tmp_path, "quiet", "noise-only", worst=8.0)
    try:
        first = spent_after(statuses)
        assert statuses[first] == "noise-only" and first < ROUNDS - 5
        assert worst_bound.filter.remaining_fraction(worst_bound.state()) > 0.5
        assert worst_bound.summary()["runs"][0]["noise_only"] == ROUNDS - first
    finally:
        worst_bound.close()
    # A device whose MAIN account binds (its worst-case budget is far away): its noise-only replies,
    # and the first device's contributing ones, have the same form as these.
    main_bound, main_statuses, main_replies = run_device(tmp_path, "main", "noise-only", worst=8000.0)
    main_bound.close()
    assert main_statuses[-1] == "noise-only"
    for other in (replies[0], main_replies[-1]):
        for a, b in zip(replies[-1], other, strict=True):
            assert (a.shape, a.dtype, a.nbytes) == (b.shape, b.dtype, b.nbytes)
