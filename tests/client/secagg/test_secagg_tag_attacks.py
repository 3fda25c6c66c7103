"""A coordinator that attacks the consistency round's MACs (survivor-set tags instead of
Ed25519 signatures), played against real devices (``helpers.secagg_attacks``).

Each attack rewrites the tags the unmask message shows a device and must make every honest device
refuse with nothing revealed: no unmask reply carries a share, and no victim's report can be read.

A coordinator does not hold the pairs' ``ss2`` keys, so the tags it can show are the devices' own
(redirected, reflected, replayed from another round, repeated) or tags under keys it might get hold
of. To test each binding on its own, some attacks are played with the real keys read out of the
devices' contexts (what a key reuse across runs or rounds, or a derivation under the wrong key,
would hand a coordinator): the tag is right in every respect but the one attacked, which each
test checks by making the correct tag with the same construction first.
"""

from __future__ import annotations

import base64
import hashlib
import hmac

import pytest
from flwr.client.mod.secure_aggregation.secaggplus_mod import SecAggPlusState
from flwr.common.secure_aggregation.secaggplus_constants import RECORD_KEY_STATE, Key, Stage
from helpers.crypto_reference import hkdf_sha256
from helpers.secagg_attacks import Seen, answered, assert_no_single_report, attacker, nid_of, refused, run_attack

from fedfilter.client.secagg.consistency import survivors_message, survivors_tag
from fedfilter.client.secagg.mod import CONSISTENCY_STATE_RECORD
from fedfilter.protocol.secagg.keys import bytes_to_private_key, bytes_to_public_key, generate_shared_key
from fedfilter.protocol.wire import CONSISTENCY_RECORD, CONSISTENCY_STAGE

N = 5  # threshold 3: each device needs two neighbours' tags (it counts itself)
MAC_KEY_INFO = b"fedfilter/secaggplus/survivors-mac-key/v1"


def parameters(seen: Seen, nid: int) -> bytes:
    """The digest of the round's parameters device ``nid`` authenticates (public: the coordinator sent them)."""
    return seen.grid.contexts[nid].state.config_records[CONSISTENCY_STATE_RECORD]["parameters"]


def flower_state(seen: Seen, nid: int) -> SecAggPlusState:
    return SecAggPlusState(**dict(seen.grid.contexts[nid].state.config_records[RECORD_KEY_STATE]))


def issued(seen: Seen) -> dict[tuple[str, int, int], bytes]:
    """Every tag the devices sent in the consistency rounds so far: (round, src, dst) -> tag."""
    out = {}
    for stage, request, reply in seen.log:
        if stage == CONSISTENCY_STAGE and not reply.has_error():
            record = reply.content.config_records["secaggplus_configs"]
            for dst, tag in zip(record["dst"], record["tag"]):
                out[(request.metadata.group_id, int(reply.metadata.src_node_id), dst)] = tag
    return out


def survivors(seen: Seen, nid: int) -> list[int]:
    """The survivor set device ``nid`` was told (and authenticated) in the last consistency round."""
    requests = [q for s, q, r in seen.log if s == CONSISTENCY_STAGE and int(q.metadata.dst_node_id) == nid]
    return list(requests[-1].content.config_records["secaggplus_configs"][Key.ACTIVE_NODE_ID_LIST])


def everyone_refused(seen: Seen, words: str = "") -> None:
    everyone = {nid_of(i) for i in range(N)}
    assert answered(seen, Stage.UNMASK) == set(), "a device revealed its shares"
    assert refused(seen, Stage.UNMASK) == everyone
    assert all(words in r.error.reason for s, q, r in seen.log if s == Stage.UNMASK), words
    assert_no_single_report(seen)


def rewrite_tags(seen: Seen, make):
    """A forge that replaces each tag shown to a device by ``make(seen, msg, signer, shown_tag)``."""

    def forge(stage, msg):
        if stage == Stage.UNMASK:
            record = msg.content.config_records[CONSISTENCY_RECORD]
            record["tag"] = [make(seen, msg, i, tag) for i, tag in zip(record["signer"], record["tag"])]

    return forge


def attack(tmp_path, monkeypatch, make=None, forge=None, rounds=1) -> Seen:
    seen = Seen()
    forge = forge or rewrite_tags(seen, make)
    return run_attack(tmp_path, monkeypatch, N, lambda s: attacker(s, forge), seen=seen, rounds=rounds)


# --- the devices' own tags, shown where they do not belong ---------------------------------------
def test_a_tag_made_for_another_device_is_refused(tmp_path, monkeypatch):
    """Device k is shown, as i's, the tag i made for some j != k (a valid tag of the right set)."""

    def redirected(seen, msg, i, tag):
        k, made = int(msg.metadata.dst_node_id), issued(seen)
        (other, *_) = [t for (g, src, dst), t in made.items() if src == i and dst != k and g == msg.metadata.group_id]
        return other

    everyone_refused(attack(tmp_path, monkeypatch, redirected), "tag on the survivor set is invalid")


def test_a_devices_own_tag_reflected_back_to_it_is_refused(tmp_path, monkeypatch):
    """Device k is shown, as i's, the tag k itself made for i: the pair's key is the same both ways."""

    def reflected(seen, msg, i, tag):
        return issued(seen)[(msg.metadata.group_id, int(msg.metadata.dst_node_id), i)]

    everyone_refused(attack(tmp_path, monkeypatch, reflected), "tag on the survivor set is invalid")


def test_tags_from_the_previous_round_replayed_are_refused(tmp_path, monkeypatch):
    """Two rounds; in the second, each device is shown the tags the same neighbours addressed to it in
    the first."""
    seen = Seen()

    def forge(stage, msg):
        if stage == Stage.UNMASK and msg.metadata.group_id == "2":
            record, k = msg.content.config_records[CONSISTENCY_RECORD], int(msg.metadata.dst_node_id)
            record["tag"] = [issued(seen)[("1", i, k)] for i in record["signer"]]

    run_attack(tmp_path, monkeypatch, N, lambda s: attacker(s, forge), seen=seen, rounds=2)
    first = {int(r.metadata.src_node_id) for s, q, r in seen.log if s == Stage.UNMASK and q.metadata.group_id == "1"}
    assert first == {nid_of(i) for i in range(N)} and answered(seen, Stage.UNMASK) == first  # round 1 served
    second = [r for s, q, r in seen.log if s == Stage.UNMASK and q.metadata.group_id == "2"]
    assert len(second) == N and all("tag on the survivor set is invalid" in r.error.reason for r in second)


# --- tags under the pair's real key, wrong in one respect ------------------------------------------
def true_tag(seen: Seen, msg, i: int, **over) -> bytes:
    """The tag i would make for the unmask message's device under their real ``ss2`` key, with ``over``
    replacing the run, round or survivor set it binds."""
    k = int(msg.metadata.dst_node_id)
    where = {
        "run_id": seen.grid.run.run_id,
        "round_id": msg.metadata.group_id,
        "survivors": survivors(seen, k),
        "parameters": parameters(seen, k),
    }
    message = survivors_message(**{**where, **over})
    return survivors_tag(flower_state(seen, k).ss2_dict[i], message, src=i, dst=k)


@pytest.mark.parametrize(
    "over",
    [{"run_id": 8}, {"round_id": "2"}, {"round_id": "0"}, {"survivors": "one fewer"}, {"survivors": "one more"}],
    ids=["another-run", "next-round", "previous-round", "set-without-a-survivor", "set-with-a-stranger"],
)
def test_a_tag_under_the_real_key_over_another_run_round_or_set_is_refused(tmp_path, monkeypatch, over):
    """What the devices' tags would be if the pair's key were reused in another run or round, or
    over another survivor set (the coordinator telling two groups two stories)."""

    def other(seen, msg, i, tag):
        assert true_tag(seen, msg, i) == tag  # the construction is right but for the one change
        change = dict(over)
        if "survivors" in change:
            told = survivors(seen, int(msg.metadata.dst_node_id))
            change["survivors"] = told[:-1] if over["survivors"] == "one fewer" else [*told, 999]
        return true_tag(seen, msg, i, **change)

    everyone_refused(attack(tmp_path, monkeypatch, other), "tag on the survivor set is invalid")


@pytest.mark.parametrize("which", ["pairwise-key", "fernet-signing-key", "share-aead-key", "mask-key", "mask-mac-key"])
def test_a_tag_under_another_key_of_the_pair_is_refused(tmp_path, monkeypatch, which):
    """HMAC-SHA256 over the right bytes under the pair's other keys: the ``ss2`` key itself, Flower's
    Fernet signing half of it, the share ciphertexts' AES-GCM key, the pair's mask key (from ``sk1``,
    which the coordinator learns for dropped nodes) and the MAC derivation applied to the mask key."""

    def other_key(seen, msg, i, tag):
        k = int(msg.metadata.dst_node_id)
        state = flower_state(seen, k)
        ss2 = state.ss2_dict[i]
        mask = generate_shared_key(
            bytes_to_private_key(state.sk1), bytes_to_public_key(state.public_keys_dict[i][0])
        )  # the pk1 pairwise key: the seed of the pair's masks
        key = {
            "pairwise-key": ss2,
            "fernet-signing-key": base64.urlsafe_b64decode(ss2)[:16],
            "share-aead-key": hkdf_sha256(ss2, b"fedfilter/secaggplus/share-aead/aes256gcm/v1"),
            "mask-key": mask,
            "mask-mac-key": hkdf_sha256(mask, MAC_KEY_INFO),
        }[which]
        body = survivors_message(
            run_id=seen.grid.run.run_id,
            round_id=msg.metadata.group_id,
            survivors=survivors(seen, k),
            parameters=parameters(seen, k),
        )
        body += i.to_bytes(8, "big") + k.to_bytes(8, "big")
        assert hmac.new(hkdf_sha256(ss2, MAC_KEY_INFO), body, hashlib.sha256).digest() == tag  # the right key works
        return hmac.new(key, body, hashlib.sha256).digest()

    everyone_refused(attack(tmp_path, monkeypatch, other_key), "tag on the survivor set is invalid")


# --- too few distinct neighbours -------------------------------------------------------------------
def test_the_same_neighbour_shown_twice_counts_once(tmp_path, monkeypatch):
    """Each device is shown ``threshold - 1`` tags, all valid, but the same neighbour's twice (and none
    of the others': their seed shares are withheld too)."""
    seen = Seen()

    def forge(stage, msg):
        if stage == Stage.UNMASK:
            record = msg.content.config_records[CONSISTENCY_RECORD]
            assert len(record["signer"]) == N - 1  # the honest coordinator shows every neighbour's tag
            record["signer"], record["tag"] = [record["signer"][0]] * 2, [record["tag"][0]] * 2

    seen = run_attack(tmp_path, monkeypatch, N, lambda s: attacker(s, forge), seen=seen)
    everyone_refused(seen, "repeat node ids")
    everyone_refused(
        seen, "1 neighbours authenticated this device's survivor set (2 with itself), below the threshold 3"
    )
