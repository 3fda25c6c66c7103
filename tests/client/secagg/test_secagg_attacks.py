"""A coordinator that breaks SecAgg+: the audit's attacks, played against real devices.

Every device is ``ClientApp(mods=[secure_aggregation_mod, individual_filter_mod])`` with its own
budget ledger; the coordinator is the product's ``IndividualFilterStrategy`` whose SecAgg+ workflow
is replaced by an attacker's subclass (``secure_round._MessageApiSecAggPlus``), which forges what
Flower's semi-honest protocol lets a coordinator forge: the unmask lists, the survivor set it shows
each device, the setup's modulus. The attacker keeps every request it sent and every reply it got,
and ``assert_no_single_report`` (``helpers.secagg_attacks``) then does what the audit did: collect
both kinds of key share of one victim, strip all its masks off its masked vector, and compare with the
victim's own report (the test hook on the Skellam sampler, never in a reply). The attacks of the first
part fail on the code before the consistency round (checked by running them against main's ``client/`` and
``coordinator/``); the last ones play against the consistency round itself, which did not exist before
(``test_secagg_tag_attacks.py``: against its MACs).
"""

from __future__ import annotations

import base64

import pytest
from flwr.client.mod.secure_aggregation.secaggplus_mod import SecAggPlusState
from flwr.common.secure_aggregation.secaggplus_constants import RECORD_KEY_STATE, Key, Stage
from helpers.secagg_attacks import (
    Seen,
    answered,
    assert_no_single_report,
    attacker,
    charges,
    configs_of,
    gathered_shares,
    is_report,
    nid_of,
    refused,
    run_attack,
    unmask,
)

from fedfilter.client.secagg.consistency import survivors_message, survivors_tag
from fedfilter.client.secagg.mod import CONSISTENCY_STATE_RECORD
from fedfilter.protocol.wire import CONSISTENCY_RECORD

CONSISTENCY = "fedfilter_consistency_check"  # the consistency round's stage name (a later addition)


# --- the attacks --------------------------------------------------------------------------------
def test_the_reader_unmasks_a_report_given_both_kinds_of_share(tmp_path, monkeypatch):
    """The reader itself: after an honest round, the victim's shares as its neighbours hold them (read
    out of their contexts: what a semi-honest device hands over when it is asked for both) unmask its
    report exactly. So a refusal below is what stops the attack, not a broken reader."""
    n, victim = 3, nid_of(0)
    seen = run_attack(tmp_path, monkeypatch, n, lambda s: attacker(s, lambda stage, msg: None))
    assert answered(seen, Stage.UNMASK) == {nid_of(i) for i in range(n)}  # the honest round completes
    assert unmask(seen, victim, *gathered_shares(seen, victim)) is None  # one kind of share per node
    states = [
        SecAggPlusState(**dict(ctx.state.config_records[RECORD_KEY_STATE])) for ctx in seen.grid.contexts.values()
    ]
    seed_shares = [st.rd_seed_share_dict[victim] for st in states]
    sk1_shares = [st.sk1_share_dict[victim] for st in states]
    got = unmask(seen, victim, seed_shares, sk1_shares)
    assert got is not None and is_report(seen, victim, got)


@pytest.mark.parametrize("n", [3, 5])
def test_a_victim_listed_both_active_and_dropped_is_never_unmasked(tmp_path, monkeypatch, n):
    victim = nid_of(0)

    def forge(stage, msg):
        if stage == Stage.UNMASK:
            configs = configs_of(msg)
            configs[Key.DEAD_NODE_ID_LIST] = list(configs[Key.DEAD_NODE_ID_LIST]) + [victim]

    seen = run_attack(tmp_path, monkeypatch, n, lambda s: attacker(s, forge))
    assert_no_single_report(seen)
    assert answered(seen, Stage.UNMASK) == set()  # every device refused: no share of anyone left it
    assert refused(seen, Stage.UNMASK) == {nid_of(i) for i in range(n)}


def test_unmask_lists_with_repeats_are_refused(tmp_path, monkeypatch):
    n = 3

    def forge(stage, msg):
        if stage == Stage.UNMASK:
            configs = configs_of(msg)
            configs[Key.ACTIVE_NODE_ID_LIST] = list(configs[Key.ACTIVE_NODE_ID_LIST]) * 2

    seen = run_attack(tmp_path, monkeypatch, n, lambda s: attacker(s, forge))
    assert_no_single_report(seen)
    assert answered(seen, Stage.UNMASK) == set()


def test_a_device_listed_as_dropped_reveals_nothing(tmp_path, monkeypatch):
    n, victim = 3, nid_of(1)

    def forge(stage, msg):
        if stage == Stage.UNMASK and int(msg.metadata.dst_node_id) == victim:
            configs = configs_of(msg)
            configs[Key.ACTIVE_NODE_ID_LIST] = [i for i in configs[Key.ACTIVE_NODE_ID_LIST] if i != victim]
            configs[Key.DEAD_NODE_ID_LIST] = list(configs[Key.DEAD_NODE_ID_LIST]) + [victim]

    seen = run_attack(tmp_path, monkeypatch, n, lambda s: attacker(s, forge))
    assert victim in refused(seen, Stage.UNMASK)
    assert_no_single_report(seen)


def test_different_survivor_sets_for_different_devices_unmask_no_report(tmp_path, monkeypatch):
    """Five devices: the victim and two others are told everyone survived, the other two that the
    victim dropped. Before the malicious-server checks (threshold 2) the first group gave the victim's mask-seed shares
    and the second its sk1 shares. Now the threshold is 3 (more than half of 5) and each device needs
    3 holders (itself and 2 neighbours' tags) to have authenticated the set it was told: the second
    group has 2 (itself and the other one)."""
    n, victim = 5, nid_of(0)
    group_b = {nid_of(3), nid_of(4)}

    def forge(stage, msg):
        nid = int(msg.metadata.dst_node_id)
        configs = configs_of(msg)
        if nid not in group_b:
            return
        if stage == CONSISTENCY:
            configs[Key.ACTIVE_NODE_ID_LIST] = [i for i in configs[Key.ACTIVE_NODE_ID_LIST] if i != victim]
        if stage == Stage.UNMASK:
            configs[Key.ACTIVE_NODE_ID_LIST] = [i for i in configs[Key.ACTIVE_NODE_ID_LIST] if i != victim]
            configs[Key.DEAD_NODE_ID_LIST] = list(configs[Key.DEAD_NODE_ID_LIST]) + [victim]

    seen = run_attack(tmp_path, monkeypatch, n, lambda s: attacker(s, forge))
    assert_no_single_report(seen)
    assert group_b <= refused(seen, Stage.UNMASK)


@pytest.mark.parametrize("mod_range", [2**64, 2**40])
def test_a_modulus_masking_cannot_use_is_refused_before_any_device_pays(tmp_path, monkeypatch, mod_range):
    """The audit's case: ``mod_range = 2**64`` passed the device's checks, the device trained and paid,
    then the mask generator raised (``2**40``: beyond the largest modulus Flower documents, 2**32,
    refused as well). Protobuf caps a ConfigRecord int below 2**63, so the setup
    message carries it only where messages are not serialized (an in-process grid): the attacker
    writes it into the state the device's setup stage saved, as such a message would."""
    n = 3

    def forge(stage, msg):
        if stage == Stage.COLLECT_MASKED_VECTORS:
            seen.grid.contexts[int(msg.metadata.dst_node_id)].state.config_records[RECORD_KEY_STATE]["mod_range"] = (
                mod_range
            )

    seen = Seen()
    seen = run_attack(tmp_path, monkeypatch, n, lambda s: attacker(s, forge), seen=seen)
    assert refused(seen, Stage.COLLECT_MASKED_VECTORS) == {nid_of(i) for i in range(n)}
    assert all("mod_range" in r.error.reason for s, q, r in seen.log if s == Stage.COLLECT_MASKED_VECTORS)
    assert charges(tmp_path, n) == [0.0] * n  # nothing trained, nothing spent
    assert seen.y == {}


def test_a_forged_share_ciphertext_is_refused_before_any_device_pays(tmp_path, monkeypatch):
    """Flower decrypts the neighbours' share ciphertexts only after the inner handler trained: a
    coordinator that forwards one it made up (over the wire) would have every device pay for a round
    whose masking then fails."""
    n, victim = 3, nid_of(2)

    def forge(stage, msg):
        if stage == Stage.COLLECT_MASKED_VECTORS and int(msg.metadata.dst_node_id) == victim:
            configs = configs_of(msg)
            configs[Key.CIPHERTEXT_LIST] = [b"forged"] + list(configs[Key.CIPHERTEXT_LIST])[1:]

    seen = run_attack(tmp_path, monkeypatch, n, lambda s: attacker(s, forge))
    assert victim in refused(seen, Stage.COLLECT_MASKED_VECTORS)
    assert charges(tmp_path, n)[2] == 0.0 and victim not in seen.y


def test_a_coordinator_that_skips_the_consistency_round_gets_no_share(tmp_path, monkeypatch):
    """No consistency round: no device authenticated a survivor set, so every device refuses to unmask."""
    n = 3

    def no_round(workflow, grid, context, state):
        workflow._tags = {}

    seen = run_attack(tmp_path, monkeypatch, n, lambda s: attacker(s, lambda stage, msg: None, consistency=no_round))
    assert answered(seen, Stage.UNMASK) == set()
    assert all(
        "after this device authenticated a survivor set" in r.error.reason for s, q, r in seen.log if s == Stage.UNMASK
    )


def test_tags_the_coordinator_made_itself_are_refused(tmp_path, monkeypatch):
    """Tags under a pairwise key of the coordinator's own (the right format, the right set, run, round,
    source and destination: all it can get right without the pair's ``ss2`` key)."""
    n = 3
    own_key = base64.urlsafe_b64encode(bytes(range(32)))

    def forged_round(workflow, grid, context, state):
        type(workflow).__mro__[1].consistency_stage(workflow, grid, context, state)  # the honest round
        group = str(context.state.config_records["config"]["current_round"])
        # The round's parameters are public to the coordinator: it digests them as a device does.
        parameters = seen.grid.contexts[nid_of(0)].state.config_records[CONSISTENCY_STATE_RECORD]["parameters"]
        message = survivors_message(
            run_id=seen.grid.run.run_id, round_id=group, survivors=state.active_node_ids, parameters=parameters
        )
        workflow._tags = {
            dst: {src: survivors_tag(own_key, message, src=src, dst=dst) for src in tags}
            for dst, tags in workflow._tags.items()
        }

    seen = Seen()
    seen = run_attack(
        tmp_path, monkeypatch, n, lambda s: attacker(s, lambda stage, msg: None, consistency=forged_round), seen=seen
    )
    assert answered(seen, Stage.UNMASK) == set() and refused(seen, Stage.UNMASK) == {nid_of(i) for i in range(n)}
    assert all("tag on the survivor set is invalid" in r.error.reason for s, q, r in seen.log if s == Stage.UNMASK)


def test_a_swapped_pk2_the_mac_keys_source_is_refused_before_training(tmp_path, monkeypatch):
    """The MAC key of a pair comes from their ``pk2`` agreement. A coordinator that swaps one device's
    ``pk2`` for its own key (so that it would share the MAC key with the victim) breaks the share
    ciphertexts too: the victim cannot read its neighbour's, the neighbour cannot read the victim's, and
    both refuse before training (pinning, on top, ties ``pk2`` to an identity)."""
    n, victim, peer = 3, nid_of(0), str(nid_of(1))
    coordinators = bytes.fromhex("de9edb7d7b7dc1b4d35b61c2ece435373f8343c85b78674dadfc7e146f882b4f")  # RFC 7748 Bob

    def forge(stage, msg):
        if stage == Stage.SHARE_KEYS and int(msg.metadata.dst_node_id) == victim:
            configs_of(msg)[peer] = [configs_of(msg)[peer][0], coordinators]

    seen = run_attack(tmp_path, monkeypatch, n, lambda s: attacker(s, forge))
    assert {victim, nid_of(1)} <= refused(seen, Stage.COLLECT_MASKED_VECTORS)
    reasons = [r.error.reason for s, q, r in seen.log if s == Stage.COLLECT_MASKED_VECTORS and r.has_error()]
    assert all("share ciphertext is not one it sealed for this device" in reason for reason in reasons)
    assert victim not in seen.y and charges(tmp_path, n)[:2] == [0.0, 0.0]


def test_a_coordinator_that_shows_one_tag_fewer_than_needed_gets_no_share(tmp_path, monkeypatch):
    """The coordinator holds tags back so that each device is shown one fewer than the ``threshold - 1``
    it needs besides itself (the honest coordinator shows every neighbour's): every device refuses,
    though each tag it was shown is valid."""
    n = 5  # threshold 3: two tags needed, one shown

    def forge(stage, msg):
        if stage == Stage.UNMASK:
            ctx = seen.grid.contexts[int(msg.metadata.dst_node_id)]
            t = int(ctx.state.config_records[RECORD_KEY_STATE]["threshold"])
            record = msg.content.config_records[CONSISTENCY_RECORD]
            assert len(record["signer"]) == n - 1  # the full graph: every other node's tag
            record["signer"], record["tag"] = list(record["signer"])[: t - 2], list(record["tag"])[: t - 2]

    seen = Seen()
    seen = run_attack(tmp_path, monkeypatch, n, lambda s: attacker(s, forge), seen=seen)
    assert answered(seen, Stage.UNMASK) == set() and refused(seen, Stage.UNMASK) == {nid_of(i) for i in range(n)}
    reasons = [r.error.reason for s, q, r in seen.log if s == Stage.UNMASK]
    assert all("1 neighbours authenticated" in r and "below the threshold 3" in r for r in reasons)
    assert not any("invalid" in r for r in reasons)
    assert all("not shown their own tag" in r for r in reasons)  # and the others' seed shares are withheld
    assert_no_single_report(seen)
