"""A coordinator that breaks SecAgg+ (issue 22): the audit's attacks, played against real devices.

Every device is ``ClientApp(mods=[secure_aggregation_mod, individual_filter_mod])`` with its own
budget ledger; the coordinator is the product's ``IndividualFilterStrategy`` whose SecAgg+ workflow
is replaced by an attacker's subclass (``secure_round._MessageApiSecAggPlus``), which forges what
Flower's semi-honest protocol lets a coordinator forge: the unmask lists, the survivor set it shows
each device, the setup's modulus. The attacker keeps every request it sent and every reply it got,
and ``read_single_report`` then does what the audit did: collect both kinds of key share of one
victim, strip all its masks off its masked vector, and compare with the victim's own report (the
test hook on the Skellam sampler, never in a reply). The attacks of the first part fail on the code
before issue 22 (checked by running them against main's ``client/`` and ``coordinator/``); the last
ones play against the consistency round itself, which did not exist before.
"""

from __future__ import annotations

import base64

import numpy as np
import pytest
from flwr.client.mod.secure_aggregation.secaggplus_mod import SecAggPlusState
from flwr.common import bytes_to_ndarray
from flwr.common.secure_aggregation.secaggplus_constants import RECORD_KEY_STATE, Key, Stage
from helpers.secagg_attacks import (
    Seen,
    answered,
    attacker,
    charges,
    configs_of,
    nid_of,
    refused,
    run_attack,
)

from fedfilter.client.secagg.consistency import new_signing_key, public_key_of, seal_signing_key, sign_survivors
from fedfilter.protocol.secagg_grid import secaggplus_settings
from fedfilter.protocol.secagg_keys import bytes_to_private_key, bytes_to_public_key, generate_shared_key
from fedfilter.protocol.secagg_masks import aes_mask_gen
from fedfilter.protocol.secagg_shamir import combine_shares
from fedfilter.protocol.wire import CONSISTENCY_RECORD

CONSISTENCY = "fedfilter_consistency_check"  # the consistency round's stage name (absent before issue 22)


def gathered_shares(seen: Seen, victim: int) -> tuple[list[bytes], list[bytes]]:
    """The victim's shares of its private-mask seed and of ``sk1`` among the unmask replies (Flower
    lists the active ids' seed shares first, then the dropped ids' sk1 shares)."""
    seed_shares, sk1_shares = [], []
    for s, q, r in seen.log:
        if s != Stage.UNMASK or r.has_error():
            continue
        n_active = len(configs_of(q)[Key.ACTIVE_NODE_ID_LIST])
        for index, (nid, share) in enumerate(zip(configs_of(r)[Key.NODE_ID_LIST], configs_of(r)[Key.SHARE_LIST])):
            if nid == victim:
                (seed_shares if index < n_active else sk1_shares).append(share)
    return seed_shares, sk1_shares


def unmask(seen: Seen, victim: int, seed_shares: list[bytes], sk1_shares: list[bytes]) -> list[np.ndarray] | None:
    """The victim's quantized report from its masked vector and both kinds of share, or None when the
    coordinator holds fewer than the threshold of either kind (or no masked vector of it)."""
    setup = {
        int(r.metadata.src_node_id): configs_of(r) for s, q, r in seen.log if s == Stage.SETUP and not r.has_error()
    }
    collect = [
        (q, r)
        for s, q, r in seen.log
        if s == Stage.COLLECT_MASKED_VECTORS and not r.has_error() and r.metadata.src_node_id == victim
    ]
    setup_request = next(q for s, q, r in seen.log if s == Stage.SETUP)
    threshold, mod_range = configs_of(setup_request)[Key.THRESHOLD], configs_of(setup_request)[Key.MOD_RANGE]
    if not collect or len(seed_shares) < threshold or len(sk1_shares) < threshold:
        return None
    (request, reply) = collect[0]
    seed, sk1 = combine_shares(seed_shares), combine_shares(sk1_shares)
    vector = [bytes_to_ndarray(b).astype(np.int64) for b in configs_of(reply)[Key.MASKED_PARAMETERS]]
    shapes = [a.shape for a in vector]
    vector = [v - m for v, m in zip(vector, aes_mask_gen(seed, mod_range, shapes))]
    for peer in configs_of(request)[Key.SOURCE_LIST]:  # the neighbours it added pairwise masks with
        shared = generate_shared_key(bytes_to_private_key(sk1), bytes_to_public_key(setup[peer][Key.PUBLIC_KEY_1]))
        sign = -1 if victim > peer else 1
        vector = [v + sign * m for v, m in zip(vector, aes_mask_gen(shared, mod_range, shapes))]
    return [np.mod(v, mod_range) for v in vector[1:]]  # the first array is Flower's weight factor


def is_report(seen: Seen, victim: int, got: list[np.ndarray]) -> bool:
    q = secaggplus_settings(len(seen.grid.apps))["quantization_range"]
    return all(np.array_equal(g.ravel(), np.mod(a.ravel(), q)) for g, a in zip(got, seen.y[victim]))


def assert_no_single_report(seen: Seen) -> None:
    for victim in seen.y:
        got = unmask(seen, victim, *gathered_shares(seen, victim))
        if got is not None:
            exact = "and read its single report exactly" if is_report(seen, victim, got) else ""
            pytest.fail(f"the coordinator gathered both kinds of key share of node {victim} {exact}")


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
    victim dropped. Before issue 22 (threshold 2) the first group gave the victim's mask-seed shares
    and the second its sk1 shares. Now the threshold is 3 (more than half of 5) and each device needs
    3 neighbours' signatures on the set it was told: the second group has 2."""
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
    """No consistency round: no device signed a survivor set, so every device refuses to unmask."""
    n = 3

    def no_round(workflow, grid, context, state):
        workflow._signatures = {}

    seen = run_attack(tmp_path, monkeypatch, n, lambda s: attacker(s, lambda stage, msg: None, consistency=no_round))
    assert answered(seen, Stage.UNMASK) == set()
    assert all("after this device signed a survivor set" in r.error.reason for s, q, r in seen.log if s == Stage.UNMASK)


def test_signatures_the_coordinator_made_itself_are_refused(tmp_path, monkeypatch):
    n = 3
    forger = new_signing_key()

    def forged_round(workflow, grid, context, state):
        type(workflow).__mro__[1].consistency_stage(workflow, grid, context, state)  # the honest round
        message = b"anything the coordinator likes"
        workflow._signatures = {nid: sign_survivors(forger, message) for nid in workflow._signatures}

    seen = run_attack(
        tmp_path, monkeypatch, n, lambda s: attacker(s, lambda stage, msg: None, consistency=forged_round)
    )
    assert answered(seen, Stage.UNMASK) == set()


def test_a_swapped_signing_key_is_refused_before_training(tmp_path, monkeypatch):
    """The coordinator replaces the sealed signing key one device sent another by one it sealed under a
    key of its own: the receiver cannot open it with the pairwise key and refuses before training."""
    n, victim = 3, nid_of(0)
    fake = seal_signing_key(
        base64.urlsafe_b64encode(bytes(32)), src=nid_of(1), dst=victim, public_key=public_key_of(new_signing_key())
    )

    def forge(stage, msg):
        if stage == Stage.COLLECT_MASKED_VECTORS and int(msg.metadata.dst_node_id) == victim:
            record = msg.content.config_records[CONSISTENCY_RECORD]
            record["sealed"] = [fake if src == nid_of(1) else t for src, t in zip(record["src"], record["sealed"])]

    seen = run_attack(tmp_path, monkeypatch, n, lambda s: attacker(s, forge))
    assert victim in refused(seen, Stage.COLLECT_MASKED_VECTORS)
    assert victim not in seen.y and charges(tmp_path, n)[0] == 0.0


def test_a_coordinator_that_shows_fewer_than_threshold_signatures_gets_no_share(tmp_path, monkeypatch):
    """The coordinator holds signatures back so that each device is shown one fewer than its
    threshold (the honest coordinator shows exactly the threshold's worth since issue 23): every
    device refuses, though each signature it was shown is valid."""
    n = 3

    def forge(stage, msg):
        if stage == Stage.UNMASK:
            ctx = seen.grid.contexts[int(msg.metadata.dst_node_id)]
            t = int(ctx.state.config_records[RECORD_KEY_STATE]["threshold"])
            record = msg.content.config_records[CONSISTENCY_RECORD]
            record["signer"], record["signature"] = list(record["signer"])[: t - 1], list(record["signature"])[: t - 1]

    seen = Seen()
    seen = run_attack(tmp_path, monkeypatch, n, lambda s: attacker(s, forge), seen=seen)
    assert answered(seen, Stage.UNMASK) == set()
    assert all("below the threshold" in r.error.reason for s, q, r in seen.log if s == Stage.UNMASK)
    assert_no_single_report(seen)
