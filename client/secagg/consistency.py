"""The device's half of SecAgg+ against a coordinator that lies about drop-outs.

Flower's SecAgg+ is the semi-honest protocol of Bell et al. (CCS 2020): in its unmask stage a node
answers with a share of the private-mask seed of every node the coordinator calls active and a share
of the masking key ``sk1`` of every node it calls dropped, unchecked. A coordinator that names one
node both active and dropped (or tells two groups of neighbours different stories) gathers both
kinds of share and strips every mask off that node's single report. The malicious-server variant
(Bonawitz et al., CCS 2017, "Practical Secure Aggregation", Round 3 ConsistencyCheck of the
actively secure protocol, Figure 4; carried over to SecAgg+'s neighbourhoods by Bell et al. 2020
for the malicious case) adds what this module implements:

* a per-round Ed25519 signing key whose public half reaches each neighbour sealed under the
  pairwise channel key of Flower's share-keys stage (``seal_signing_key``: the coordinator relays
  it but cannot swap it without also swapping the channel's key, i.e. without playing that
  neighbour itself, which is the Sybil case: issue 22 item 2);
* a consistency round: each device signs, once per round, the survivor set it is told
  (``survivors_message``), and before it reveals any share it checks that at least ``threshold``
  of its neighbours (itself included, as Flower counts) signed that same set, every signature
  shown to it valid (``check_signatures``);
* unmask lists checked against that set (``check_unmask_lists``): no repeats, active and dropped
  disjoint, both inside the neighbours whose shares it holds, itself active, the active ones signed
  survivors and the dropped ones not.

* peer-key pinning (cross-silo, an owner setting): each device's long-term Ed25519 identity signs
  its round keys (Flower's ``pk1``, ``pk2`` and the signing key; ``certify``), sent inside the
  sealed message; a device with pinned peers refuses, before training, a neighbour whose keys no
  pinned identity certified, and two neighbours with one identity (``check_certificate``), so a
  coordinator cannot play a neighbour itself.

Each device then reveals, for every node, one kind of share only, and all devices that reveal agree
on one survivor set. Together with ``2 * threshold > share_num`` (``secagg_grid.check_secagg_state``:
two disjoint groups of ``threshold`` holders of one node's shares cannot exist) no coordinator that
talks to genuine devices collects both kinds of share of any node.

Pure protocol logic over bytes and ints (``cryptography`` only, no Flower, no I/O): the Flower glue
is ``client/secagg/mod.py``; the coordinator's side is ``coordinator/secagg_consistency_round.py``.
"""

from __future__ import annotations

import base64
import struct
from collections.abc import Iterable, Mapping
from functools import lru_cache
from typing import cast

from cryptography.exceptions import InvalidSignature
from cryptography.fernet import Fernet, InvalidToken
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from fedfilter.checks import int_in

__all__ = [
    "new_signing_key",
    "public_key_of",
    "seal_signing_key",
    "open_signing_key",
    "survivors_message",
    "sign_survivors",
    "check_signatures",
    "check_unmask_lists",
    "check_node_ids",
    "certify",
    "check_certificate",
]

# The ConfigRecord that carries this protocol's fields beside Flower's "secaggplus_configs" (Flower's
# own record is type-checked stage by stage, so extra keys go here), and the stage name of the
# consistency round (sent between collect-masked-vectors and unmask, in Flower's configs record).

_BIND_TAG = b"fedfilter/secaggplus/signing-key/v1"
_SIGN_TAG = b"fedfilter/secaggplus/survivors/v1"
_CERT_TAG = b"fedfilter/secaggplus/identity-certificate/v1"
_KEY_BYTES = 32
_CERT_BYTES = 32 + 64  # identity public key, Ed25519 signature
_MAX_NODE_ID = 2**64 - 1  # Flower's node ids are uint64
_CHANNELS = 4096  # sealed-key channels a process keeps: k per device (a simulation runs many devices)


def new_signing_key() -> bytes:
    """A fresh Ed25519 private key (32 raw bytes), one per SecAgg+ round."""
    return Ed25519PrivateKey.generate().private_bytes(
        serialization.Encoding.Raw, serialization.PrivateFormat.Raw, serialization.NoEncryption()
    )


def public_key_of(private_key: bytes) -> bytes:
    """The raw 32-byte public key of a raw Ed25519 private key."""
    return (
        Ed25519PrivateKey.from_private_bytes(private_key)
        .public_key()
        .public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    )


@lru_cache(maxsize=_CHANNELS)
def _channel(shared_key: bytes) -> Fernet:
    # A key of its own, derived from the pairwise key Flower's share-keys stage agreed (ECDH + HKDF),
    # so this message and Flower's share ciphertexts never share a Fernet key. Cached: the pairwise key
    # is the same both ways, so a device opens its neighbour's token under the channel it sealed its own
    # with (memory only; the pairwise keys themselves sit in Flower's SecAgg+ state).
    derived = HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=_BIND_TAG).derive(shared_key)
    return Fernet(base64.urlsafe_b64encode(derived))


def seal_signing_key(shared_key: bytes, *, src: int, dst: int, public_key: bytes, certificate: bytes = b"") -> bytes:
    """``src``'s signing key for ``dst`` (and its owner's ``certificate``, when pinning is on),
    authenticated and encrypted under their pairwise key."""
    return _channel(shared_key).encrypt(_BIND_TAG + struct.pack(">QQ", src, dst) + public_key + certificate)


def open_signing_key(shared_key: bytes, token: object, *, src: int, dst: int) -> tuple[bytes, bytes] | None:
    """The signing key ``src`` sealed for ``dst`` and the certificate after it (``b""`` if none), or
    ``None`` when the token is not exactly that."""
    if not isinstance(token, bytes):
        return None
    try:
        plain = _channel(shared_key).decrypt(token)
    except (InvalidToken, ValueError, TypeError):
        return None
    head = _BIND_TAG + struct.pack(">QQ", src, dst)
    rest = plain[len(head) :]
    if not plain.startswith(head) or len(rest) not in (_KEY_BYTES, _KEY_BYTES + _CERT_BYTES):
        return None
    return rest[:_KEY_BYTES], rest[_KEY_BYTES:]


# --- peer-key pinning (cross-silo): the owner's long-term identity certifies the round's keys -----
def _certified(*, run_id: int, round_id: str, nid: int, pk1: bytes, pk2: bytes, signing_key: bytes) -> bytes:
    round_bytes = round_id.encode()
    parts = [round_bytes, pk1, pk2, signing_key]
    return _CERT_TAG + struct.pack(">QQ", run_id % 2**64, nid) + b"".join(struct.pack(">I", len(p)) + p for p in parts)


def certify(
    identity_key: bytes, *, run_id: int, round_id: str, nid: int, pk1: bytes, pk2: bytes, signing_key: bytes
) -> bytes:
    """The owner's identity public key and its signature on this round's keys of node ``nid``: Flower's
    two SecAgg+ public keys and the round's signing key (64 + 32 bytes)."""
    identity = Ed25519PrivateKey.from_private_bytes(identity_key)
    body = _certified(run_id=run_id, round_id=round_id, nid=nid, pk1=pk1, pk2=pk2, signing_key=signing_key)
    return public_key_of(identity_key) + identity.sign(body)


def check_certificate(
    certificate: bytes,
    pinned: frozenset[bytes],
    *,
    run_id: int,
    round_id: str,
    nid: int,
    pk1: bytes,
    pk2: bytes,
    signing_key: bytes,
) -> tuple[bytes | None, str]:
    """The pinned identity that certified node ``nid``'s keys, or ``None`` and why not."""
    if len(certificate) != _CERT_BYTES:
        return None, f"node {nid} sent no certificate of a pinned key."
    identity, signature = certificate[:_KEY_BYTES], certificate[_KEY_BYTES:]
    if identity not in pinned:
        return None, f"node {nid}'s identity key {identity.hex()} is not pinned."
    body = _certified(run_id=run_id, round_id=round_id, nid=nid, pk1=pk1, pk2=pk2, signing_key=signing_key)
    try:
        Ed25519PublicKey.from_public_bytes(identity).verify(signature, body)
    except InvalidSignature:
        return None, f"node {nid}'s certificate does not sign the keys this device was given for it."
    return identity, ""


def survivors_message(*, run_id: int, round_id: str, survivors: Iterable[int]) -> bytes:
    """The bytes a device signs: a domain tag, the run, the round (Flower's group id) and the sorted set."""
    ids = sorted(set(int(n) for n in survivors))
    round_bytes = round_id.encode()
    return (
        _SIGN_TAG
        + struct.pack(">QI", run_id % 2**64, len(round_bytes))
        + round_bytes
        + struct.pack(f">I{len(ids)}Q", len(ids), *ids)
    )


def sign_survivors(private_key: bytes, message: bytes) -> bytes:
    return Ed25519PrivateKey.from_private_bytes(private_key).sign(message)


def check_signatures(
    message: bytes, keys: Mapping[int, bytes], signatures: Mapping[int, object], threshold: int
) -> list[str]:
    """Problems with the consistency round's signatures as shown to a device.

    ``keys`` are the signing keys of the device's neighbours (itself included) that it verified
    itself; every signature shown must be by one of them and valid on ``message``; at least
    ``threshold`` distinct neighbours must have signed.
    """
    problems = []
    valid = 0
    for nid, sig in signatures.items():
        if nid not in keys:
            problems.append(f"a signature names node {nid}, not a neighbour whose signing key this device holds.")
            continue
        try:
            if not isinstance(sig, bytes):
                raise InvalidSignature
            Ed25519PublicKey.from_public_bytes(keys[nid]).verify(sig, message)
        except InvalidSignature:
            problems.append(f"node {nid}'s signature on the survivor set is invalid.")
            continue
        valid += 1
    if valid < threshold:
        problems.append(f"{valid} neighbours signed this device's survivor set, below the threshold {threshold}.")
    return problems


def check_node_ids(name: str, ids: object) -> list[str]:
    """Problems with a list of node ids sent by the coordinator: not a list of uint64, or repeats."""
    if not isinstance(ids, list) or any(not int_in(n, 0, _MAX_NODE_ID) for n in ids):
        return [f"{name} must be a list of node ids. Found {ids!r}."]
    if len(set(ids)) != len(ids):
        repeats = sorted({n for n in ids if ids.count(n) > 1})
        return [f"{name} repeats node ids {repeats}."]
    return []


def check_unmask_lists(
    *,
    me: int,
    active: object,
    dead: object,
    holders: Iterable[int],
    survivors: Iterable[int],
    threshold: int,
) -> list[str]:
    """Problems with an unmask request; empty when the device may reveal its shares.

    ``holders``: the nodes whose shares this device holds (itself and the neighbours whose share
    ciphertexts it received: the set live at the collect stage). ``survivors``: the set it signed.
    """
    problems = check_node_ids("active node ids", active) + check_node_ids("dropped node ids", dead)
    if problems:
        return problems
    active, dead = cast(list[int], active), cast(list[int], dead)  # checked above
    mine, signed = set(holders), set(survivors)
    if both := sorted(set(active) & set(dead)):
        problems.append(f"nodes {both} are listed both active and dropped.")
    if me in dead:
        problems.append(f"this device ({me}) is listed as dropped.")
    if me not in active:
        problems.append(f"this device ({me}) is not listed as active.")
    if outside := sorted((set(active) | set(dead)) - mine):
        problems.append(f"nodes {outside} are not neighbours whose shares this device holds.")
    if not_signed := sorted(set(active) - signed):
        problems.append(f"nodes {not_signed} are listed active but are not in the signed survivor set.")
    if signed_dead := sorted(set(dead) & signed):
        problems.append(f"nodes {signed_dead} are listed dropped but are in the signed survivor set.")
    if len(active) < threshold:
        problems.append(f"{len(active)} active nodes, below the threshold {threshold}.")
    return problems
