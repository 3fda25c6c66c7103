"""AES-256-GCM for SecAgg+'s share ciphertexts, in place of Flower's Fernet.

Why: Flower's ``encrypt``/``decrypt`` (``flwr.common.secure_aggregation.crypto.symmetric_encryption``)
build a ``Fernet`` object at every call (base64-decoding the key) and seal with AES-128-CBC and
HMAC-SHA256 into base64: 6.6 us to encrypt a 176-byte share plaintext and 6.8 to decrypt it, mostly
Python. In a SecAgg+ round a device encrypts one ciphertext per neighbour and decrypts each
neighbour's twice (fedfilter's check before training, Flower's collect stage after it): 8,700 calls
a 100-device round. Here: 1.7 and 1.0 us (``timeit``), and 208 bytes on the wire instead
of 332.

Format: ``b"FFG1"`` (a format tag) || a 96-bit random nonce || the AES-256-GCM ciphertext and its
16-byte tag, with the format tag as associated data. Random nonces: NIST SP 800-38D, section 8.2.2,
allows them up to 2**32 encryptions under one key; here a pairwise key is fresh every round (new
``sk2``/``pk2`` at each setup) and encrypts two messages (one each way). Raw bytes, not base64:
Flower's callers only pass the ciphertext through a ConfigRecord.

Key: HKDF-SHA256 (RFC 5869) of the pairwise key as Flower passes it (the url-safe base64 of 32 bytes,
``keys.generate_shared_key``) under this module's info tag, so it is not the key any other user
of the pairwise key derives (the survivor-set MACs and the sealed certificates of
``client/secagg/consistency.py``), nor the Fernet key Flower's own ``encrypt`` would use. Derived
ciphers sit in a small per-process LRU cache (each pairwise key encrypts twice and decrypts four
times); memory only, and the pairwise keys are in Flower's in-memory SecAgg+ state anyway.

No associated data binds the source and the destination: Flower calls ``encrypt(key, plaintext)``.
The plaintext carries them (``share_keys_plaintext_concat(src, dst, ...)``), and both Flower's collect
stage and the device's check before training compare them with the sender and this device, so a
ciphertext replayed to another node, or reflected to its sender (the pairwise key is the same both
ways), is refused there.

Refusals: ``decrypt`` raises ``ShareCiphertextError``, a subclass of ``cryptography.fernet.InvalidToken``
(what Flower's own ``decrypt`` raises for a bad token, and what the device's check catches), naming
what is wrong: a Fernet token (a side running Flower's own share encryption: every process of a
federation must install ``masks.use_cryptographic_masks``), too short, another format, or a
ciphertext that does not authenticate (tampered, or sealed under another key). A ciphertext that is
not bytes raises ``TypeError``, as Fernet does; a key that is not a pairwise key, ``ValueError``.
Flower's ``decrypt`` in turn refuses this format (``InvalidToken``): a round with one side on Flower's
own fails by name on fedfilter's side, before that side's neighbours train.

Imports only ``cryptography``; installed over Flower's functions in Flower's SecAgg+ client mod only
by ``masks.use_cryptographic_masks`` (the server workflow never encrypts). ``FORMAT_TAG`` is the
format's 4-byte tag.

Examples
--------
>>> from fedfilter.protocol.secagg import keys
>>> sk1, pk1 = keys.generate_key_pairs()
>>> sk2, pk2 = keys.generate_key_pairs()
>>> key = keys.generate_shared_key(sk1, pk2)  # the same as generate_shared_key(sk2, pk1)
>>> sealed = encrypt(key, b"share" * 35)  # 175 bytes, sealed in 207
>>> len(sealed), decrypt(keys.generate_shared_key(sk2, pk1), sealed) == b"share" * 35
(207, True)
"""

from __future__ import annotations

import base64
import binascii
import os
from functools import lru_cache

from cryptography.exceptions import InvalidTag
from cryptography.fernet import InvalidToken
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

__all__ = ["ShareCiphertextError", "encrypt", "decrypt", "FORMAT_TAG"]

# Changing either changes every ciphertext: both sides of a federation must run the same version.
FORMAT_TAG = b"FFG1"
_KEY_INFO = b"fedfilter/secaggplus/share-aead/aes256gcm/v1"
_NONCE_BYTES = 12
_TAG_BYTES = 16
_FERNET_PREFIX = b"gAAAAA"  # base64 of Fernet's version byte 0x80 and a timestamp's zero high bytes
_CIPHERS = 4096  # a process runs a few devices' rounds (or, in a simulation, many one after another)


class ShareCiphertextError(InvalidToken):
    """A share ciphertext this device cannot accept (the message says why).

    A subclass of ``cryptography.fernet.InvalidToken``, so code that catches Flower's own refusal
    catches it too. Constructed with the message only.

    Parameters
    ----------
    *args
        The message, as for any exception.

    Examples
    --------
    >>> issubclass(ShareCiphertextError, InvalidToken)
    True
    """


@lru_cache(maxsize=_CIPHERS)
def _cipher(key: bytes) -> AESGCM:
    if not isinstance(key, bytes):
        raise ValueError(f"the pairwise key must be bytes, found {type(key).__name__}.")
    try:
        raw = base64.urlsafe_b64decode(key)
    except (binascii.Error, ValueError):
        raw = b""
    if len(raw) != 32:
        raise ValueError(
            f"the pairwise key must be the url-safe base64 of 32 bytes (as generate_shared_key returns), "
            f"found {len(key)} bytes starting {key[:8]!r}."
        )
    return AESGCM(HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=_KEY_INFO).derive(key))


def encrypt(key: bytes, plaintext: bytes) -> bytes:
    """``plaintext`` sealed under ``key`` (Flower's signature): format tag, random nonce, AES-256-GCM.

    Parameters
    ----------
    key : bytes
        The pairwise key: the url-safe base64 of 32 bytes (``keys.generate_shared_key``).
    plaintext : bytes
        What to seal.

    Returns
    -------
    bytes
        ``FORMAT_TAG`` || 12-byte nonce || ciphertext || 16-byte tag: 32 bytes longer than the plaintext.

    Raises
    ------
    ValueError
        If ``key`` is not a pairwise key.

    Examples
    --------
    >>> import base64
    >>> key = base64.urlsafe_b64encode(bytes(32))
    >>> sealed = encrypt(key, b"hello")
    >>> sealed[:4], len(sealed) - len(b"hello")
    (b'FFG1', 32)
    """
    nonce = os.urandom(_NONCE_BYTES)
    return FORMAT_TAG + nonce + _cipher(key).encrypt(nonce, plaintext, FORMAT_TAG)


def decrypt(key: bytes, ciphertext: bytes) -> bytes:
    """The plaintext ``encrypt(key, ...)`` sealed, or ``ShareCiphertextError`` naming why not.

    Parameters
    ----------
    key : bytes
        The pairwise key.
    ciphertext : bytes
        What ``encrypt`` returned.

    Returns
    -------
    bytes
        The plaintext.

    Raises
    ------
    ShareCiphertextError
        For a Fernet token, a ciphertext too short or of another format, or one that does not
        authenticate under ``key``.
    TypeError
        If ``ciphertext`` is not bytes.
    ValueError
        If ``key`` is not a pairwise key.

    Examples
    --------
    >>> import base64
    >>> key = base64.urlsafe_b64encode(bytes(32))
    >>> decrypt(key, encrypt(key, b"hello"))
    b'hello'
    >>> other = base64.urlsafe_b64encode(bytes(31) + b"x")
    >>> decrypt(other, encrypt(key, b"hello"))  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    fedfilter.protocol.secagg.aead.ShareCiphertextError: the share ciphertext does not authenticate ...
    """
    if not isinstance(ciphertext, (bytes, bytearray)):
        raise TypeError(f"a share ciphertext must be bytes, found {type(ciphertext).__name__}.")
    cipher = _cipher(key)
    ciphertext = bytes(ciphertext)
    if ciphertext.startswith(_FERNET_PREFIX):
        raise ShareCiphertextError(
            "the share ciphertext is a Fernet token: its sender runs Flower's own share encryption (every "
            "process of a federation must install fedfilter.protocol.secagg.masks.use_cryptographic_masks)."
        )
    head = len(FORMAT_TAG) + _NONCE_BYTES
    if len(ciphertext) < head + _TAG_BYTES:
        raise ShareCiphertextError(f"the share ciphertext is {len(ciphertext)} bytes, shorter than an empty one.")
    if not ciphertext.startswith(FORMAT_TAG):
        raise ShareCiphertextError(
            f"the share ciphertext starts {ciphertext[:4]!r}, not fedfilter's AES-GCM format {FORMAT_TAG!r}."
        )
    try:
        return cipher.decrypt(ciphertext[len(FORMAT_TAG) : head], ciphertext[head:], FORMAT_TAG)
    except InvalidTag:
        raise ShareCiphertextError(
            "the share ciphertext does not authenticate under this pair's key (altered, or sealed under another key)."
        ) from None
