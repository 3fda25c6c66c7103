"""The example a Flower user copies: Flower's quickstart-pytorch plus fedfilter (``examples/``).

Fast checks: the fedfilter variant differs from the offline Flower template by a few lines, and
``FEDFILTER.diff`` and the README show exactly the live diff. Slow checks (``flwr run``, the entry
Flower users use, against a SuperLink in simulation mode on 127.0.0.1): the plain template runs
offline, and the fedfilter variant runs 2 rounds on 3 simulated devices whose personal budgets
live only in a device-settings file on the machine running the simulation
(``FEDFILTER_DEVICE_SETTINGS``), never in the coordinator's run config.
"""

from __future__ import annotations

import importlib.util
import json
import re
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
BASE_APP = EXAMPLES / "flower-quickstart-pytorch"
FEDFILTER_APP = EXAMPLES / "quickstart-pytorch"
APPS = (BASE_APP, FEDFILTER_APP)
MAX_CHANGED_LINES = 12
SECTION = "Use it in your Flower app"
NUM_DEVICES, NUM_ROUNDS = 3, 2
RUN_TIMEOUT_S = 150.0


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
    ``flower-superlink --insecure --simulation`` on 127.0.0.1 (``fedfilter.simulation_link``) whose
    environment names ``device_settings``; everything started is stopped before this returns. The
    SuperLink, and so the ServerApp's relative paths, work in the returned directory."""
    from fedfilter.simulation_link import SimulationLink

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


# Personal budgets, on the device side only: tiny (spent in round 1, then pure noise), middle, large.
BUDGETS = {0: 0.3, 1: 2.0, 2: 50.0}


def _enrol_devices(root: Path) -> tuple[Path, dict[int, dict]]:
    """Each device's settings, as its owner sets them, and the owner's enrolment (done up front)."""
    from fedfilter.client.flower_mod import enrol_device

    settings = {
        pid: {
            "ledger-dir": str(root / "devices" / str(pid)),
            "client-id": f"device-{pid}",
            "budget-epsilon": epsilon,
            "budget-delta": 1e-5,
            "reply-hold-s": 0,  # timing protection off: one simulation process serves every device
        }
        for pid, epsilon in BUDGETS.items()
    }
    for entry in settings.values():
        enrol_device(entry)
    path = root / "device-settings.json"
    path.write_text(json.dumps({str(pid): entry for pid, entry in settings.items()}))
    return path, settings


@pytest.mark.slow
def test_fedfilter_example_runs_under_flwr_run_with_personal_budgets(tmp_path):
    from fedfilter.client.ledger import BudgetLedger
    from fedfilter.coordinator.public_ledger import PublicLedger

    settings_file, settings = _enrol_devices(tmp_path / "machine")
    # FEDFILTER_DEVICE_SETTINGS is set for the SuperLink on the machine running the simulation (its
    # Ray workers inherit it); the coordinator's run config cannot name it.
    link_dir = _flwr_run(FEDFILTER_APP, tmp_path / "link", {"num-server-rounds": NUM_ROUNDS}, settings_file)

    # The coordinator's public ledger: 2 rounds, every sampled device reported (a device whose
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
    assert [r.round_id for r in records] == list(range(1, NUM_ROUNDS + 1))
    for record in records:
        assert (record.clients_sampled, record.reports_received) == (NUM_DEVICES, NUM_DEVICES)
        assert (record.markers_received, record.replies_dropped, record.released) == (0, 0, True)

    # The coordinator's run config holds no budget and nothing of the devices' settings.
    app_config = tomllib.loads((FEDFILTER_APP / "pyproject.toml").read_text())["tool"]["flwr"]["app"]["config"]
    for key in [*app_config, *public_config]:
        assert not re.search(r"budget|epsilon|delta|ledger-dir|client-id", key), key
    stored = (link_dir / "public_ledger.db").read_bytes()
    for entry in settings.values():
        assert entry["client-id"].encode() not in stored and entry["ledger-dir"].encode() not in stored

    # Each device's own ledger: this run's 2 rounds, spends within its personal budget.
    for pid, entry in settings.items():
        ledger = BudgetLedger.open(entry["ledger-dir"])
        try:
            spends = ledger.records(run_id)
            state, budget = ledger.state(), ledger.filter.budget
            assert [s.round_id for s in spends] == list(range(1, NUM_ROUNDS + 1)), pid
            assert all(s.noise_multiplier == 1.0 and s.clip == 1.0 for s in spends)
            assert (state <= budget).all(), (pid, state, budget)
            assert (ledger.recomputed_state() == state).all()
            statuses = [s.status for s in spends]
            remaining = float(ledger.filter.remaining_fraction(state))
        finally:
            ledger.close()
        if BUDGETS[pid] == min(BUDGETS.values()):
            # Spent in round 1 (the last charge lands on the budget, up to the ledger's conservative
            # rounding), pure noise in round 2.
            assert statuses == ["contributed", "noise-only"] and remaining < 1e-3, (pid, statuses, remaining)
        if BUDGETS[pid] == max(BUDGETS.values()):
            assert statuses == ["contributed"] * NUM_ROUNDS and remaining > 0.0, (pid, statuses, remaining)
