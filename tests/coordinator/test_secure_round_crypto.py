"""SecAgg+ rounds (Flower's workflow and client mod, loopback grid) with fedfilter's Shamir and AES masks.

The unmasked sum is compared with the integers the test chose; a round where one side runs Flower's own
primitives must fail by name and release nothing.
"""

from __future__ import annotations

import contextlib
import importlib

import numpy as np
import pytest
from flwr.app import Message, RecordDict
from flwr.client.mod import secaggplus_mod
from flwr.clientapp import ClientApp
from flwr.common import Code, FitRes, Status, ndarrays_to_parameters
from flwr.common.secure_aggregation.secaggplus_constants import RECORD_KEY_STATE
from flwr.compat.common import recorddict_compat as compat
from secagg_loopback import LoopbackGrid

from fedfilter.client import secagg_masks, secagg_shamir
from fedfilter.client.secagg_grid import decode_sum, encode_report
from fedfilter.coordinator import secure_round

CLIENT_MOD = "flwr.client.mod.secure_aggregation.secaggplus_mod"
SHAPES = [(5, 3), (7,)]


@pytest.fixture(autouse=True)
def _flowers_primitives_back():
    secagg_masks.restore()
    yield
    secagg_masks.restore()


def _reports(nodes, seed=0):
    rng = np.random.default_rng(seed)
    return {nid: [rng.integers(-5000, 5000, size=s, dtype=np.int64) for s in SHAPES] for nid in nodes}


def _app(reports, device_mods):
    app = ClientApp(mods=[*device_mods, secaggplus_mod])

    @app.train()
    def train(msg, ctxt):
        q = int(ctxt.state.config_records[RECORD_KEY_STATE]["target_range"])
        fitres = FitRes(Status(Code.OK, ""), ndarrays_to_parameters(encode_report(reports[ctxt.node_id], q)), 1, {})
        return Message(compat.fitres_to_recorddict(fitres, True), reply_to=msg)

    return app


def _install(msg, ctxt, call_next):  # what secure_aggregation_mod does first on a device
    secagg_masks.use_cryptographic_masks()
    return call_next(msg, ctxt)


def _device_primitives(create_shares, generator):
    """A device mod that runs the given Shamir split and mask generator inside secaggplus_mod (the
    loopback runs every side in one process: this is one device's installation, nobody else's)."""

    def mod(msg, ctxt, call_next):
        module = importlib.import_module(CLIENT_MOD)
        saved = module.create_shares, module.pseudo_rand_gen
        module.create_shares, module.pseudo_rand_gen = create_shares, generator
        try:
            return call_next(msg, ctxt)
        finally:
            module.create_shares, module.pseudo_rand_gen = saved

    return mod


def _flowers_primitives():
    flower = importlib.import_module("flwr.common.secure_aggregation.crypto.shamir").create_shares
    generator = importlib.import_module("flwr.common.secure_aggregation.secaggplus_utils").pseudo_rand_gen
    return _device_primitives(flower, generator)


def _run(nodes, reports, *, min_reports, num_shares=1.0, mods=None, drop=None):
    mods = mods or {}
    apps = {nid: _app(reports, mods.get(nid, [_install])) for nid in nodes}
    grid = LoopbackGrid(apps, drop=drop)
    contents = {nid: RecordDict() for nid in nodes}
    return secure_round.run_secure_round(grid, contents, server_round=1, min_reports=min_reports, num_shares=num_shares)


def test_a_round_with_fedfilters_primitives_on_both_sides_unmasks_the_exact_sum():
    nodes = list(range(200, 212))
    reports = _reports(nodes)
    dropped = {203, 207}
    out = _run(
        nodes, reports, min_reports=6, drop=lambda stage, nid: stage == "collect_masked_vectors" and nid in dropped
    )
    assert out.reason == "" and out.reports == len(nodes) - len(dropped)
    sums = decode_sum(out.aggregate, out.reports, out.quantization_range)
    for i, got in enumerate(sums):
        np.testing.assert_array_equal(got, sum(reports[n][i] for n in nodes if n not in dropped))
    assert not secagg_masks.cryptographic_masks_installed()  # scoped to the round on the coordinator


def test_a_device_running_flowers_primitives_fails_the_round_by_name():
    nodes = list(range(300, 306))
    out = _run(nodes, _reports(nodes), min_reports=3, mods={302: [_install, _flowers_primitives()]})
    assert out.aggregate is None and out.reports == 0
    assert "Flower's Shamir" in out.reason


def test_a_coordinator_running_flowers_primitives_fails_the_round(monkeypatch):
    # The coordinator's workflow keeps Flower's combine and generator; every device runs fedfilter's.
    monkeypatch.setattr(secure_round, "cryptographic_masks", contextlib.nullcontext)
    nodes = list(range(400, 405))
    ours = _device_primitives(secagg_shamir.create_shares, secagg_masks.aes_mask_gen)
    out = _run(nodes, _reports(nodes), min_reports=3, mods={nid: [ours] for nid in nodes})
    assert out.aggregate is None and out.reports == 0
    assert "Duplicate share" in out.reason
    assert not secagg_masks.cryptographic_masks_installed()


def test_the_default_sparse_graph_gives_each_node_k_holders_and_unmasks_the_exact_sum():
    from flwr.common.secure_aggregation.secaggplus_constants import RECORD_KEY_CONFIGS, Key

    nodes = list(range(500, 524))
    reports = _reports(nodes, seed=4)
    graph = secure_round.round_graph(len(nodes), 12)
    assert graph.num_shares < len(nodes)  # sparse: k holders per node, not all 24
    apps = {nid: _app(reports, [_install]) for nid in nodes}
    grid = LoopbackGrid(apps, drop=lambda stage, nid: stage == "collect_masked_vectors" and nid == 511)
    out = secure_round.run_secure_round(grid, {n: RecordDict() for n in nodes}, server_round=1, min_reports=12)
    assert (out.num_shares, out.failure_probability) == (graph.num_shares, graph.failure_probability)
    setup = [m for m in grid.sent if m.content.config_records[RECORD_KEY_CONFIGS].get(Key.STAGE) == "setup"]
    assert {m.content.config_records[RECORD_KEY_CONFIGS][Key.SHARE_NUMBER] for m in setup} == {graph.num_shares}
    assert {m.content.config_records[RECORD_KEY_CONFIGS][Key.THRESHOLD] for m in setup} == {graph.threshold}
    share_keys = [m for m in grid.sent if m.content.config_records[RECORD_KEY_CONFIGS].get(Key.STAGE) == "share_keys"]
    assert {len(m.content.config_records[RECORD_KEY_CONFIGS]) - 1 for m in share_keys} == {graph.num_shares}
    assert out.reason == "" and out.reports == len(nodes) - 1
    sums = decode_sum(out.aggregate, out.reports, out.quantization_range)
    for i, got in enumerate(sums):
        np.testing.assert_array_equal(got, sum(reports[n][i] for n in nodes if n != 511))


def test_fewer_sampled_than_min_reports_halts_the_round_without_ending_the_run():
    nodes = [600, 601, 602]
    out = _run(nodes, _reports(nodes), min_reports=4, num_shares="auto")
    assert out.aggregate is None and out.reports == 0 and "halted" in out.reason


def test_more_dropouts_than_the_graphs_bound_assumes_unmask_nothing():
    # 24 nodes: k = 11, t = 7; the bound assumes at most ceil(0.1 * 24) = 3 drop-outs. With 4, every
    # node still has 7 surviving holders (Flower would unmask), but the coordinator halts.
    nodes = list(range(700, 724))
    graph = secure_round.round_graph(len(nodes), 12)
    assert (graph.num_shares, graph.threshold) == (11, 7)
    gone = {701, 708, 715, 722}

    def drop(stage, nid):
        return stage == "collect_masked_vectors" and nid in gone

    out = _run(nodes, _reports(nodes), min_reports=12, num_shares="auto", drop=drop)
    assert out.aggregate is None and out.masked_vectors == 20
    assert "more than the SecAgg+ graph's failure bound assumes" in out.reason
    three = _run(
        nodes, _reports(nodes), min_reports=12, num_shares="auto", drop=lambda st, nid: drop(st, nid) and nid != 722
    )
    assert three.reason == "" and three.reports == 21
