"""``fedfilter plan``'s plan for the strategy: one JSON document on stdout with the plan under
``"strategy"``, the same fields in the text, bad input named, and ``from_plan`` taking the file whole."""

from __future__ import annotations

import json

import pytest
from flwr.serverapp.strategy import FedAvg

from fedfilter.cli import main
from fedfilter.coordinator.strategy import IndividualFilterStrategy
from fedfilter.planning.strategy_plan import PLAN_FORMAT
from fedfilter.protocol.adaptive_clip import AdaptiveClipping

ARGV = ["plan", "--devices", "100", "--population", "1000", "--params", "19754", "--epsilon", "4,8"]
ARGV += ["--delta", "1e-5", "--rounds", "50", "--dropout-rate", "0.1", "--placement", "distributed"]
FIELDS = ["format", "noise_multiplier", "update_noise_multiplier", "clip", "placement", "min_reports", "filter"]
FIELDS += ["dim", "adaptive_clipping", "participation", "dropout", "budget", "mean_noise_to_clip", "sampling", "notes"]


def _json(capsys, argv):
    assert main([*argv, "--json"]) == 0
    out = capsys.readouterr().out
    assert out.count("\n") == 1  # one document, one line
    return json.loads(out)


def test_the_json_carries_the_plan_under_stable_names(capsys):
    out = _json(capsys, ARGV)
    st = out["strategy"]
    assert list(st) == FIELDS and st["format"] == PLAN_FORMAT
    assert st["participation"]["mode"] == "balanced" and st["participation"]["asks_planned"] == 5
    assert st["min_reports"] == 82 and st["dropout"]["abort_probability"] <= 0.01
    assert st["budget"]["epsilons"] == [4.0, 8.0] and st["budget"]["pays_for_planned_asks"] is True
    # The figures above it are computed at the plan's z and clip, for the asks it plans.
    assert (out["noise_multiplier"], out["clip"], out["min_reports"]) == (st["noise_multiplier"], 0.1, 82)
    assert out["rounds"] == 5 and out["fits_budget"] is True


def test_the_text_carries_the_same_fields(capsys):
    st = _json(capsys, ARGV)["strategy"]
    assert main(ARGV) == 0
    text = capsys.readouterr().out
    for name in ("noise_multiplier", "clip", "adaptive_clipping", "placement", "min_reports", "participation"):
        assert f"\n  {name} " in text
    assert f"noise_multiplier   {st['noise_multiplier']:g} " in text
    assert f"min_reports        {st['min_reports']}: a round aborts" in text
    assert f"probability {st['dropout']['abort_probability']:.4g} (target 0.01)" in text
    assert "the clip moves tenfold in 24 rounds" in text and "each device asked at most 5 times" in text


def test_from_plan_round_trips_the_json_file(capsys, tmp_path):
    plan = _json(capsys, ARGV)
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(plan))
    st = plan["strategy"]
    strategy = IndividualFilterStrategy.from_plan(FedAvg(), path, run_name="r")
    assert (strategy.noise_multiplier, strategy.clip, strategy.placement, strategy.min_reports) == (
        st["noise_multiplier"],
        st["clip"],
        "distributed",
        st["min_reports"],
    )
    assert strategy.adaptive_clipping == AdaptiveClipping(0.5, 0.2, 5.0)
    p = strategy.participation
    assert (p.mode, p.asks_planned, p.population, p.seed) == ("balanced", 5, 1000, 0)
    # Overrides win; the plan's part alone is taken too.
    again = IndividualFilterStrategy.from_plan(FedAvg(), st, clip=0.5, run_name="r")
    assert again.clip == 0.5 and again.noise_multiplier == st["noise_multiplier"]


def test_the_old_command_still_plans_a_given_multiplier(capsys):
    argv = ["plan", "--devices", "10", "--params", "62006", "--noise-multiplier", "1", "--clip", "1"]
    out = _json(capsys, argv + ["--epsilon", "8", "--delta", "1e-5", "--rounds", "50"])
    assert out["noise_multiplier"] == 1.0 and out["rounds"] == 50 and out["strategy"]["noise_multiplier"] == 1.0
    assert out["strategy"]["participation"]["mode"] == "every-round"
    assert out["strategy"]["adaptive_clipping"] is None  # sigma_b = 10 / 20 cannot carry z = 1: said in notes
    assert out["strategy"]["notes"]


def test_bad_input_names_the_field_and_value(capsys):
    assert main([*ARGV, "--dropout-rate", "1.5"]) == 2
    assert "dropout_rate must be a number in [0, 1). Found 1.5." in capsys.readouterr().err
    assert main([*ARGV, "--participation", "uniform", "--plan-quantile", "0"]) == 2
    assert "plan_quantile must be a number in (0, 1). Found 0.0." in capsys.readouterr().err
    with pytest.raises(SystemExit, match="2"):  # argparse's own exit, on a value its type refuses
        main([*ARGV[:-6], "--epsilon", "4,x"])
    assert "--epsilon must be a number or numbers separated by commas. Found '4,x'." in capsys.readouterr().err


def test_a_multiplier_devices_refuse_by_default_is_said(capsys):
    argv = ["plan", "--devices", "100", "--population", "100", "--params", "10", "--epsilon", "50", "--delta", "1e-5"]
    assert main([*argv, "--rounds", "2"]) == 0
    assert "devices refuse an update noise multiplier below their min-noise-multiplier (0.5" in capsys.readouterr().out


def test_a_sampling_plan_gives_each_budget_its_rate_and_order_and_the_strategy_sends_the_asks(capsys, tmp_path):
    from fedfilter.planning.sampled_rounds import enrolment_order, rate_for_budget

    argv = ["plan", "--devices", "100", "--population", "1000", "--params", "1000", "--epsilon", "2,6"]
    argv += ["--delta", "1e-5", "--rounds", "30", "--fixed-clip", "--clip", "0.5", "--noise-multiplier", "2"]
    out = _json(capsys, [*argv, "--sampling"])
    st, sa = out["strategy"], out["strategy"]["sampling"]
    # One mean on both sides: every asked device's noise over the contributions expected (no drop-outs).
    assert out["expected_rate"] == sa["expected_rate"] and out["filter"] == "rdp"
    assert out["noise_to_clip"] == pytest.approx(st["mean_noise_to_clip"], rel=1e-12)
    assert st["filter"] == "rdp" and sa["planned_asks"] == st["participation"]["asks_planned"] == 3
    assert sa["budgets"] == [2.0, 6.0] and st["noise_multiplier"] == sa["noise_multiplier"] == 2.0
    for e, q, order in zip(sa["budgets"], sa["rates"], sa["orders"]):  # the device's own rule, recomputed
        assert q == rate_for_budget(epsilon=e, delta=1e-5, noise_multiplier=2.0, asks=3)
        assert order == enrolment_order(epsilon=e, delta=1e-5, noise_multiplier=2.0, asks=3)
    assert sa["expected_rate"] == pytest.approx(sum(sa["rates"]) / 2)
    strategy = IndividualFilterStrategy.from_plan(FedAvg(), st, run_name="r")
    assert (strategy.planned_asks, strategy.expected_rate) == (3, sa["expected_rate"])
    assert strategy._settings().spec("r", 1).planned_asks == 3
    assert main([*argv, "--sampling"]) == 0
    text = capsys.readouterr().out
    assert f"sampling           planned_asks 3, expected_rate {sa['expected_rate']:.4g}" in text
    # docs/flower-app.md quotes this line of this command.
    assert (
        "expected_rate 0.6906" in text
        and "epsilon 2: rate 0.381, rdp-order 8.2; epsilon 6: rate 1, rdp-order 4.6" in text
    )
    # z 2 is the caller's: above 1.409 the epsilon-6 tier contributes at every ask and ends unspent.
    assert "end with budget unspent; at most 1.409 spends every budget" in text
    # The figures above the plan are the sampled federation's: the noise of the 100 asked devices over
    # the 69.06 contributions expected, each budget's contributions over its 3 asks (rate x asks).
    assert "100 devices asked per round, 69.06 of them contributing on average" in text
    assert "epsilon 2: rate 0.381, 1.14 contributions expected; epsilon 6: rate 1, 3 contributions expected" in text
    assert (
        "Settings that learn (noise norm at most 0.5 x clip, checked by this planner; devices that contribute" in text
    )
    assert not sa["spends_every_budget"] and 1.409 <= sa["spending_limit"] < 1.41
    # The strategy refuses the combination every device would refuse, before the first round.
    with pytest.raises(ValueError, match="adaptive_clipping"):
        IndividualFilterStrategy(
            FedAvg(), noise_multiplier=2.0, clip=0.5, planned_asks=3, adaptive_clipping=AdaptiveClipping()
        )
    with pytest.raises(ValueError, match="expected_rate"):
        IndividualFilterStrategy(FedAvg(), noise_multiplier=2.0, clip=0.5, planned_asks=3, expected_rate=0.0)
    # A plan without sampling says so. --sampling implies a fixed clip, which has no default: without
    # --clip it is refused by name; with it, --fixed-clip is not needed.
    assert _json(capsys, argv)["strategy"]["sampling"] is None
    assert main([*argv[:-5], "--sampling", "--json"]) != 0
    assert "--clip must be given with --sampling: a fixed clip has no default" in capsys.readouterr().err
    assert main([*argv[:-5], "--sampling", "--fixed-clip", "--json"]) != 0
    assert "--clip must be given with --fixed-clip" in capsys.readouterr().err
    without_flag = [a for a in argv if a != "--fixed-clip"]
    assert _json(capsys, [*without_flag, "--sampling"])["strategy"] == st


def test_a_distributed_sampling_plan_says_its_worst_case_counts_devices_that_contribute_at_every_ask(capsys):
    argv = ["plan", "--devices", "100", "--population", "1000", "--params", "1000", "--epsilon", "2,6"]
    argv += ["--delta", "1e-5", "--rounds", "30", "--clip", "0.5", "--noise-multiplier", "2", "--placement"]
    assert main([*argv, "distributed", "--sampling"]) == 0
    text = capsys.readouterr().out
    assert "worst-case-epsilon" in text and "placement distributed" in text
    assert "(counted for devices that contribute at every ask; at their rates they pay at most this" in text
    assert main([*argv, "distributed"]) == 0  # without sampling the worst case needs no such note
    assert "counted for devices that contribute at every ask" not in capsys.readouterr().out
    # The claim, with the device's own functions: the worst-case account the owner enrols at the
    # table's worst-case-epsilon (its filter at the order that budget picks) admits every planned ask
    # at each budget's rate, each report read alone. At the main filter's order it would not.
    from fedfilter.client.ledger.worst_case import worst_case_filter
    from fedfilter.planning.rounds import _run_charges, distributed_mu
    from fedfilter.privacy.filters import make_filter
    from fedfilter.privacy.skellam import l1_cap, skellam_charge
    from fedfilter.privacy.subsampled import sampled_skellam_charge, sampling_order
    from fedfilter.protocol.secagg.grid import grid_step

    out = _json(capsys, [*argv, "distributed", "--sampling"])
    sa, w = out["strategy"]["sampling"], out["worst_case"]["worst_case_epsilon_needed"]
    mu_share = distributed_mu(out["noise_multiplier"], out["clip"], out["min_reports"], alone=True)
    l2 = out["clip"] / grid_step(out["clip"])
    l1 = float(l1_cap(l2, out["dim"]))
    for rate, order in zip(sa["rates"], sa["orders"]):
        filt = worst_case_filter(make_filter("rdp", min(out["strategy"]["budget"]["epsilons"]), 1e-5), w)
        if sampling_order(filt) is None:  # an order below 2: the device charges the full release
            charge = float(skellam_charge(filt, l1, l2, mu_share)[0])
        else:
            charge = float(sampled_skellam_charge(filt, rate=rate, l1=l1, l2=l2, mu_total=mu_share)[0])
        assert _run_charges(filt, charge, sa["planned_asks"])[1] >= sa["planned_asks"]
        at_main_order = make_filter("rdp", w, 1e-5, [order])
        charge = float(sampled_skellam_charge(at_main_order, rate=rate, l1=l1, l2=l2, mu_total=mu_share)[0])
        assert _run_charges(at_main_order, charge, sa["planned_asks"])[1] < sa["planned_asks"]
