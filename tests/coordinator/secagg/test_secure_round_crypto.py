"""SecAgg+ rounds (Flower's workflow and client mod, loopback grid) with fedfilter's Shamir and AES masks.

The unmasked sum is compared with the integers the test chose; a round where one side runs Flower's own
primitives must fail by name and release nothing. Devices run ``secure_aggregation_mod`` (Flower's
``secaggplus_mod`` with the consistency round the coordinator's workflow always runs) around a
handler that returns the chosen integers: no ledger, no noise.
"""

from __future__ import annotations

import contextlib
import importlib

import numpy as np
import pytest
from flwr.app import Message, RecordDict
from flwr.clientapp import ClientApp
from flwr.common import Code, FitRes, Status, ndarrays_to_parameters
from flwr.common.secure_aggregation.secaggplus_constants import RECORD_KEY_CONFIGS, RECORD_KEY_STATE, Key
from flwr.compat.common import recorddict_compat as compat
from harness.secagg_loopback import LoopbackGrid, stage_of

from fedfilter.client.secagg import mod as secagg_device
from fedfilter.coordinator.secagg import secure_round
from fedfilter.protocol.secagg import masks as secagg_masks
from fedfilter.protocol.secagg.grid import decode_sum, encode_report
from fedfilter.protocol.wire import CONSISTENCY_RECORD, CONSISTENCY_STAGE

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


def _app(reports):
    app = ClientApp(mods=[secagg_device.secure_aggregation_mod])

    @app.train()
    def train(msg, ctxt):
        q = int(ctxt.state.config_records[RECORD_KEY_STATE]["target_range"])
        fitres = FitRes(Status(Code.OK, ""), ndarrays_to_parameters(encode_report(reports[ctxt.node_id], q)), 1, {})
        return Message(compat.fitres_to_recorddict(fitres, True), reply_to=msg)

    return app


@pytest.fixture
def device_primitives(monkeypatch):
    """node id -> (Shamir split, mask generator), or {attribute: function}, that node's ``secaggplus_mod``
    runs, set after ``secure_aggregation_mod`` installed fedfilter's (the loopback runs every side in one
    process: this is one device's installation, nobody else's). Nodes not listed run what is installed."""
    chosen: dict[int, tuple | dict] = {}
    flowers_mod = secagg_device.secaggplus_mod

    def run(msg, ctxt, call_next):
        if ctxt.node_id not in chosen:
            return flowers_mod(msg, ctxt, call_next)
        module = importlib.import_module(CLIENT_MOD)
        functions = chosen[ctxt.node_id]
        if isinstance(functions, tuple):
            functions = dict(zip(("create_shares", "pseudo_rand_gen"), functions, strict=True))
        saved = {name: getattr(module, name) for name in functions}
        for name, function in functions.items():
            setattr(module, name, function)
        try:
            return flowers_mod(msg, ctxt, call_next)
        finally:
            for name, function in saved.items():
                setattr(module, name, function)

    monkeypatch.setattr(secagg_device, "secaggplus_mod", run)
    return chosen


def _flowers_primitives():
    flower = importlib.import_module("flwr.common.secure_aggregation.crypto.shamir").create_shares
    generator = importlib.import_module("flwr.common.secure_aggregation.secaggplus_utils").pseudo_rand_gen
    return flower, generator


def _run(nodes, reports, *, min_reports, num_shares=1.0, drop=None):
    apps = {nid: _app(reports) for nid in nodes}
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


def test_a_device_running_flowers_primitives_fails_the_round_by_name(device_primitives):
    nodes = list(range(300, 306))
    device_primitives[302] = _flowers_primitives()
    out = _run(nodes, _reports(nodes), min_reports=3)
    assert out.aggregate is None and out.reports == 0
    assert "Flower's Shamir" in out.reason


def test_a_device_on_flowers_share_encryption_is_refused_by_name_before_its_neighbours_train(device_primitives):
    """Node 302's secaggplus_mod seals its shares with Flower's Fernet: every other device meets its
    Fernet token in its check before training and refuses, naming it, and nothing is released. (The
    other direction, Flower's decrypt refusing fedfilter's ciphertexts, is in test_secagg_aead.py: in
    this in-process grid its InvalidToken would propagate instead of becoming an error reply.)"""
    encryption = importlib.import_module("flwr.common.secure_aggregation.crypto.symmetric_encryption")
    nodes = list(range(300, 306))
    device_primitives[302] = {"encrypt": encryption.encrypt}
    grid = LoopbackGrid({nid: _app(_reports(nodes)) for nid in nodes})
    contents = {n: RecordDict() for n in nodes}
    out = secure_round.run_secure_round(grid, contents, server_round=1, min_reports=3, num_shares=1.0)
    assert out.aggregate is None and out.reports == 0
    collect = [r for r in grid.received if r.has_error() and "secure aggregation refused" in r.error.reason]
    assert {int(r.metadata.src_node_id) for r in collect} == set(nodes) - {302}
    for reply in collect:
        reason = reply.error.reason
        assert "node 302's share ciphertext is not one it sealed for this device (the share ciphertext is a " in reason
        assert "Fernet token" in reason and "Nothing was trained, spent or released" in reason


def test_a_coordinator_running_flowers_primitives_fails_the_round(monkeypatch, device_primitives):
    # The coordinator's workflow keeps Flower's combine and generator; every device runs fedfilter's
    # (set in its own secaggplus_mod only: installing them process-wide would reach the coordinator too).
    monkeypatch.setattr(secure_round, "cryptographic_masks", contextlib.nullcontext)
    monkeypatch.setattr(secagg_device, "use_cryptographic_masks", lambda: None)
    nodes = list(range(400, 405))
    overrides = secagg_masks._overrides().items()
    fedfilters = {name: function for name, (function, sides) in overrides if CLIENT_MOD in sides}
    device_primitives.update({nid: fedfilters for nid in nodes})
    out = _run(nodes, _reports(nodes), min_reports=3)
    assert out.aggregate is None and out.reports == 0
    assert "Duplicate share" in out.reason
    assert not secagg_masks.cryptographic_masks_installed()


def test_the_default_sparse_graph_gives_each_node_k_holders_and_unmasks_the_exact_sum():
    nodes = list(range(500, 524))
    reports = _reports(nodes, seed=4)
    graph = secure_round.round_graph(len(nodes), 12)
    assert graph.num_shares < len(nodes)  # sparse: k holders per node, not all 24
    apps = {nid: _app(reports) for nid in nodes}
    grid = LoopbackGrid(apps, drop=lambda stage, nid: stage == "collect_masked_vectors" and nid == 511)
    out = secure_round.run_secure_round(grid, {n: RecordDict() for n in nodes}, server_round=1, min_reports=12)
    assert out.num_shares == graph.num_shares
    setup = [m for m in grid.sent if m.content.config_records[RECORD_KEY_CONFIGS].get(Key.STAGE) == "setup"]
    assert {m.content.config_records[RECORD_KEY_CONFIGS][Key.SHARE_NUMBER] for m in setup} == {graph.num_shares}
    assert {m.content.config_records[RECORD_KEY_CONFIGS][Key.THRESHOLD] for m in setup} == {graph.threshold}
    share_keys = [m for m in grid.sent if m.content.config_records[RECORD_KEY_CONFIGS].get(Key.STAGE) == "share_keys"]
    assert {len(m.content.config_records[RECORD_KEY_CONFIGS]) - 1 for m in share_keys} == {graph.num_shares}
    # The consistency round ran on the sparse graph: every survivor authenticated the set, and each unmask
    # request carried the tags of every surviving neighbour of its device (it reveals a node's seed share
    # only with that node's own tag, and verifies every one it is shown), none its own.
    assert len([m for m in grid.sent if stage_of(m) == CONSISTENCY_STAGE]) == len(nodes) - 1
    neighbours = {
        m.metadata.dst_node_id: {int(k) for k in m.content.config_records[RECORD_KEY_CONFIGS] if k != Key.STAGE}
        for m in share_keys
    }
    unmask = [m for m in grid.sent if stage_of(m) == "unmask"]
    assert len(unmask) == len(nodes) - 1
    for m in unmask:
        record, me = m.content.config_records[CONSISTENCY_RECORD], m.metadata.dst_node_id
        signers = record["signer"]
        assert len(signers) == len(set(signers)) == len(record["tag"]) >= graph.threshold - 1
        assert set(signers) == neighbours[me] - {me, 511}
    assert out.reason == "" and out.reports == len(nodes) - 1
    sums = decode_sum(out.aggregate, out.reports, out.quantization_range)
    for i, got in enumerate(sums):
        np.testing.assert_array_equal(got, sum(reports[n][i] for n in nodes if n != 511))


def test_fewer_sampled_than_min_reports_halts_the_round_without_ending_the_run():
    nodes = [600, 601, 602]
    out = _run(nodes, _reports(nodes), min_reports=4, num_shares="auto")
    assert out.aggregate is None and out.reports == 0 and "halted" in out.reason


def test_more_dropouts_than_the_graph_is_sized_for_are_unmasked_when_flower_can():
    """Privacy does not rest on the drop-outs (every sum holds the threshold's worth of reports), so the
    coordinator unmasks whenever Flower's own check passes: 24 nodes, full graph, t = 13, a sixth gone."""
    nodes = list(range(700, 724))
    gone = {701, 708, 715, 722}
    out = _run(
        nodes,
        _reports(nodes),
        min_reports=12,
        drop=lambda stage, nid: stage == "collect_masked_vectors" and nid in gone,
    )
    assert out.reason == "" and out.reports == 20 and out.threshold == 13


def test_a_node_with_exactly_threshold_surviving_neighbours_on_a_sparse_graph_is_unmasked():
    """24 nodes, k = 7 given, t = 4 (above k / 2, and min-reports 4); three of one node's neighbours drop
    out after sharing keys: it keeps exactly t = 4 holders (itself included), authenticates the set,
    gets the t - 1 = 3 neighbours' tags it needs (all it has), reveals, and the sum is exact. The
    boundary the devices' checks (``>= threshold``) must serve."""
    nodes = list(range(800, 824))
    reports = _reports(nodes, seed=8)
    graph = secure_round.round_graph(len(nodes), 4, 7)
    assert (graph.num_shares, graph.threshold) == (7, 4)
    victim, grid = 800, None
    gone: set[int] = set()

    def drop(stage, nid):
        if stage != "collect_masked_vectors":
            return False
        if not gone:  # the victim's neighbours, read off the share-keys request Flower sent it
            (request,) = [m for m in grid.sent if stage_of(m) == "share_keys" and m.metadata.dst_node_id == victim]
            neighbours = sorted(int(k) for k in request.content.config_records[RECORD_KEY_CONFIGS] if k != Key.STAGE)
            gone.update([n for n in neighbours if n != victim][:3])
        return nid in gone

    grid = LoopbackGrid({nid: _app(reports) for nid in nodes}, drop=drop)
    out = secure_round.run_secure_round(
        grid, {n: RecordDict() for n in nodes}, server_round=1, min_reports=4, num_shares=7
    )
    assert len(gone) == 3 and out.reason == "" and out.reports == len(nodes) - 3
    (request,) = [m for m in grid.sent if stage_of(m) == "unmask" and m.metadata.dst_node_id == victim]
    assert len(request.content.config_records[CONSISTENCY_RECORD]["signer"]) == graph.threshold - 1
    (reply,) = [r for r in grid.received if r.metadata.reply_to_message_id == request.metadata.message_id]
    assert not reply.has_error() and victim in reply.content.config_records[RECORD_KEY_CONFIGS][Key.NODE_ID_LIST]
    sums = decode_sum(out.aggregate, out.reports, out.quantization_range)
    for i, got in enumerate(sums):
        np.testing.assert_array_equal(got, sum(reports[n][i] for n in nodes if n not in gone))
