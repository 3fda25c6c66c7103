"""The device's malicious-server checks: sealed certificates, MACs on the survivor set,
unmask lists, and the SecAgg+ parameters, each at its boundary; the round with exactly ``threshold``
neighbours is served.

References are independent of the code under test: tags are computed here with the standard library's
``hmac`` over the message written out from its format, under a key from an RFC 5869 HKDF written out
from ``hmac`` (``helpers.crypto_reference``); certificates are checked with ``cryptography``'s Ed25519
directly; the share-count bound is the pigeonhole count written out (two disjoint groups of
``threshold`` among ``share_num`` holders exist iff ``2 * threshold <= share_num``).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import itertools
import os

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from flwr.common.secure_aggregation.secaggplus_constants import Stage
from helpers.crypto_reference import hkdf_sha256
from helpers.secagg import ledger_records, node_id, run_round

from fedfilter.client.secagg.consistency import (
    certify,
    check_certificate,
    check_node_ids,
    check_tags,
    check_unmask_lists,
    open_certificate,
    public_key_of,
    round_parameters,
    seal_certificate,
    survivors_message,
    survivors_tag,
)
from fedfilter.client.secagg.neighbourhood import check_secagg_state
from fedfilter.coordinator.secagg.secure_round import AUTO_SHARES, round_graph
from fedfilter.protocol.secagg.grid import MODULUS_RANGE, secaggplus_settings

MAC_KEY_INFO = b"fedfilter/secaggplus/survivors-mac-key/v1"


def channel_key() -> bytes:
    return base64.urlsafe_b64encode(os.urandom(32))  # the form of Flower's pairwise key (HKDF output)


def raw_public(key: Ed25519PrivateKey) -> bytes:
    return key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def new_identity() -> bytes:
    return Ed25519PrivateKey.generate().private_bytes(
        serialization.Encoding.Raw, serialization.PrivateFormat.Raw, serialization.NoEncryption()
    )


# --- sealed certificates (pinning) ---------------------------------------------------------------
def test_a_sealed_certificate_opens_only_for_its_pair_and_direction():
    k, other = channel_key(), channel_key()
    cert = certify(new_identity(), run_id=1, round_id="1", nid=5, pk1=b"a" * 32, pk2=b"b" * 32)
    token = seal_certificate(k, src=5, dst=9, certificate=cert)
    assert open_certificate(k, token, src=5, dst=9) == cert
    assert open_certificate(other, token, src=5, dst=9) is None  # the coordinator's own key
    assert open_certificate(k, token, src=9, dst=5) is None  # replayed in the other direction
    assert open_certificate(k, token, src=5, dst=8) is None  # replayed to another node
    assert open_certificate(k, token[:-1] + bytes([token[-1] ^ 1]), src=5, dst=9) is None
    assert open_certificate(k, seal_certificate(k, src=5, dst=9, certificate=cert[:-1]), src=5, dst=9) is None
    assert open_certificate(k, None, src=5, dst=9) is None
    assert open_certificate(k, b"not a token", src=5, dst=9) is None


# --- certificates of pinned identities -----------------------------------------------------------
def test_a_certificate_binds_the_identity_to_the_nodes_keys_and_round():
    identity = new_identity()
    pinned = frozenset({public_key_of(identity)})
    keys = {"run_id": 7, "round_id": "2", "nid": 11, "pk1": b"a" * 32, "pk2": b"b" * 32}
    cert = certify(identity, **keys)
    assert cert[:32] == public_key_of(identity) == raw_public(Ed25519PrivateKey.from_private_bytes(identity))
    assert len(cert) == 96
    Ed25519PrivateKey.from_private_bytes(identity).public_key().verify(cert[32:], _reference_body(**keys))
    assert check_certificate(cert, pinned, **keys) == (public_key_of(identity), "")
    for change in ({"pk2": b"x" * 32}, {"pk1": b"x" * 32}, {"nid": 12}, {"round_id": "3"}, {"run_id": 8}):
        identity_found, problem = check_certificate(cert, pinned, **{**keys, **change})
        assert identity_found is None and "does not sign the keys" in problem, change
    assert "is not pinned" in check_certificate(cert, frozenset({b"z" * 32}), **keys)[1]
    assert "no certificate" in check_certificate(b"", pinned, **keys)[1]


def _reference_body(*, run_id, round_id, nid, pk1, pk2):
    """The certified bytes, written out here from the format (tag, run, node, length-prefixed fields)."""
    out = b"fedfilter/secaggplus/identity-certificate/v2" + run_id.to_bytes(8, "big") + nid.to_bytes(8, "big")
    for part in (round_id.encode(), pk1, pk2):
        out += len(part).to_bytes(4, "big") + part
    return out


# --- MACs on the survivor set --------------------------------------------------------------------
def _reference_message(*, run_id, round_id, survivors, parameters):
    ids = sorted(set(survivors))
    return (
        b"fedfilter/secaggplus/survivors/v3"
        + run_id.to_bytes(8, "big")
        + len(round_id.encode()).to_bytes(4, "big")
        + round_id.encode()
        + len(parameters).to_bytes(4, "big")
        + parameters
        + len(ids).to_bytes(4, "big")
        + b"".join(i.to_bytes(8, "big") for i in ids)
    )


def _reference_tag(ss2: bytes, *, run_id, round_id, survivors, src, dst, parameters) -> bytes:
    body = _reference_message(run_id=run_id, round_id=round_id, survivors=survivors, parameters=parameters)
    body += src.to_bytes(8, "big") + dst.to_bytes(8, "big")
    return hmac.new(hkdf_sha256(ss2, MAC_KEY_INFO), body, hashlib.sha256).digest()


ME, SURVIVORS, RUN, ROUND = 1, (1, 2, 3, 4, 5, 6), 7, "3"
PARAMS = round_parameters({"noise-multiplier": 1.0, "min-reports": 4}, {"threshold": 4, "share_num": 6})


def _shown(n_signers: int, **over):
    """Device ME's view: the ss2 key it shares with each of its neighbours 2..6, and the tags the first
    ``n_signers`` of them addressed to it on SURVIVORS (made with the reference, not the code)."""
    keys = {nid: channel_key() for nid in range(2, 7)}
    where = {"run_id": RUN, "round_id": ROUND, "survivors": SURVIVORS, "parameters": PARAMS, **over}
    signers = list(keys)[:n_signers]
    tags = [_reference_tag(keys[nid], **where, src=nid, dst=ME) for nid in signers]
    return keys, signers, tags


def check(keys, signers, tags, threshold, *, survivors=SURVIVORS, run_id=RUN, round_id=ROUND, parameters=PARAMS):
    msg = survivors_message(run_id=run_id, round_id=round_id, survivors=survivors, parameters=parameters)
    return check_tags(msg, me=ME, keys=keys, signers=signers, tags=tags, threshold=threshold)[0]


def test_a_tag_is_hmac_sha256_of_the_set_run_round_src_and_dst_under_the_pairs_mac_key():
    ss2 = channel_key()
    cases = [(5, 9, 7, "3", [9, 5, 2], PARAMS), (2**64 - 1, 0, 2**64 + 3, "", [], b"")]
    for src, dst, run_id, round_id, survivors, params in cases:
        msg = survivors_message(run_id=run_id, round_id=round_id, survivors=survivors, parameters=params)
        where = {"run_id": run_id % 2**64, "round_id": round_id, "survivors": survivors, "parameters": params}
        assert msg == _reference_message(**where)
        assert survivors_tag(ss2, msg, src=src, dst=dst) == _reference_tag(ss2, **where, src=src, dst=dst)


@pytest.mark.parametrize("threshold", [2, 3, 6])
def test_threshold_minus_one_neighbours_tags_pass_and_one_fewer_fails(threshold):
    """The device counts itself (it authenticated the set itself): ``threshold - 1`` neighbours suffice."""
    assert check(*_shown(threshold - 1), threshold) == []
    (problem,) = check(*_shown(threshold - 2), threshold)
    assert f"{threshold - 2} neighbours authenticated" in problem and f"threshold {threshold}" in problem


def test_a_tag_on_another_set_round_run_or_parameters_is_refused():
    other_params = round_parameters({"noise-multiplier": 0.1, "min-reports": 4}, {"threshold": 4, "share_num": 6})
    others = ({"survivors": (1, 2, 3, 4, 5)}, {"round_id": "4"}, {"round_id": "31"}, {"run_id": RUN + 1})
    for other in (*others, {"parameters": other_params}):
        problems = check(*_shown(3, **other), 4)
        assert sum("tag on the survivor set is invalid" in p for p in problems) == 3, other
        assert "0 neighbours authenticated" in problems[-1]


def test_a_tag_for_another_destination_or_from_another_source_is_refused():
    """Under the pair's own key: a tag 2 made for 9 shown to ME as 2's; 2's tag for ME shown as 3's
    (same key); ME's own tag for 2 reflected back to ME as 2's (the pair's key is the same both ways)."""
    keys, signers, tags = _shown(2)
    k2 = keys[2]
    where = {"run_id": RUN, "round_id": ROUND, "survivors": SURVIVORS, "parameters": PARAMS}
    redirected = _reference_tag(k2, **where, src=2, dst=9)
    reflected = _reference_tag(k2, **where, src=ME, dst=2)
    for tag in (redirected, reflected):
        assert "node 2's tag on the survivor set is invalid" in check(keys, [2, 3], [tag, tags[1]], 3)[0]
    assert "node 3's tag" in check({**keys, 3: k2}, [2, 3], [tags[0], tags[0]], 3)[0]


def test_a_tag_under_any_key_but_the_mac_key_is_refused():
    """The pairwise key itself, its HKDF under the other tags (share ciphertexts, sealed certificates),
    the pair's mask key (from ``sk1``, which the coordinator learns for dropped nodes) and a key of the
    coordinator's own: none makes a tag the device accepts."""
    keys, signers, tags = _shown(3)
    body = _reference_message(run_id=RUN, round_id=ROUND, survivors=SURVIVORS, parameters=PARAMS)
    body += (2).to_bytes(8, "big")
    body += ME.to_bytes(8, "big")
    k2 = keys[2]
    wrong = [
        k2,
        base64.urlsafe_b64decode(k2),
        hkdf_sha256(k2, b"fedfilter/secaggplus/share-aead/aes256gcm/v1"),
        hkdf_sha256(k2, b"fedfilter/secaggplus/certificate-seal/v2"),
        hkdf_sha256(channel_key(), MAC_KEY_INFO),  # another pair's (e.g. the mask key's) derivation
        os.urandom(32),
    ]
    for key in wrong:
        forged = hmac.new(key, body, hashlib.sha256).digest()
        problems = check(keys, signers, [forged, *tags[1:]], 4)
        assert problems[0] == "node 2's tag on the survivor set is invalid." and "below the threshold" in problems[1]


def test_the_same_neighbour_shown_twice_counts_once():
    keys, signers, tags = _shown(2)
    problems = check(keys, signers + signers[:1], tags + tags[:1], 4)
    assert problems == [
        f"the survivor-set tag signers repeat node ids [{signers[0]}].",
        "2 neighbours authenticated this device's survivor set (3 with itself), below the threshold 4.",
    ]


def test_tags_naming_the_device_itself_strangers_or_malformed_are_refused():
    keys, signers, tags = _shown(3)
    own = _reference_tag(keys[2], run_id=RUN, round_id=ROUND, survivors=SURVIVORS, parameters=PARAMS, src=ME, dst=ME)
    assert any(f"names this device ({ME})" in p for p in check({**keys, ME: keys[2]}, [ME, *signers], [own, *tags], 4))
    assert any("node 99, not a neighbour" in p for p in check(keys, [99, *signers], [tags[0], *tags], 4))
    for bad in ("x", tags[1][:-1], tags[1] + b"\0", None):
        assert any("node 3's tag" in p for p in check(keys, signers, [tags[0], bad, tags[2]], 4)), bad
    assert "must be a list of node ids" in check(keys, "2,3", tags, 2)[0]
    assert "must be a list of node ids" in check(keys, [2, True], tags[:2], 2)[0]
    assert "as long as the 3 signers" in check(keys, signers, tags[:2], 2)[0]
    assert "as long as the 3 signers" in check(keys, signers, None, 2)[0]


def test_the_authenticated_message_is_the_set_not_the_order():
    a = survivors_message(run_id=7, round_id="3", survivors=[3, 1, 2], parameters=PARAMS)
    assert a == survivors_message(run_id=7, round_id="3", survivors=[1, 2, 3], parameters=PARAMS)
    assert a != survivors_message(run_id=7, round_id="3", survivors=[1, 2], parameters=PARAMS)
    assert a != survivors_message(run_id=7, round_id="31", survivors=[1, 2, 3], parameters=PARAMS)
    assert a != survivors_message(run_id=7, round_id="3", survivors=[1, 2, 3], parameters=PARAMS[:-1] + b"\0")


def test_the_parameters_digest_is_the_values_received_not_their_order():
    """Equal records in any key order give one digest; any value, its type, a key or the record it sits
    in changes it (the coordinator cannot give two devices different requests under one digest)."""
    request, setup = {"noise-multiplier": 1.0, "clip": 0.5, "min-reports": 4}, {"threshold": 4, "share_num": 7}
    base = round_parameters(request, setup)
    assert base == round_parameters(dict(reversed(list(request.items()))), setup)
    assert len(base) == 32
    for changed in (
        round_parameters({**request, "noise-multiplier": 0.5}, setup),
        round_parameters({**request, "clip": 1}, setup),  # the same number, as an int
        round_parameters({**request, "min-reports": 5}, setup),
        round_parameters(request, {**setup, "share_num": 9}),
        round_parameters({**request, "threshold": 4}, {"share_num": 7}),  # a key moved to the other record
        round_parameters(request),
    ):
        assert changed != base


def test_the_tags_verified_are_returned():
    keys, signers, tags = _shown(3)
    msg = survivors_message(run_id=RUN, round_id=ROUND, survivors=SURVIVORS, parameters=PARAMS)
    bad = [tags[0], b"x" * 32, tags[2]]
    problems, tagged = check_tags(msg, me=ME, keys=keys, signers=signers, tags=bad, threshold=2)
    assert tagged == {signers[0], signers[2]}
    assert problems == [f"node {signers[1]}'s tag on the survivor set is invalid."]


# --- unmask lists -------------------------------------------------------------------------------
HOLDERS, SIGNED = {1, 2, 3, 4, 5}, {1, 2, 3, 4}


def lists(active, dead, me=1, threshold=3, tagged=SIGNED - {1}):
    return check_unmask_lists(
        me=me, active=active, dead=dead, holders=HOLDERS, survivors=SIGNED, tagged=tagged, threshold=threshold
    )


def test_honest_unmask_lists_pass():
    assert lists([1, 2, 3, 4], [5]) == []
    assert lists([1, 2, 3], []) == []  # a subset is no leak (the unmask fails for lack of shares)


def test_an_active_node_whose_own_tag_was_not_shown_gets_no_seed_share():
    """Node 4 is a survivor the device authenticated, but the device never verified 4's own tag on the
    set and the parameters: 4 may have been told another request, so its report is not unmasked here."""
    (problem,) = lists([1, 2, 3, 4], [5], tagged={2, 3})
    assert "nodes [4] are listed active but this device was not shown their own tag" in problem
    assert lists([1, 2, 3], [], tagged={2, 3}) == []


@pytest.mark.parametrize(
    "active, dead, words",
    [
        ([1, 2, 3, 4], [5, 4], "listed both active and dropped"),
        ([1, 2, 3, 4, 4], [5], "repeats node ids [4]"),
        ([1, 2, 3, 4], [5, 5], "repeats node ids [5]"),
        ([2, 3, 4], [5, 1], "this device (1) is listed as dropped"),
        ([2, 3, 4], [5], "this device (1) is not listed as active"),
        ([1, 2, 3, 4, 6], [5], "nodes [6] are not neighbours"),
        ([1, 2, 3, 4], [5, 7], "nodes [7] are not neighbours"),
        ([1, 2, 3, 4, 5], [], "nodes [5] are listed active but are not in the authenticated survivor set"),
        ([1, 2, 3], [4, 5], "nodes [4] are listed dropped but are in the authenticated survivor set"),
        ([1, 2], [5], "2 active nodes, below the threshold 3"),
        ("1,2", [5], "active node ids must be a list"),
        ([1, True], [5], "active node ids must be a list"),
        ([1, -2], [5], "active node ids must be a list"),
        ([1, 2**64], [5], "active node ids must be a list"),
    ],
)
def test_each_unmask_list_problem_is_named(active, dead, words):
    problems = lists(active, dead)
    assert any(words in p for p in problems), problems


def test_no_lists_reveal_both_kinds_of_share_of_any_node():
    """Brute force over every pair of lists drawn from 6 ids: whenever the checks pass, no node is in
    both lists and the device itself is active (so it never hands out both kinds for one node)."""
    ids = [1, 2, 3, 4, 5, 6]
    subsets = [list(c) for r in range(0, 5) for c in itertools.combinations(ids, r)]
    for active in subsets:
        for dead in subsets:
            if lists(active, dead, threshold=1) == []:
                assert not set(active) & set(dead) and 1 in active and 1 not in dead
                assert set(active) <= SIGNED and not set(dead) & SIGNED


def test_node_id_lists():
    assert check_node_ids("x", [0, 2**64 - 1]) == []
    assert check_node_ids("x", [3, 3, 4, 4]) == ["x repeats node ids [3, 4]."]
    assert check_node_ids("x", None) == ["x must be a list of node ids. Found None."]


# --- SecAgg+ parameters at their boundaries ------------------------------------------------------
def state(**over):
    base = {"target_range": 2**24, "clipping_range": 2.0**23, "mod_range": 2**32, "max_weight": 1.0}
    base.update({"sample_num": 10, "threshold": 6, "share_num": 10})
    base.update(over)
    return base


def test_threshold_must_exceed_half_the_share_count_exactly_at_the_pigeonhole_bound():
    for k in range(1, 40):
        for t in range(1, k + 1):
            two_disjoint_groups = 2 * t <= k  # the reference: room for two disjoint t-subsets of k
            problems = check_secagg_state(state(sample_num=k, share_num=k, threshold=t), min_reports=1)
            assert any("must exceed half of share_num" in p for p in problems) == two_disjoint_groups, (k, t)


@pytest.mark.parametrize("m, ok", [(2**32, True), (2**31, True), (2**33, False), (2**62, False), (2**64, False)])
def test_mod_range_up_to_flowers_largest(m, ok):
    assert MODULUS_RANGE == 2**32
    problems = check_secagg_state(state(mod_range=m, target_range=2**20, clipping_range=2.0**19), min_reports=1)
    assert (problems == []) == ok, problems
    if not ok:
        assert any("mod_range must be a power of two <= 2**32" in p and str(m) in p for p in problems)


@pytest.mark.parametrize(
    "over, words",
    [
        ({"share_num": 11}, "share_num 11 exceeds sample_num 10"),
        ({"share_num": 0}, "share_num must be an integer >= 1"),
        ({"share_num": True}, "share_num must be an integer >= 1"),
        ({"share_num": None}, "share_num must be an integer >= 1"),
        ({"threshold": 5}, "threshold 5 must exceed half of share_num 10"),
    ],
)
def test_share_count_problems_are_named(over, words):
    problems = check_secagg_state(state(**over), min_reports=1)
    assert any(words in p for p in problems), problems


def test_the_smallest_sound_settings_pass():
    assert check_secagg_state(state(share_num=11, sample_num=11, threshold=6), min_reports=6) == []
    assert check_secagg_state(state(share_num=3, sample_num=3, threshold=2), min_reports=2) == []
    (one,) = check_secagg_state(state(share_num=1, sample_num=1, threshold=1), min_reports=1)
    assert "sample_num and share_num must be >= 2" in one
    # Two genuine devices: each sum holds both reports (t = 2); a device that reads the sum knowing its own
    # noise is a colluder, and with secagg-colluders 1 the rule needs t >= 3 > 2 nodes.
    assert check_secagg_state(state(share_num=2, sample_num=2, threshold=2), min_reports=2) == []


def test_the_coordinators_graphs_pass_the_whole_device_check():
    """Every graph the coordinator's ``round_graph`` picks (the sparse default and Flower's full graph)
    passes the default device's whole ``check_secagg_state``, ``2 t > k`` included, with Flower's
    quantization settings for that many nodes; so a default device serves a default coordinator."""
    checked = 0
    for n in [*range(3, 80), 100, 200, 500, 1000]:
        settings = secaggplus_settings(n)
        base = state(
            target_range=settings["quantization_range"],
            clipping_range=settings["clipping_range"],
            mod_range=settings["modulus_range"],
        )
        for m in sorted({1, 2, 3, 4, 6, 12, n // 3, n // 2, -(-n // 2), n - 1, n} - {0}):
            for shares in (AUTO_SHARES, 1.0):
                try:
                    graph = round_graph(n, m, shares)
                except ValueError:  # min_reports SecAgg+ cannot guarantee among n: the run is refused
                    continue
                if graph.threshold > n:
                    continue  # fewer sampled than min_reports: Flower halts after setup
                k, t = graph.num_shares, graph.threshold
                assert 2 * t > k, (n, m, shares, k, t)
                problems = check_secagg_state({**base, "sample_num": n, "share_num": k, "threshold": t}, m)
                assert problems == [], (n, m, shares, k, t, problems)
                checked += 1
    assert checked > 1000


# --- exactly `threshold` neighbours: served --------------------------------------------------------
def test_a_device_with_exactly_threshold_neighbours_trains(tmp_path, monkeypatch):
    """Three devices, threshold 2; the third drops out after sending its keys but before sharing them:
    the other two each hold one neighbour's shares plus their own, exactly the threshold, and train.
    (Flower's workflow then lists the third as dropped to both, whose shares they never held: the
    unmask refuses, the round is not released, as Flower's own client would fail there too.)"""
    n, t = 3, 2
    gone = node_id(2)
    result = run_round(
        tmp_path, monkeypatch, n, threshold=t, drop=lambda stage, nid: stage == Stage.SHARE_KEYS and nid == gone
    )
    assert sorted(result.trainer.calls) == [node_id(0), node_id(1)]
    for i in (0, 1):
        records, _, _ = ledger_records(tmp_path, i)
        assert [r.status for r in records] == ["contributed"]
