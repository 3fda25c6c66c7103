"""The device's half of SecAgg+ against a coordinator that lies about drop-outs.

Flower's SecAgg+ is the semi-honest protocol of Bell et al. (CCS 2020): in its unmask stage a node
answers with a share of the private-mask seed of every node the coordinator calls active and a share
of the masking key ``sk1`` of every node it calls dropped, unchecked. A coordinator that names one
node both active and dropped (or tells two groups of neighbours different stories) gathers both
kinds of share and strips every mask off that node's single report. The malicious-server variant
(Bonawitz et al., CCS 2017, "Practical Secure Aggregation", Round 3 ConsistencyCheck of the
actively secure protocol, Figure 4; carried over to SecAgg+'s neighbourhoods by Bell et al. 2020
for the malicious case) adds what this module implements:

* a consistency round: each device authenticates, once per round, the survivor set it is told
  together with a digest of the round's parameters as it received them (the fedfilter request and
  the SecAgg+ setup: ``round_parameters``) to each neighbour with a MAC (``survivors_message``,
  ``survivors_tag``: HMAC-SHA256, RFC 2104, over the set, the digest, the run, the round, ``src`` and
  ``dst``, under a key only that pair of devices holds), and before it reveals any share it checks
  that at least ``threshold`` of its neighbours (itself included, as Flower counts) authenticated
  that same set and the same parameters to it, every tag shown to it valid (``check_tags``);
* unmask lists checked against that set (``check_unmask_lists``): no repeats, active and dropped
  disjoint, both inside the neighbours whose shares it holds, itself active, the active ones
  survivors it authenticated and the dropped ones not, and every active neighbour one whose own tag
  it verified. A node's mask-seed share thus leaves a device only if that node itself confirmed the
  survivor set and the parameters it was given: all honest devices that help unmask a report ran
  the same request (the same noise share) and the same graph, which the bound of
  ``protocol/secagg/rule.py`` needs (a coordinator that sent different requests to different devices
  cannot mix them in one sum).

* peer-key pinning (cross-silo, an owner setting): each device's long-term Ed25519 identity signs
  its round keys (Flower's ``pk1`` and ``pk2``; ``certify``), sent sealed for each neighbour under
  the pair's channel (``seal_certificate``: it also hides from the coordinator which identity is
  behind a node); a device with pinned peers refuses, before training, a neighbour whose keys no
  pinned identity certified, and two neighbours with one identity (``check_certificate``), so a
  coordinator cannot play a neighbour itself. Without pinning no sealed message is sent at all.

Each device then reveals, for every node, one kind of share only, and all devices that reveal agree
on one survivor set. Together with ``2 * threshold > share_num`` (``grid.check_secagg_state``:
two disjoint groups of ``threshold`` holders of one node's shares cannot exist) no coordinator that
talks to genuine devices collects both kinds of share of any node.

The MAC key, and why a MAC is enough. Flower's ``secaggplus_mod`` (flwr 1.41, 1.42) makes two key
pairs per round at setup: ``sk1``/``pk1``, whose pairwise keys seed the pairwise masks, and
``sk2``/``pk2``, whose pairwise keys (``ss2_dict``, ``generate_shared_key(sk2, pk2 of the
neighbour)``) encrypt the share ciphertexts of the share-keys stage. ``sk1`` is Shamir-shared
(``create_shares(state.sk1, ...)``) and its shares are revealed to the coordinator for every node
it lists as dropped (``_unmask``: ``sk1_share_dict[nid] for nid in dead_nids``), so the coordinator
can learn a dropped node's ``sk1`` and every mask key it agreed. ``sk2`` is never shared, sent or
revealed. The MAC key of a pair is therefore derived from their ``ss2`` key, by HKDF-SHA256
(RFC 5869) under its own info tag (``_MAC_KEY_TAG``): it is neither the share-encryption key nor
the certificate channel's key nor a mask key, and learning a MAC key teaches nothing about them.
Before, a device's per-round Ed25519 signing key reached each neighbour only sealed under the pair's
``ss2`` key: whoever knows that key (a coordinator that played one side of the pair's share-keys
stage itself, the Sybil case, which pinning refuses) could seal a signing key of
its own there and sign any set; whoever does not can forge neither that nor a MAC under a key
derived from it. The forgers are the same. MACs lose only third-party verifiability (a tag convinces
only its ``dst``), which no device uses: each verifies only the tags its own neighbours addressed to
it. The tag binds the run id, the round (Flower's group id), the sorted survivor set, ``src`` and
``dst``: a tag is not accepted in another run or round, for another set, by another destination, or
reflected back to its maker (the pair's key is the same both ways). A device counts itself without a tag of its own: it
reaches ``check_tags`` only after it authenticated exactly that set itself (before, the coordinator
showed it its own signature, which any coordinator could always do), so it needs ``threshold - 1``
valid tags from distinct neighbours.

Pure protocol logic over bytes and ints (``cryptography`` only, no Flower, no I/O): the Flower glue
is ``client/secagg/mod.py``; the coordinator's side is ``coordinator/secagg/consistency.py``.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import struct
from collections.abc import Iterable, Mapping
from functools import lru_cache
from typing import cast

from cryptography.exceptions import InvalidSignature
from cryptography.fernet import Fernet, InvalidToken
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives import hmac as crypto_hmac
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from fedfilter.checks import int_in

__all__ = [
    "public_key_of",
    "seal_certificate",
    "open_certificate",
    "round_parameters",
    "survivors_message",
    "survivors_tag",
    "check_tags",
    "check_unmask_lists",
    "check_node_ids",
    "certify",
    "check_certificate",
]

# Domain tags. Changing one changes what it tags: both sides of a federation must run the same version.
_SEAL_TAG = b"fedfilter/secaggplus/certificate-seal/v2"  # HKDF info of the certificate channel, and its header
_MAC_KEY_TAG = b"fedfilter/secaggplus/survivors-mac-key/v1"  # HKDF info of a pair's MAC key
_SURVIVORS_TAG = b"fedfilter/secaggplus/survivors/v3"  # the first bytes of every MAC'd message
_PARAMETERS_TAG = b"fedfilter/secaggplus/round-parameters/v1"  # the first bytes of the digested parameters
_CERT_TAG = b"fedfilter/secaggplus/identity-certificate/v2"
_KEY_BYTES = 32
_TAG_BYTES = 32  # HMAC-SHA256
_CERT_BYTES = 32 + 64  # identity public key, Ed25519 signature
_MAX_NODE_ID = 2**64 - 1  # Flower's node ids are uint64
# Derived keys a process keeps (memory only): k per device, and a simulation runs many devices. The pairwise
# keys they come from sit in Flower's in-memory SecAgg+ state anyway.
_DERIVED = 4096


def public_key_of(private_key: bytes) -> bytes:
    """The raw 32-byte public key of a raw Ed25519 private key (an owner's identity key).

    Parameters
    ----------
    private_key : bytes
        The raw 32-byte private key.

    Returns
    -------
    bytes
        The raw 32-byte public key (the form ``secagg-pinned-peers`` lists in hex).

    Examples
    --------
    >>> public_key_of(bytes(range(32))).hex()[:16]
    '03a107bff3ce10be'
    """
    return (
        Ed25519PrivateKey.from_private_bytes(private_key)
        .public_key()
        .public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    )


def _derive(shared_key: bytes, info: bytes) -> bytes:
    return HKDF(algorithm=hashes.SHA256(), length=_KEY_BYTES, salt=None, info=info).derive(shared_key)


@lru_cache(maxsize=_DERIVED)
def _channel(shared_key: bytes) -> Fernet:
    # A key of its own, derived from the pairwise key Flower's share-keys stage agreed (ECDH + HKDF),
    # so this message and the share ciphertexts never share a key. Cached: the pairwise key is the same
    # both ways, so a device opens its neighbour's token under the channel it sealed its own with.
    return Fernet(base64.urlsafe_b64encode(_derive(shared_key, _SEAL_TAG)))


@lru_cache(maxsize=_DERIVED)
def _mac_key(shared_key: bytes) -> bytes:
    # Cached: each pair's key makes two tags (one each way) and checks two.
    return _derive(shared_key, _MAC_KEY_TAG)


# --- peer-key pinning (cross-silo): the owner's long-term identity certifies the round's keys -----
def seal_certificate(shared_key: bytes, *, src: int, dst: int, certificate: bytes) -> bytes:
    """``src``'s owner's ``certificate`` for ``dst``, authenticated and encrypted under their pairwise key.

    Parameters
    ----------
    shared_key : bytes
        The pair's key from Flower's share-keys stage.
    src, dst : int
        The sending and the receiving node.
    certificate : bytes
        ``certify``'s 96 bytes.

    Returns
    -------
    bytes
        A Fernet token only ``dst`` (or ``src``) opens, as ``open_certificate(..., src=src, dst=dst)``.

    Examples
    --------
    >>> cert = certify(bytes(range(32)), run_id=1, round_id="3", nid=5, pk1=b"a" * 64, pk2=b"b" * 32)
    >>> token = seal_certificate(bytes(32), src=5, dst=6, certificate=cert)
    >>> open_certificate(bytes(32), token, src=5, dst=6) == cert
    True
    """
    return _channel(shared_key).encrypt(_SEAL_TAG + struct.pack(">QQ", src, dst) + certificate)


def open_certificate(shared_key: bytes, token: object, *, src: int, dst: int) -> bytes | None:
    """The certificate ``src`` sealed for ``dst``, or ``None`` when the token is not exactly that.

    Parameters
    ----------
    shared_key : bytes
        The pair's key from Flower's share-keys stage.
    token : object
        What the coordinator relayed (anything: checked here).
    src, dst : int
        The node the token must come from and the node it must be for.

    Returns
    -------
    bytes or None
        The 96-byte certificate, or None.

    Examples
    --------
    >>> cert = certify(bytes(range(32)), run_id=1, round_id="3", nid=5, pk1=b"a" * 64, pk2=b"b" * 32)
    >>> token = seal_certificate(bytes(32), src=5, dst=6, certificate=cert)
    >>> print(open_certificate(bytes(32), token, src=5, dst=7))  # sealed for another node
    None
    """
    if not isinstance(token, bytes):
        return None
    try:
        plain = _channel(shared_key).decrypt(token)
    except (InvalidToken, ValueError, TypeError):
        return None
    head = _SEAL_TAG + struct.pack(">QQ", src, dst)
    if not plain.startswith(head) or len(plain) != len(head) + _CERT_BYTES:
        return None
    return plain[len(head) :]


def _certified(*, run_id: int, round_id: str, nid: int, pk1: bytes, pk2: bytes) -> bytes:
    parts = [round_id.encode(), pk1, pk2]
    return _CERT_TAG + struct.pack(">QQ", run_id % 2**64, nid) + b"".join(struct.pack(">I", len(p)) + p for p in parts)


def certify(identity_key: bytes, *, run_id: int, round_id: str, nid: int, pk1: bytes, pk2: bytes) -> bytes:
    """The owner's identity public key and its signature on this round's keys of node ``nid``: Flower's
    two SecAgg+ public keys (64 + 32 bytes). ``pk2`` is what the pair's MAC key comes from.

    Parameters
    ----------
    identity_key : bytes
        The owner's raw 32-byte Ed25519 private key (``Pinning.identity_key``).
    run_id : int
        The run.
    round_id : str
        The round (Flower's group id).
    nid : int
        This device's node id.
    pk1, pk2 : bytes
        Flower's two SecAgg+ public keys of this round.

    Returns
    -------
    bytes
        The identity public key (32 bytes) and the signature (64 bytes).

    Examples
    --------
    >>> cert = certify(bytes(range(32)), run_id=1, round_id="3", nid=5, pk1=b"a" * 64, pk2=b"b" * 32)
    >>> len(cert), cert[:32] == public_key_of(bytes(range(32)))
    (96, True)
    """
    identity = Ed25519PrivateKey.from_private_bytes(identity_key)
    body = _certified(run_id=run_id, round_id=round_id, nid=nid, pk1=pk1, pk2=pk2)
    return public_key_of(identity_key) + identity.sign(body)


def check_certificate(
    certificate: bytes, pinned: frozenset[bytes], *, run_id: int, round_id: str, nid: int, pk1: bytes, pk2: bytes
) -> tuple[bytes | None, str]:
    """The pinned identity that certified node ``nid``'s keys, or ``None`` and why not.

    Parameters
    ----------
    certificate : bytes
        What ``open_certificate`` returned for the neighbour.
    pinned : frozenset of bytes
        The owner's pinned public keys (``Pinning.pinned``).
    run_id, round_id, nid, pk1, pk2
        The round and the neighbour's keys as this device received them (as in ``certify``).

    Returns
    -------
    tuple of (bytes or None, str)
        The identity and ``""``, or None and the problem.

    Examples
    --------
    >>> identity = bytes(range(32))
    >>> keys = dict(run_id=1, round_id="3", nid=5, pk1=b"a" * 64, pk2=b"b" * 32)
    >>> cert = certify(identity, **keys)
    >>> check_certificate(cert, frozenset({public_key_of(identity)}), **keys)[0] == public_key_of(identity)
    True
    >>> check_certificate(cert, frozenset({public_key_of(identity)}), **{**keys, "pk2": b"c" * 32})[1]
    "node 5's certificate does not sign the keys this device was given for it."
    """
    if len(certificate) != _CERT_BYTES:
        return None, f"node {nid} sent no certificate of a pinned key."
    identity, signature = certificate[:_KEY_BYTES], certificate[_KEY_BYTES:]
    if identity not in pinned:
        return None, f"node {nid}'s identity key {identity.hex()} is not pinned."
    body = _certified(run_id=run_id, round_id=round_id, nid=nid, pk1=pk1, pk2=pk2)
    try:
        Ed25519PublicKey.from_public_bytes(identity).verify(signature, body)
    except InvalidSignature:
        return None, f"node {nid}'s certificate does not sign the keys this device was given for it."
    return identity, ""


# --- the consistency round: the survivor set, authenticated pair by pair -------------------------
def round_parameters(*records: Mapping[str, object]) -> bytes:
    """SHA-256 of the round's parameters as a device received them (records of str keys to str, bytes,
    bool, int, float or lists of them): each key, the value's type and ``repr``, in sorted key order,
    record by record. Two devices get the same digest exactly when they got the same values.

    Parameters
    ----------
    *records : mapping of str to object
        The round's records (the fedfilter request, the SecAgg+ setup).

    Returns
    -------
    bytes
        The 32-byte digest.

    Examples
    --------
    >>> digest = round_parameters({"clip": 1.0}, {"threshold": 2})
    >>> len(digest), digest == round_parameters({"clip": 1.0}, {"threshold": 2})
    (32, True)
    >>> digest == round_parameters({"clip": 1}, {"threshold": 2})  # the type counts
    False
    """
    digest = hashlib.sha256(_PARAMETERS_TAG)
    for record in records:
        items = sorted((str(k), f"{type(v).__name__}:{v!r}") for k, v in record.items())
        encoded = [p.encode() for item in items for p in item]
        digest.update(struct.pack(">I", len(encoded)) + b"".join(struct.pack(">I", len(p)) + p for p in encoded))
    return digest.digest()


def survivors_message(*, run_id: int, round_id: str, survivors: Iterable[int], parameters: bytes) -> bytes:
    """The bytes a device authenticates: a domain tag, the run, the round (Flower's group id), the
    digest of the round's parameters (``round_parameters``) and the sorted set, each length-prefixed
    where its length varies.

    Parameters
    ----------
    run_id : int
        The run.
    round_id : str
        The round (Flower's group id).
    survivors : iterable of int
        The survivor set the device was told (order and repeats do not matter).
    parameters : bytes
        ``round_parameters`` of the round as the device received it.

    Returns
    -------
    bytes
        The message ``survivors_tag`` authenticates.

    Examples
    --------
    >>> digest = round_parameters({"clip": 1.0})
    >>> a = survivors_message(run_id=1, round_id="3", survivors=[7, 5, 6], parameters=digest)
    >>> a == survivors_message(run_id=1, round_id="3", survivors=[5, 6, 7], parameters=digest)
    True
    """
    ids = sorted(set(int(n) for n in survivors))
    round_bytes = round_id.encode()
    return (
        _SURVIVORS_TAG
        + struct.pack(">QI", run_id % 2**64, len(round_bytes))
        + round_bytes
        + struct.pack(">I", len(parameters))
        + parameters
        + struct.pack(f">I{len(ids)}Q", len(ids), *ids)
    )


def survivors_tag(shared_key: bytes, message: bytes, *, src: int, dst: int) -> bytes:
    """HMAC-SHA256 of ``message || src || dst`` (``src``, ``dst``: 8 bytes each, big-endian) under the MAC
    key derived from the pair's ``ss2`` key (Flower's ``ss2_dict``; never a mask key: see above).

    Parameters
    ----------
    shared_key : bytes
        The pair's ``ss2`` key.
    message : bytes
        ``survivors_message``.
    src, dst : int
        The tag's maker and the neighbour it is for.

    Returns
    -------
    bytes
        The 32-byte tag.

    Examples
    --------
    >>> message = survivors_message(run_id=1, round_id="3", survivors=[5, 6], parameters=round_parameters())
    >>> tag = survivors_tag(bytes(32), message, src=5, dst=6)
    >>> len(tag), tag == survivors_tag(bytes(32), message, src=6, dst=5)  # not valid reflected back
    (32, False)
    """
    mac = crypto_hmac.HMAC(_mac_key(shared_key), hashes.SHA256())
    mac.update(message + struct.pack(">QQ", src, dst))
    return mac.finalize()


def check_tags(
    message: bytes, *, me: int, keys: Mapping[int, bytes], signers: object, tags: object, threshold: int
) -> tuple[list[str], set[int]]:
    """Problems with the survivor-set tags shown to device ``me`` (empty when it may reveal) and the
    neighbours whose valid tag it verified.

    ``message``: the set and parameters ``me`` authenticated itself (``survivors_message``). ``keys``:
    the ``ss2`` keys of the neighbours whose shares ``me`` holds. ``signers[i]`` must be one of them,
    not repeated, and ``tags[i]`` its valid tag on ``message`` addressed to ``me``; ``me`` counts itself
    (module docstring), so at least ``threshold - 1`` distinct neighbours' valid tags are needed.

    Parameters
    ----------
    message : bytes
        What ``me`` authenticated itself.
    me : int
        This device's node id.
    keys : mapping of int to bytes
        The neighbours' ``ss2`` keys.
    signers, tags : object
        The coordinator's lists of makers and their tags (anything: checked here).
    threshold : int
        SecAgg+'s threshold.

    Returns
    -------
    tuple of (list of str, set of int)
        The problems, and the neighbours whose valid tag was verified.

    Examples
    --------
    >>> message = survivors_message(run_id=1, round_id="3", survivors=[5, 6], parameters=round_parameters())
    >>> tag = survivors_tag(bytes(32), message, src=5, dst=6)
    >>> check_tags(message, me=6, keys={5: bytes(32)}, signers=[5], tags=[tag], threshold=2)
    ([], {5})
    >>> check_tags(message, me=6, keys={5: bytes(32)}, signers=[5], tags=[tag], threshold=3)[0]
    ["1 neighbours authenticated this device's survivor set (2 with itself), below the threshold 3."]
    """
    if not isinstance(signers, list) or any(not int_in(n, 0, _MAX_NODE_ID) for n in signers):
        return [f"the survivor-set tag signers must be a list of node ids. Found {signers!r:.80}."], set()
    if not isinstance(tags, list) or len(tags) != len(signers):
        found = f"{tags!r:.80}"
        return [f"the survivor-set tags must be a list as long as the {len(signers)} signers. Found {found}."], set()
    problems = []
    if repeats := sorted({n for n in signers if signers.count(n) > 1}):
        problems.append(f"the survivor-set tag signers repeat node ids {repeats}.")
    valid: set[int] = set()
    for nid, tag in zip(signers, tags):
        if nid == me:
            problems.append(f"a survivor-set tag names this device ({me}) as its maker.")
            continue
        if nid not in keys:
            problems.append(f"a survivor-set tag names node {nid}, not a neighbour whose shares this device holds.")
            continue
        expected = survivors_tag(keys[nid], message, src=nid, dst=me)
        if not isinstance(tag, bytes) or len(tag) != _TAG_BYTES or not hmac.compare_digest(tag, expected):
            problems.append(f"node {nid}'s tag on the survivor set is invalid.")
            continue
        valid.add(nid)  # a set: a neighbour counts once, however often it is shown
    if len(valid) + 1 < threshold:
        problems.append(
            f"{len(valid)} neighbours authenticated this device's survivor set ({len(valid) + 1} with itself), "
            f"below the threshold {threshold}."
        )
    return problems, valid


def check_node_ids(name: str, ids: object) -> list[str]:
    """Problems with a list of node ids sent by the coordinator: not a list of uint64, or repeats.

    Parameters
    ----------
    name : str
        What the list is, for the message.
    ids : object
        The list as received (anything: checked here).

    Returns
    -------
    list of str
        The problems; empty when the list is sound.

    Examples
    --------
    >>> check_node_ids("active node ids", [1, 2])
    []
    >>> check_node_ids("active node ids", [1, 2, 2])
    ['active node ids repeats node ids [2].']
    """
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
    tagged: Iterable[int],
    threshold: int,
) -> list[str]:
    """Problems with an unmask request; empty when the device may reveal its shares.

    ``holders``: the nodes whose shares this device holds (itself and the neighbours whose share
    ciphertexts it received: the set live at the collect stage). ``survivors``: the set it authenticated.
    ``tagged``: the neighbours whose own valid tag on that set and the round's parameters it verified
    (``check_tags``); every other active node must be one of them.

    Parameters
    ----------
    me : int
        This device's node id.
    active, dead : object
        The coordinator's lists of active and dropped nodes (anything: checked here).
    holders, survivors, tagged : iterable of int
        As above.
    threshold : int
        SecAgg+'s threshold.

    Returns
    -------
    list of str
        The problems; empty when the device may reveal its shares.

    Examples
    --------
    >>> lists = dict(me=6, holders=[5, 6, 7], survivors=[5, 6], tagged=[5], threshold=2)
    >>> check_unmask_lists(active=[5, 6], dead=[7], **lists)
    []
    >>> check_unmask_lists(active=[5, 6, 7], dead=[7], **lists)[0]
    'nodes [7] are listed both active and dropped.'
    """
    problems = check_node_ids("active node ids", active) + check_node_ids("dropped node ids", dead)
    if problems:
        return problems
    active, dead = cast(list[int], active), cast(list[int], dead)  # checked above
    mine, agreed = set(holders), set(survivors)
    if both := sorted(set(active) & set(dead)):
        problems.append(f"nodes {both} are listed both active and dropped.")
    if me in dead:
        problems.append(f"this device ({me}) is listed as dropped.")
    if me not in active:
        problems.append(f"this device ({me}) is not listed as active.")
    if outside := sorted((set(active) | set(dead)) - mine):
        problems.append(f"nodes {outside} are not neighbours whose shares this device holds.")
    if not_agreed := sorted(set(active) - agreed):
        problems.append(f"nodes {not_agreed} are listed active but are not in the authenticated survivor set.")
    if agreed_dead := sorted(set(dead) & agreed):
        problems.append(f"nodes {agreed_dead} are listed dropped but are in the authenticated survivor set.")
    if untagged := sorted(set(active) - set(tagged) - {me}):
        problems.append(
            f"nodes {untagged} are listed active but this device was not shown their own tag on the survivor "
            "set and the round's parameters."
        )
    if len(active) < threshold:
        problems.append(f"{len(active)} active nodes, below the threshold {threshold}.")
    return problems
