"""X25519 key agreement with raw 32-byte keys for Flower's SecAgg+, in place of its P-384 with PEM.

Why: Flower's SecAgg+ (``secaggplus_mod``, ``secaggplus_workflow``) agrees each pairwise key with
ECDH on P-384 and stores keys as PEM: about 200 us per exchange in ``cryptography`` and a PEM parse of
the same private key once per neighbour, most of a secure round at 100 devices. X25519
(RFC 7748) gives the same 128-bit security level (P-384: 192) at about 26 us per exchange, and a raw
key loads in about 1.5 us.

Contract kept from ``flwr.common.secure_aggregation.crypto.symmetric_encryption.generate_shared_key``:
the pairwise key is HKDF-SHA256 (RFC 5869) of the ECDH output to 32 bytes, url-safe base64 encoded,
so it is a Fernet key (share ciphertexts; the consistency round derives its own keys from it) and a mask seed
(``masks.aes_mask_gen`` hashes the full seed). The HKDF ``info`` is a fedfilter tag, so no key
agreed here equals one agreed by Flower's own functions.

Refusals: a key of the wrong length or type raises ``ValueError`` naming it (a device still on
Flower's P-384 sends a ~120-byte PEM key, so a mixed round fails at the first parse), and an exchange
with a low-order point raises ``ValueError`` (``cryptography`` refuses the all-zero X25519 output,
RFC 7748 section 6.1). ``public_key_problems`` runs those checks on every neighbour's keys before a
device does anything else in the round.

Private keys are parsed once per round, not once per neighbour, and a pairwise key is agreed once:
parsed private keys sit in a small per-process LRU cache, and each ``pk1`` pairwise key that
``public_key_problems`` agrees at share-keys waits, keyed by the raw key bytes, until Flower's collect
stage asks for it (then it is dropped). Only those are kept: the ``pk2`` keys Flower agrees at
share-keys go into its own state and are never asked for again, so a cache of every agreed key (as
before) lost the ``pk1`` keys of a process that runs many devices (a simulation) to them. Memory
only, never persisted; the same private keys are in Flower's in-memory SecAgg+ state anyway.

Imports only ``cryptography``; installed over Flower's functions by ``masks.use_cryptographic_masks``.
``KEY_BYTES`` is the length of a raw key (32).

Examples
--------
Both ends of a pair agree the same key:

>>> sk1, pk1 = generate_key_pairs()
>>> sk2, pk2 = generate_key_pairs()
>>> generate_shared_key(sk1, pk2) == generate_shared_key(sk2, pk1)
True
"""

from __future__ import annotations

import base64
from collections import OrderedDict
from collections.abc import Mapping
from functools import lru_cache

from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

__all__ = [
    "KEY_BYTES",
    "generate_key_pairs",
    "private_key_to_bytes",
    "public_key_to_bytes",
    "bytes_to_private_key",
    "bytes_to_public_key",
    "generate_shared_key",
    "public_key_problems",
]

KEY_BYTES = 32
# Changing this tag changes every pairwise key: both sides of a federation must run the same version.
_KDF_INFO = b"fedfilter/secaggplus-pairwise/x25519-hkdf-sha256/v1"
_PRIVATE_CACHE = 64  # a process runs a few devices' rounds (or, in a simulation, many one after another)
# pk1 pairwise keys agreed at share-keys, waiting for the collect stage (about 250 B each): one device
# leaves k there; a process that runs a whole simulated federation, k per device (100 devices, k = 29:
# 2,900; 1,000 devices, k = 79: 79,000). Beyond the bound the oldest is dropped and agreed again.
_PENDING_PK1 = 1 << 17
_pending: OrderedDict[tuple[bytes, bytes], bytes] = OrderedDict()


def generate_key_pairs() -> tuple[X25519PrivateKey, X25519PublicKey]:
    """A fresh X25519 key pair (Flower's signature).

    Returns
    -------
    tuple
        ``(private_key, public_key)``.

    Examples
    --------
    >>> sk, pk = generate_key_pairs()
    >>> len(public_key_to_bytes(pk)) == KEY_BYTES
    True
    """
    private_key = X25519PrivateKey.generate()
    return private_key, private_key.public_key()


def private_key_to_bytes(private_key: X25519PrivateKey) -> bytes:
    """The raw 32 bytes of an X25519 private key.

    Parameters
    ----------
    private_key : X25519PrivateKey
        The key.

    Returns
    -------
    bytes
        ``KEY_BYTES`` bytes.

    Raises
    ------
    ValueError
        If the key is not an X25519 private key.

    Examples
    --------
    >>> raw = bytes(range(32))
    >>> private_key_to_bytes(bytes_to_private_key(raw)) == raw
    True
    """
    if not isinstance(private_key, X25519PrivateKey):
        raise ValueError(f"private_key must be an X25519 private key, found {type(private_key).__name__}.")
    return private_key.private_bytes_raw()


def public_key_to_bytes(public_key: X25519PublicKey) -> bytes:
    """The raw 32 bytes of an X25519 public key.

    Parameters
    ----------
    public_key : X25519PublicKey
        The key.

    Returns
    -------
    bytes
        ``KEY_BYTES`` bytes.

    Raises
    ------
    ValueError
        If the key is not an X25519 public key.

    Examples
    --------
    >>> public_key_to_bytes(bytes_to_private_key(bytes(range(32))).public_key()).hex()[:16]
    '8f40c5adb68f2562'
    """
    if not isinstance(public_key, X25519PublicKey):
        raise ValueError(f"public_key must be an X25519 public key, found {type(public_key).__name__}.")
    return public_key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def _raw(name: str, data: object) -> bytes:
    if not isinstance(data, bytes):
        raise ValueError(f"{name} must be {KEY_BYTES} raw bytes (X25519), found {type(data).__name__}.")
    if len(data) != KEY_BYTES:
        raise ValueError(
            f"{name} must be {KEY_BYTES} raw bytes (X25519), found {len(data)} bytes starting {data[:12]!r} "
            "(a side running Flower's own P-384 keys sends PEM: every process of a federation must install "
            "fedfilter.protocol.secagg.masks.use_cryptographic_masks)."
        )
    return data


@lru_cache(maxsize=_PRIVATE_CACHE)
def _load_private(data: bytes) -> X25519PrivateKey:
    return X25519PrivateKey.from_private_bytes(data)


def bytes_to_private_key(private_key_bytes: bytes) -> X25519PrivateKey:
    """The X25519 private key of 32 raw bytes (parsed once per process, then cached).

    Parameters
    ----------
    private_key_bytes : bytes
        ``KEY_BYTES`` raw bytes.

    Returns
    -------
    X25519PrivateKey
        The key.

    Raises
    ------
    ValueError
        Naming the length or type found (a PEM key from Flower's own P-384 setup included).

    Examples
    --------
    >>> isinstance(bytes_to_private_key(bytes(range(32))), X25519PrivateKey)
    True
    """
    return _load_private(_raw("private key", private_key_bytes))


def bytes_to_public_key(public_key_bytes: bytes) -> X25519PublicKey:
    """The X25519 public key of 32 raw bytes.

    Parameters
    ----------
    public_key_bytes : bytes
        ``KEY_BYTES`` raw bytes.

    Returns
    -------
    X25519PublicKey
        The key.

    Raises
    ------
    ValueError
        Naming the length or type found.

    Examples
    --------
    >>> bytes_to_public_key(b"-----BEGIN PUBLIC KEY-----")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: public key must be 32 raw bytes (X25519), found 26 bytes starting ...
    """
    return X25519PublicKey.from_public_bytes(_raw("public key", public_key_bytes))


def _exchange(private_key: X25519PrivateKey, public_key: X25519PublicKey) -> bytes:
    try:
        return private_key.exchange(public_key)
    except ValueError as err:  # cryptography's message does not say why
        raise ValueError(
            f"the X25519 public key {public_key_to_bytes(public_key).hex()} is a low-order point (the exchange "
            "gives all zeros, RFC 7748 section 6.1)."
        ) from err


def generate_shared_key(private_key: X25519PrivateKey, public_key: X25519PublicKey) -> bytes:
    """The url-safe base64 of HKDF-SHA256(X25519(private_key, public_key)) to 32 bytes.

    ``ValueError`` for a low-order ``public_key`` (the all-zero output ``cryptography`` refuses).

    Parameters
    ----------
    private_key : X25519PrivateKey
        This side's private key.
    public_key : X25519PublicKey
        The other side's public key.

    Returns
    -------
    bytes
        The pairwise key: 44 bytes of url-safe base64 (a Fernet key, and a mask seed).

    Raises
    ------
    ValueError
        For keys that are not X25519 keys, or a low-order ``public_key``.

    Examples
    --------
    >>> sk1, pk1 = generate_key_pairs()
    >>> sk2, pk2 = generate_key_pairs()
    >>> key = generate_shared_key(sk1, pk2)
    >>> len(key), key == generate_shared_key(sk2, pk1)
    (44, True)
    """
    if not isinstance(private_key, X25519PrivateKey) or not isinstance(public_key, X25519PublicKey):
        raise ValueError(
            "generate_shared_key needs X25519 keys, found "
            f"{type(private_key).__name__} and {type(public_key).__name__}."
        )
    pair = (private_key.private_bytes_raw(), public_key_to_bytes(public_key))
    agreed = _pending.pop(pair, None)  # a pk1 key public_key_problems agreed at share-keys: used once more
    return agreed if agreed is not None else _pairwise_key(*pair)


def _pairwise_key(private_raw: bytes, public_raw: bytes) -> bytes:
    secret = _exchange(_load_private(private_raw), X25519PublicKey.from_public_bytes(public_raw))
    derived = HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=_KDF_INFO).derive(secret)
    return base64.urlsafe_b64encode(derived)


def public_key_problems(sk1: bytes, keys: Mapping[str, object]) -> list[str]:
    """The neighbours' public key pairs ``(pk1, pk2)`` (Flower's share-keys config) this device refuses.

    Both must be raw 32-byte keys. Each ``pk1`` meets this device's ``sk1`` only in Flower's
    collect-masked-vectors stage, after training: that exchange is run here, before anything, so a
    low-order point is refused while nothing is trained, spent or revealed. (Each ``pk2`` meets ``sk2``
    in the share-keys stage itself, before Flower's reply, where ``generate_shared_key`` refuses it.)

    Parameters
    ----------
    sk1 : bytes
        This device's raw private key ``sk1``.
    keys : mapping of str to object
        Node id -> ``(pk1, pk2)``, as Flower's share-keys config holds them.

    Returns
    -------
    list of str
        One sentence per refused neighbour (or for this device's own key); empty when all are fine.

    Examples
    --------
    >>> sk1 = bytes(range(32))
    >>> _, good = generate_key_pairs()
    >>> ok = public_key_to_bytes(good)
    >>> public_key_problems(sk1, {"7": (ok, ok)})
    []
    >>> public_key_problems(sk1, {"7": (bytes(32), ok)})  # doctest: +ELLIPSIS
    ["node 7's public keys are refused: the X25519 public key 0000...0000 is a low-order point ..."]
    """
    problems = []
    try:
        own = bytes_to_private_key(sk1)
    except ValueError as err:  # this device's own setup ran Flower's P-384 keys: refuse, do not crash
        return [f"this device's own SecAgg+ key is refused: {err}"]
    for nid, pair in keys.items():
        if not isinstance(pair, (list, tuple)) or len(pair) != 2:
            problems.append(f"node {nid}'s public keys must be a pair (pk1, pk2), found {pair!r:.80}.")
            continue
        try:
            pk1 = bytes_to_public_key(pair[0])
            agreed = generate_shared_key(own, pk1)
            bytes_to_public_key(pair[1])
        except ValueError as err:
            problems.append(f"node {nid}'s public keys are refused: {err}")
            continue
        # Flower's collect stage agrees this key again (after training): keep it for that call.
        _pending[(sk1, public_key_to_bytes(pk1))] = agreed
        if len(_pending) > _PENDING_PK1:
            _pending.popitem(last=False)
    return problems
