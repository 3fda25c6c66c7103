"""Independent references for the SecAgg+ primitives' key derivations, from the standard library only
(``hmac``, ``hashlib``), so a test does not check ``cryptography``'s HKDF against itself."""

from __future__ import annotations

import hashlib
import hmac


def hkdf_sha256(ikm: bytes, info: bytes, length: int = 32) -> bytes:
    """RFC 5869 with salt = HashLen zero bytes (what an absent salt means), from hmac and hashlib."""
    prk = hmac.new(bytes(32), ikm, hashlib.sha256).digest()
    out, block, counter = b"", b"", 1
    while len(out) < length:
        block = hmac.new(prk, block + info + bytes([counter]), hashlib.sha256).digest()
        out, counter = out + block, counter + 1
    return out[:length]
