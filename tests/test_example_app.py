"""The example a Flower user copies: Flower's quickstart-pytorch plus fedfilter (``examples/``).

Fast checks: the fedfilter variant differs from the offline Flower template by a few lines, and
``FEDFILTER.diff`` and the README show exactly the live diff; its noise multiplier and clip are the
planner's (``fedfilter plan``) for 3 devices and its model. Slow checks (``flwr run``, the entry
Flower users use, against a SuperLink in simulation mode on 127.0.0.1): the plain template runs
offline, and the fedfilter variant runs 2 rounds on 3 simulated devices whose personal budgets
live only in a device-settings file on the machine running the simulation
(``FEDFILTER_DEVICE_SETTINGS``), never in the coordinator's run config, and its server-side
accuracy rises well above chance; a federation whose devices all refuse fails the run with the
refusals counted.
"""

from __future__ import annotations

import importlib.util
import json
import math
import re
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
BASE_APP = EXAMPLES / "flower-quickstart-pytorch"
FEDFILTER_APP = EXAMPLES / "quickstart-pytorch"
APPS = (BASE_APP, FEDFILTER_APP)
MAX_CHANGED_LINES = 12
SECTION = "Use it in your Flower app"
NUM_DEVICES, NUM_ROUNDS = 3, 2
# The learning run: the template's 3 rounds, 3 local epochs, learning rate 0.05 (its run-config keys).
# benchmarks/example_learns.py (an offline replica, docs/results.md) reached 0.71-0.84 held-out
# accuracy after 3 rounds over 12 seeds at the example's settings; at lr 0.1, 0.28-0.69.
LEARN_ROUNDS, LOCAL_EPOCHS, LEARNING_RATE = 3, 3, 0.05
RUN_TIMEOUT_S = 150.0
CHANCE = 0.1  # ten digits


def _app_diff_module():
    spec = importlib.util.spec_from_file_location("examples_app_diff", EXAMPLES / "app_diff.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _fenced_diff(readme: Path) -> str:
    """The first ```diff block of the README's "Use it in your Flower app" section."""
    text = readme.read_text(encoding="utf-8")
    start = re.search(rf"^#+ {re.escape(SECTION)}\s*$", text, flags=re.MULTILINE)
    if start is None:
        raise AssertionError(f"{readme} has no section {SECTION!r}.")
    rest = text[start.end() :]
    following = re.search(r"^#+ ", rest, flags=re.MULTILINE)
    section = rest[: following.start()] if following else rest
    block = re.search(r"^```diff\n(.*?)^```$", section, flags=re.MULTILINE | re.DOTALL)
    if block is None:
        raise AssertionError(f"{readme}: section {SECTION!r} has no ```diff block.")
    return block.group(1)


# --- the diff ------------------------------------------------------------------------------------
def test_fedfilter_adds_at_most_twelve_lines_to_flowers_app():
    diff_tools = _app_diff_module()
    diff = diff_tools.app_diff(BASE_APP, FEDFILTER_APP)
    changed = diff_tools.changed_lines(diff)
    assert 0 < changed <= MAX_CHANGED_LINES, f"{changed} changed lines:\n{diff}"
    # The diff is fedfilter's two entry points and nothing else of substance.
    assert "+app = ClientApp(mods=[individual_filter_mod])" in diff
    assert "IndividualFilterStrategy(" in diff
    # Both apps are complete Flower apps with the same components and the same run config keys.
    base, variant = (
        tomllib.loads((app / "pyproject.toml").read_text())["tool"]["flwr"] for app in (BASE_APP, FEDFILTER_APP)
    )
    assert base["app"]["components"] == variant["app"]["components"]
    assert base["app"]["config"] == variant["app"]["config"]


def test_changed_lines_counts_both_sides_of_a_replaced_line(tmp_path):
    diff_tools = _app_diff_module()
    for name, line in (("a", "app = ClientApp()\n"), ("b", "app = ClientApp(mods=[m])\n")):
        (tmp_path / name / "pytorchexample").mkdir(parents=True)
        (tmp_path / name / "pyproject.toml").write_text("[project]\n")
        (tmp_path / name / "pytorchexample" / "client_app.py").write_text("x = 1\n" + line)
    diff = diff_tools.app_diff(tmp_path / "a", tmp_path / "b")
    assert diff_tools.changed_lines(diff) == 2
    assert diff_tools.changed_lines(diff_tools.app_diff(tmp_path / "a", tmp_path / "a")) == 0


def test_diff_file_is_the_live_diff():
    diff_tools = _app_diff_module()
    stored = (FEDFILTER_APP / "FEDFILTER.diff").read_text(encoding="utf-8")
    assert stored == diff_tools.app_diff(BASE_APP, FEDFILTER_APP), (
        "examples/quickstart-pytorch/FEDFILTER.diff is stale: run `python examples/app_diff.py --write` "
        "and paste it into the READMEs' 'Use it in your Flower app' sections."
    )


def test_example_readme_shows_the_live_diff():
    live = _app_diff_module().app_diff(BASE_APP, FEDFILTER_APP)
    assert _fenced_diff(FEDFILTER_APP / "README.md") == live


def test_project_readme_shows_the_live_diff_once_it_has_the_section():
    readme = ROOT / "README.md"
    if not re.search(rf"^#+ {re.escape(SECTION)}\s*$", readme.read_text(encoding="utf-8"), flags=re.MULTILINE):
        pytest.skip(f"README.md has no {SECTION!r} section yet")
    assert _fenced_diff(readme) == _app_diff_module().app_diff(BASE_APP, FEDFILTER_APP)


def test_offline_task_splits_the_digits_without_overlap():
    from sklearn.datasets import load_digits

    spec = importlib.util.spec_from_file_location("base_task", BASE_APP / "pytorchexample" / "task.py")
    task = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(task)
    seen: list[tuple] = []
    for pid in range(NUM_DEVICES):
        train, test = task.load_data(pid, NUM_DEVICES, batch_size=8)
        seen += [tuple(ex["img"].flatten().tolist()) + (ex["label"],) for ex in train.dataset + test.dataset]
    central = task.load_centralized_dataset().dataset
    seen += [tuple(ex["img"].flatten().tolist()) + (ex["label"],) for ex in central]
    # Every digit exactly once: the partitions and the central test set are disjoint and cover the
    # data set (which has no two identical image+label pairs).
    assert len(seen) == len(load_digits().target)
    assert len(set(seen)) == len(seen)
    batch = next(iter(task.load_centralized_dataset()))
    assert task.Net()(batch["img"]).shape == (len(batch["label"]), 10)


# --- flwr run against a SuperLink in simulation mode ---------------------------------------------
def _flwr_run(app: Path, root: Path, run_config: dict, device_settings: Path | None = None) -> Path:
    """``flwr run APP CONNECTION --stream`` as a Flower user types it, against a
    ``flower-superlink --insecure --simulation`` on 127.0.0.1 (``fedfilter.deploy.simulation_link``) whose
    environment names ``device_settings``; everything started is stopped before this returns. The
    SuperLink, and so the ServerApp's relative paths, work in the returned directory."""
    from fedfilter.deploy.simulation_link import SimulationLink

    with SimulationLink(root, num_supernodes=NUM_DEVICES, num_cpus=1, device_settings=device_settings) as link:
        result = link.run_app(app, run_config=run_config, timeout=RUN_TIMEOUT_S)
        workdir = link.home
    # `flwr run` exits 0 even when the ServerApp raised: the status is the SuperLink's.
    assert result.ok, f"{result.status}: {result.details}\n{result.output[-3000:]}"
    return workdir


@pytest.mark.slow
def test_offline_flower_template_runs_under_flwr_run(tmp_path):
    workdir = _flwr_run(BASE_APP, tmp_path, {"num-server-rounds": NUM_ROUNDS, "save-model": True})
    # The ServerApp's relative paths land in the SuperLink's working directory (the public
    # ledger of the fedfilter variant too).
    assert (workdir / "final_model.pt").is_file()


def _example_request() -> tuple[float, float]:
    """The noise multiplier and clip the example's ServerApp sends (its IndividualFilterStrategy call)."""
    text = (FEDFILTER_APP / "pytorchexample" / "server_app.py").read_text()
    z = re.search(r"noise_multiplier=([0-9.e-]+)", text)
    clip = re.search(r"clip=([0-9.e-]+)", text)
    assert z and clip, "the example's IndividualFilterStrategy names noise_multiplier= and clip="
    return float(z.group(1)), float(clip.group(1))


def _plan() -> dict:
    """``fedfilter plan`` for the example's federation: 3 devices, its model, 2 rounds."""
    from fedfilter.cli.plan import app_model_parameters
    from fedfilter.planning.federation import plan_federation

    _, clip = _example_request()
    dim = app_model_parameters(FEDFILTER_APP, None)
    return plan_federation(
        devices=NUM_DEVICES, dim=dim, noise_multiplier=1.0, clip=clip, epsilon=8.0, delta=1e-5, rounds=LEARN_ROUNDS
    )


def test_the_examples_settings_are_the_planners_for_its_federation():
    z, clip = _example_request()
    plan = _plan()["at_these_devices"]  # the settings that learn with 3 devices per round
    assert (z, clip) == (plan["noise_multiplier"], plan["clip"])
    assert plan["noise_dominates"] is False


def _enrol_devices(root: Path, budgets: dict[int, float], min_z: float) -> tuple[Path, dict[int, dict]]:
    """Each device's settings, as its owner sets them, and the owner's enrolment (done up front)."""
    from fedfilter.client.settings.node_config import enrol_device

    settings = {
        pid: {
            "ledger-dir": str(root / "devices" / str(pid)),
            "client-id": f"device-{pid}",
            "budget-epsilon": epsilon,
            "budget-delta": 1e-5,
            "min-noise-multiplier": min_z,  # the owner accepts the planner's small multiplier
            "reply-hold-s": 0,  # timing protection off: one simulation process serves every device
        }
        for pid, epsilon in budgets.items()
    }
    for entry in settings.values():
        enrol_device(entry)
    path = root / "device-settings.json"
    path.write_text(json.dumps({str(pid): entry for pid, entry in settings.items()}))
    return path, settings


@pytest.mark.slow
def test_fedfilter_example_learns_under_flwr_run_with_personal_budgets(tmp_path):
    from fedfilter.client.ledger.budget import BudgetLedger
    from fedfilter.coordinator.public_ledger import PublicLedger

    z, clip = _example_request()
    plan = _plan()["at_these_devices"]
    # Personal budgets, on the device side only: a small one (a part of a full-clip round, then pure
    # noise) and two that pay for the planned rounds (the planner's epsilon for them, rounded up). At
    # this multiplier a full-clip round costs mu = 1 / z = 164: the federation learns only because its
    # owners accept budgets no one would call private (the planner says so; see `fedfilter plan`).
    # The small budget (epsilon 10, mu 2.0) admits a norm of 1.2% of the clip in all.
    enough = math.ceil(plan["epsilon_needed"])
    budgets = {0: 10.0, 1: float(enough), 2: float(enough)}
    settings_file, settings = _enrol_devices(tmp_path / "machine", budgets, z)
    # FEDFILTER_DEVICE_SETTINGS is set for the SuperLink on the machine running the simulation (its
    # Ray workers inherit it); the coordinator's run config cannot name it.
    run_config = {"num-server-rounds": LEARN_ROUNDS, "local-epochs": LOCAL_EPOCHS, "learning-rate": LEARNING_RATE}
    link_dir = _flwr_run(FEDFILTER_APP, tmp_path / "link", run_config, settings_file)

    # The coordinator's public ledger: 3 rounds, every sampled device reported (a device whose
    # budget is spent answers with pure noise, indistinguishable from a report).
    public = PublicLedger(link_dir / "public_ledger.db")
    try:
        runs = public.runs()
        assert len(runs) == 1 and runs[0].finished_at_unix > 0
        run_id = runs[0].run_id
        records = public.records(run_id)
        public_config = json.loads(runs[0].config_json)
    finally:
        public.close()
    assert [r.round_id for r in records] == list(range(1, LEARN_ROUNDS + 1))
    for record in records:
        assert (record.clients_sampled, record.reports_received) == (NUM_DEVICES, NUM_DEVICES)
        assert (record.markers_received, record.replies_dropped, record.released) == (0, 0, True)
        # The expected noise norm the wrapper records is the planner's figure for these settings.
        assert record.expected_noise_norm == pytest.approx(plan["mean_noise_norm"], rel=1e-9)
    # The server-side accuracy on held-out digits rises well above chance.
    accuracy = records[-1].metrics["accuracy"]
    assert accuracy >= 4 * CHANCE, [dict(r.metrics) for r in records]
    print("server-side accuracy per round:", [round(r.metrics["accuracy"], 3) for r in records])

    # The coordinator's run config holds no budget and nothing of the devices' settings.
    app_config = tomllib.loads((FEDFILTER_APP / "pyproject.toml").read_text())["tool"]["flwr"]["app"]["config"]
    for key in [*app_config, *public_config]:
        assert not re.search(r"budget|epsilon|delta|ledger-dir|client-id", key), key
    stored = (link_dir / "public_ledger.db").read_bytes()
    for entry in settings.values():
        assert entry["client-id"].encode() not in stored and entry["ledger-dir"].encode() not in stored

    # Each device's own ledger: this run's rounds, spends within its personal budget.
    for pid, entry in settings.items():
        ledger = BudgetLedger.open(entry["ledger-dir"])
        try:
            spends = ledger.records(run_id)
            state, budget = ledger.state(), ledger.filter.budget
            assert [s.round_id for s in spends] == list(range(1, LEARN_ROUNDS + 1)), pid
            assert all(s.noise_multiplier == z and s.clip == clip for s in spends)
            assert (state <= budget).all(), (pid, state, budget)
            assert (ledger.recomputed_state() == state).all()
            statuses = [s.status for s in spends]
            remaining = float(ledger.filter.remaining_fraction(state))
        finally:
            ledger.close()
        if budgets[pid] == min(budgets.values()):
            # Individual accounting: a round costs the update's actual (clipped) norm, so which round
            # spends the budget depends on the data this device drew (a round whose update is smaller
            # than the allowance leaves some for the next). Whichever it is, the last charge lands on
            # the budget (up to the ledger's conservative rounding) and every later round is pure noise.
            contributed = statuses.count("contributed")
            want = ["contributed"] * contributed + ["noise-only"] * (LEARN_ROUNDS - contributed)
            assert 1 <= contributed < LEARN_ROUNDS and statuses == want, (pid, statuses, remaining)
            assert remaining < 1e-3, (pid, statuses, remaining)
            # Contributing rounds released (and paid for) a norm; noise-only rounds released none.
            norms = [s.sensitivity for s in spends]
            assert all(n > 0 for n in norms[:contributed]) and all(n == 0 for n in norms[contributed:]), norms
        else:
            assert statuses == ["contributed"] * LEARN_ROUNDS, (pid, statuses, remaining)


@pytest.mark.slow
def test_a_run_whose_devices_all_refuse_fails_and_says_why(tmp_path):
    """No device enrolled: every device refuses, the run fails (not ``completed``), the operator's
    output counts the refusals by code and says what to do, and no model is saved."""
    from fedfilter.deploy.simulation_link import SimulationLink

    root = tmp_path / "machine"
    settings = {
        str(pid): {
            "ledger-dir": str(root / "devices" / str(pid)),
            "client-id": f"device-{pid}",
            "budget-epsilon": 8.0,
            "budget-delta": 1e-5,
            "min-noise-multiplier": _example_request()[0],
            "reply-hold-s": 0,
        }
        for pid in range(NUM_DEVICES)
    }
    root.mkdir(parents=True)
    (root / "device-settings.json").write_text(json.dumps(settings))
    run_config = {"num-server-rounds": 1, "save-model": True}
    with SimulationLink(
        tmp_path / "link", num_supernodes=NUM_DEVICES, num_cpus=1, device_settings=root / "device-settings.json"
    ) as link:
        result = link.run_app(FEDFILTER_APP, run_config=run_config, timeout=RUN_TIMEOUT_S)
        workdir = link.home
    assert not result.ok, result.status
    assert f"{NUM_DEVICES} refused: not-enrolled" in result.output, result.output[-3000:]
    assert "fedfilter ledger enrol" in result.output
    assert "no round of run" in result.output and "was released" in result.output
    assert "NothingReleasedError" in result.output
    assert not (workdir / "final_model.pt").exists()
