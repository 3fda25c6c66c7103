"""Peer-key pinning for SecAgg+ (cross-silo): the owner's files, read and checked.

Node config (``flower-supernode --node-config``), both or neither:

* ``secagg-identity-key``: a file holding this device's long-term Ed25519 private key, PEM (PKCS#8,
  unencrypted), e.g. ``openssl genpkey -algorithm ed25519 -out identity.pem``;
* ``secagg-pinned-peers``: a file with the public keys of the devices it accepts as SecAgg+
  neighbours, one per line as 64 hex digits (the raw 32-byte key), ``#`` starts a comment; e.g.
  ``openssl pkey -in identity.pem -pubout -outform DER | tail -c 32 | xxd -p -c 32``.

With them the device certifies its own round keys with its identity and refuses, before it trains,
any round in which a neighbour's keys are not certified by a pinned key (``secagg_consistency``).
A device may list its own key; it is not needed. Errors name the setting and the value.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

__all__ = ["IDENTITY_KEY", "PINNED_PEERS", "Pinning", "PinningError", "pinning"]

IDENTITY_KEY = "secagg-identity-key"
PINNED_PEERS = "secagg-pinned-peers"


class PinningError(ValueError):
    """The owner's pinning settings cannot be used (names the setting and the value).

    Examples
    --------
    >>> try:
    ...     pinning({IDENTITY_KEY: "identity.pem"})
    ... except PinningError as err:
    ...     print(str(err)[:59])
    node-config 'secagg-identity-key' and 'secagg-pinned-peers'
    """


@dataclass(frozen=True)
class Pinning:
    """The owner's SecAgg+ identity and the neighbours' keys it accepts.

    Attributes
    ----------
    identity_key : bytes
        This device's raw 32-byte Ed25519 private key.
    pinned : frozenset of bytes
        The raw 32-byte public keys of the accepted neighbours.

    Examples
    --------
    >>> p = Pinning(identity_key=bytes(32), pinned=frozenset({bytes(range(32))}))
    >>> len(p.pinned)
    1
    """

    identity_key: bytes  # raw 32-byte Ed25519 private key
    pinned: frozenset[bytes]  # raw 32-byte public keys


def _identity(path: str) -> bytes:
    try:
        key = serialization.load_pem_private_key(Path(path).read_bytes(), password=None)
    except (OSError, ValueError, TypeError) as err:
        raise PinningError(
            f"node-config {IDENTITY_KEY!r}: cannot read an Ed25519 PEM key from {path!r} ({err})."
        ) from err
    if not isinstance(key, Ed25519PrivateKey):
        raise PinningError(f"node-config {IDENTITY_KEY!r}: {path!r} holds a {type(key).__name__}, not an Ed25519 key.")
    return key.private_bytes(serialization.Encoding.Raw, serialization.PrivateFormat.Raw, serialization.NoEncryption())


def _pinned(path: str) -> frozenset[bytes]:
    try:
        text = Path(path).read_text()
    except OSError as err:
        raise PinningError(f"node-config {PINNED_PEERS!r}: cannot read {path!r} ({err}).") from err
    keys = set()
    for number, line in enumerate(text.splitlines(), 1):
        entry = line.split("#", 1)[0].strip()
        if not entry:
            continue
        try:
            key = bytes.fromhex(entry)
        except ValueError:
            key = b""
        if len(key) != 32:
            raise PinningError(f"node-config {PINNED_PEERS!r}: {path!r} line {number} is not 64 hex digits: {entry!r}.")
        keys.add(key)
    if not keys:
        raise PinningError(f"node-config {PINNED_PEERS!r}: {path!r} pins no key.")
    return frozenset(keys)


def pinning(node_config: Mapping[str, Any]) -> Pinning | None:
    """The owner's pinning, or ``None`` when neither setting is given; ``PinningError`` otherwise.

    Parameters
    ----------
    node_config : mapping
        The device's settings (``secagg-identity-key`` and ``secagg-pinned-peers``).

    Returns
    -------
    Pinning or None
        The keys read from the two files; None without either setting.

    Examples
    --------
    >>> import tempfile
    >>> from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
    >>> pem = Ed25519PrivateKey.generate().private_bytes(
    ...     serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    ... )
    >>> print(pinning({}))
    None
    >>> with tempfile.TemporaryDirectory() as d:
    ...     _ = Path(d, "identity.pem").write_bytes(pem)
    ...     _ = Path(d, "peers").write_text("ab" * 32 + "  # a neighbour")
    ...     p = pinning({IDENTITY_KEY: f"{d}/identity.pem", PINNED_PEERS: f"{d}/peers"})
    >>> len(p.identity_key), len(p.pinned)
    (32, 1)
    """
    identity, pinned = node_config.get(IDENTITY_KEY), node_config.get(PINNED_PEERS)
    if identity is None and pinned is None:
        return None
    if not (isinstance(identity, str) and identity and isinstance(pinned, str) and pinned):
        raise PinningError(
            f"node-config {IDENTITY_KEY!r} and {PINNED_PEERS!r} must both name files. "
            f"Found {identity!r} and {pinned!r}."
        )
    return Pinning(identity_key=_identity(identity), pinned=_pinned(pinned))
