"""A coordinator that forwards bad X25519 keys (protocol/secagg/keys.py), and a device still on Flower's
P-384 keys: refused at the share-keys stage, before anything is trained, spent or revealed."""

from __future__ import annotations

import importlib

import pytest
from flwr.common.secure_aggregation.secaggplus_constants import Key, Stage
from helpers.secagg_attacks import answered, attacker, charges, configs_of, nid_of, refused, run_attack

from fedfilter.client.secagg import mod as secagg_device

# An order-8 point of Curve25519 (libsodium's blocklist): its X25519 output is all zeros.
LOW_ORDER = bytes.fromhex("e0eb7a7c3b41b8ae1656e3faf19fc46ada098deb9c32b1fd866205165f49b800")


@pytest.mark.parametrize("index, words", [(0, "low-order point"), (1, "low-order point"), (0, "found 31 bytes")])
def test_a_bad_neighbour_key_is_refused_before_the_victim_pays(tmp_path, monkeypatch, index, words):
    """pk1 (index 0) meets the victim's key only after training in Flower's stages; pk2 (index 1) in the
    share-keys stage. Either way the victim refuses there, and pays nothing."""
    n, victim, peer = 3, nid_of(2), str(nid_of(0))
    bad = LOW_ORDER if "low-order" in words else bytes(31)

    def forge(stage, msg):
        if stage == Stage.SHARE_KEYS and int(msg.metadata.dst_node_id) == victim:
            pair = list(configs_of(msg)[peer])
            pair[index] = bad
            configs_of(msg)[peer] = pair

    seen = run_attack(tmp_path, monkeypatch, n, lambda s: attacker(s, forge))
    assert victim in refused(seen, Stage.SHARE_KEYS)
    (reason,) = [r.error.reason for s, q, r in seen.log if s == Stage.SHARE_KEYS and r.has_error()]
    assert words in reason and "Nothing was trained, spent or released" in reason
    # Named by node when fedfilter's check finds it, by value when Flower's own pk2 exchange does.
    assert f"node {peer}" in reason if index == 0 else bad.hex() in reason
    assert charges(tmp_path, n)[2] == 0.0 and victim not in seen.y


def test_a_device_on_flowers_p384_keys_fails_the_round_loudly(tmp_path, monkeypatch):
    """One device's secaggplus_mod makes Flower's PEM keys (set inside its own call: the mod installs
    fedfilter's at every message): every other device refuses them at the share-keys stage, so the round
    releases nothing and nobody pays."""
    n, odd = 3, nid_of(1)
    client = importlib.import_module("flwr.client.mod.secure_aggregation.secaggplus_mod")
    asymmetric = importlib.import_module("flwr.supercore.primitives.asymmetric")
    names = ("generate_key_pairs", "private_key_to_bytes", "public_key_to_bytes")
    flowers_mod = secagg_device.secaggplus_mod

    def run(msg, ctxt, call_next):
        if ctxt.node_id != odd:
            return flowers_mod(msg, ctxt, call_next)
        saved = {name: getattr(client, name) for name in names}
        for name in names:
            setattr(client, name, getattr(asymmetric, name))
        try:
            return flowers_mod(msg, ctxt, call_next)
        finally:
            for name, function in saved.items():
                setattr(client, name, function)

    monkeypatch.setattr(secagg_device, "secaggplus_mod", run)
    seen = run_attack(tmp_path, monkeypatch, n, lambda s: attacker(s, lambda stage, msg: None))
    setup = {int(r.metadata.src_node_id): configs_of(r) for s, q, r in seen.log if s == Stage.SETUP}
    assert len(setup[odd][Key.PUBLIC_KEY_1]) > 32 and len(setup[nid_of(0)][Key.PUBLIC_KEY_1]) == 32
    assert refused(seen, Stage.SHARE_KEYS) == {nid_of(i) for i in range(n)}
    reasons = [r.error.reason for s, q, r in seen.log if s == Stage.SHARE_KEYS and r.has_error()]
    assert sum(f"node {odd}" in reason and "PEM" in reason for reason in reasons) == 2
    assert sum("own SecAgg+ key is refused" in reason for reason in reasons) == 1
    assert answered(seen, Stage.COLLECT_MASKED_VECTORS) == set()
    assert charges(tmp_path, n) == [0.0] * n and seen.y == {}
