"""Peer-key pinning (cross-silo): with the owner's pinned peers, a device refuses, before it
trains, a round in which a neighbour's keys are not certified by a pinned identity, so a coordinator
that plays a neighbour itself (a forged peer) is refused; with every neighbour pinned the round runs.

The forged peer is a device whose identity the others did not pin, or which sends no certificate:
what a coordinator running its own node looks like to the devices."""

from __future__ import annotations

from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ec import SECP256R1, generate_private_key
from flwr.common.secure_aggregation.secaggplus_constants import Stage
from helpers.pinning import identity_files, pin
from helpers.secagg_attacks import Seen, answered, attacker, charges, nid_of, refused, run_attack

from fedfilter.client.secagg.consistency import certify, seal_certificate
from fedfilter.client.secagg.pinning import IDENTITY_KEY, PINNED_PEERS, PinningError, pinning
from fedfilter.protocol.wire import CONSISTENCY_RECORD


def honest(seen):
    return attacker(seen, lambda stage, msg: None)


def sealed_records(seen) -> list:
    """The certificate records that went through the coordinator: share-keys replies, collect requests."""
    return [
        m.content.config_records[CONSISTENCY_RECORD]
        for s, q, r in seen.log
        for m in ((r,) if s == Stage.SHARE_KEYS else (q,) if s == Stage.COLLECT_MASKED_VECTORS else ())
        if CONSISTENCY_RECORD in m.content.config_records
    ]


def test_a_round_among_pinned_peers_runs(tmp_path, monkeypatch):
    n = 3
    paths, hexes = identity_files(tmp_path, n)
    extra = {i: {IDENTITY_KEY: paths[i], PINNED_PEERS: pin(tmp_path, i, hexes)} for i in range(n)}
    seen = run_attack(tmp_path, monkeypatch, n, honest, extra=extra)
    assert answered(seen, Stage.UNMASK) == {nid_of(i) for i in range(n)}
    assert all(c > 0 for c in charges(tmp_path, n))
    records = sealed_records(seen)
    assert len(records) == 2 * n and all(len(r["sealed"]) == n - 1 for r in records)  # sent, then relayed
    for record in records:  # sealed: no identity key (hex or raw) in the clear
        assert not any(bytes.fromhex(h) in token for h in hexes for token in record["sealed"])


def test_without_pinning_nothing_is_sealed_or_relayed(tmp_path, monkeypatch):
    seen = run_attack(tmp_path, monkeypatch, 3, honest)
    assert answered(seen, Stage.UNMASK) == {nid_of(i) for i in range(3)}
    assert sealed_records(seen) == []


def test_a_certificate_sealed_under_the_coordinators_key_is_refused_before_training(tmp_path, monkeypatch):
    """The coordinator replaces the certificate one device sealed for another by a pinned identity's
    valid certificate of that node's keys, sealed under a key of its own: the receiver cannot open it
    under the pairwise key and refuses before training."""
    n, victim, peer = 3, nid_of(0), nid_of(1)
    paths, hexes = identity_files(tmp_path, n)
    extra = {i: {IDENTITY_KEY: paths[i], PINNED_PEERS: pin(tmp_path, i, hexes)} for i in range(n)}
    identity = serialization.load_pem_private_key(Path(paths[1]).read_bytes(), password=None)
    raw = identity.private_bytes(
        serialization.Encoding.Raw, serialization.PrivateFormat.Raw, serialization.NoEncryption()
    )
    keys = {}

    def forge(stage, msg):
        if stage == Stage.SHARE_KEYS and int(msg.metadata.dst_node_id) == victim:
            keys.update({"pk1": msg.content.config_records["secaggplus_configs"][str(peer)][0]})
            keys.update({"pk2": msg.content.config_records["secaggplus_configs"][str(peer)][1]})
        if stage == Stage.COLLECT_MASKED_VECTORS and int(msg.metadata.dst_node_id) == victim:
            cert = certify(raw, run_id=seen.grid.run.run_id, round_id=msg.metadata.group_id, nid=peer, **keys)
            fake = seal_certificate(b"the coordinator's own key", src=peer, dst=victim, certificate=cert)
            record = msg.content.config_records[CONSISTENCY_RECORD]
            record["sealed"] = [fake if src == peer else t for src, t in zip(record["src"], record["sealed"])]

    seen = Seen()
    seen = run_attack(tmp_path, monkeypatch, n, lambda s: attacker(s, forge), extra=extra, seen=seen)
    assert victim in refused(seen, Stage.COLLECT_MASKED_VECTORS)
    (reason,) = [r.error.reason for s, q, r in seen.log if s == Stage.COLLECT_MASKED_VECTORS and r.has_error()]
    assert f"node {peer}'s certificate is missing or not sealed by it for this device" in reason
    assert victim not in seen.y and charges(tmp_path, n)[0] == 0.0


def test_a_peer_whose_identity_is_not_pinned_is_refused_before_training(tmp_path, monkeypatch):
    n, forged = 3, 2
    paths, hexes = identity_files(tmp_path, n)
    pinned = [h for i, h in enumerate(hexes) if i != forged]  # nobody pinned node 2's key
    extra = {i: {IDENTITY_KEY: paths[i], PINNED_PEERS: pin(tmp_path, i, pinned)} for i in range(n)}
    seen = run_attack(tmp_path, monkeypatch, n, honest, extra=extra)
    genuine = {nid_of(0), nid_of(1)}
    assert genuine <= refused(seen, Stage.COLLECT_MASKED_VECTORS)
    for s, _, r in seen.log:
        if s == Stage.COLLECT_MASKED_VECTORS and int(r.metadata.src_node_id) in genuine:
            assert f"node {nid_of(forged)}'s identity key" in r.error.reason and "is not pinned" in r.error.reason
    assert charges(tmp_path, n)[:2] == [0.0, 0.0]


def test_a_peer_without_a_certificate_is_refused_before_training(tmp_path, monkeypatch):
    n = 3
    paths, hexes = identity_files(tmp_path, n)
    extra = {i: {IDENTITY_KEY: paths[i], PINNED_PEERS: pin(tmp_path, i, hexes)} for i in range(2)}  # 2: none
    seen = run_attack(tmp_path, monkeypatch, n, honest, extra=extra)
    assert {nid_of(0), nid_of(1)} <= refused(seen, Stage.COLLECT_MASKED_VECTORS)
    assert charges(tmp_path, n)[:2] == [0.0, 0.0]


def test_pinning_settings_are_checked_and_named(tmp_path):
    paths, hexes = identity_files(tmp_path, 1)
    assert pinning({}) is None
    good = pinning({IDENTITY_KEY: paths[0], PINNED_PEERS: pin(tmp_path, 0, hexes)})
    assert good is not None and good.pinned == frozenset({bytes.fromhex(hexes[0])})
    ec = tmp_path / "ec.pem"
    ec.write_bytes(
        generate_private_key(SECP256R1()).private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    bad_hex = tmp_path / "bad.txt"
    bad_hex.write_text(hexes[0] + "\nabc\n")
    empty = tmp_path / "empty.txt"
    empty.write_text("# nobody\n")
    cases = [
        ({IDENTITY_KEY: paths[0]}, "must both name files"),
        ({IDENTITY_KEY: str(tmp_path / "missing.pem"), PINNED_PEERS: str(bad_hex)}, "cannot read an Ed25519 PEM key"),
        ({IDENTITY_KEY: str(ec), PINNED_PEERS: str(empty)}, "not an Ed25519 key"),
        ({IDENTITY_KEY: paths[0], PINNED_PEERS: str(bad_hex)}, "line 2 is not 64 hex digits: 'abc'"),
        ({IDENTITY_KEY: paths[0], PINNED_PEERS: str(empty)}, "pins no key"),
        ({IDENTITY_KEY: paths[0], PINNED_PEERS: str(tmp_path / "none.txt")}, "cannot read"),
    ]
    for config, words in cases:
        with pytest.raises(PinningError, match="node-config") as err:
            pinning(config)
        assert words in str(err.value)


def test_one_pinned_identity_counts_as_one_neighbour_only(tmp_path, monkeypatch):
    """Two nodes certified by one identity (a pinned key the coordinator got hold of, run twice): every
    device refuses, so one pinned key cannot fill a neighbourhood."""
    n = 3
    paths, hexes = identity_files(tmp_path, n)
    extra = {i: {IDENTITY_KEY: paths[min(i, 1)], PINNED_PEERS: pin(tmp_path, i, hexes)} for i in range(n)}
    seen = run_attack(tmp_path, monkeypatch, n, honest, extra=extra)
    assert refused(seen, Stage.COLLECT_MASKED_VECTORS) == {nid_of(i) for i in range(n)}
    assert any("identity key of another node" in r.error.reason for s, _, r in seen.log if r.has_error())
