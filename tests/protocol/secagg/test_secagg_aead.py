"""AES-256-GCM share ciphertexts (protocol/secagg/aead.py) in place of Flower's Fernet.

References independent of the code under test: pycryptodome's AES-GCM (not ``cryptography``'s), keyed
by an RFC 5869 HKDF written out from ``hmac`` (``helpers.crypto_reference``), over the format written
out here (tag, nonce, ciphertext and GCM tag, the tag as associated data); Flower's own ``encrypt`` and
``decrypt`` for the mixed cases. The SecAgg+ rounds that use it end to end, with exact sums, are in
``tests/coordinator/secagg/test_secure_round_crypto.py``.
"""

from __future__ import annotations

import base64
import importlib
import os

import pytest
from Crypto.Cipher import AES
from cryptography.fernet import Fernet, InvalidToken
from helpers.crypto_reference import hkdf_sha256

from fedfilter.protocol.secagg import masks as secagg_masks
from fedfilter.protocol.secagg.aead import FORMAT_TAG, ShareCiphertextError, decrypt, encrypt

KEY_INFO = b"fedfilter/secaggplus/share-aead/aes256gcm/v1"
CLIENT_MOD = "flwr.client.mod.secure_aggregation.secaggplus_mod"
FLOWER = "flwr.common.secure_aggregation.crypto.symmetric_encryption"


def pairwise_key() -> bytes:
    return base64.urlsafe_b64encode(os.urandom(32))  # what generate_shared_key returns


@pytest.fixture(autouse=True)
def _flowers_primitives_back():
    secagg_masks.restore()
    yield
    secagg_masks.restore()


@pytest.mark.parametrize("size", [0, 1, 15, 16, 17, 200, 4096])
def test_a_ciphertext_opens_under_its_key_and_matches_an_independent_aes_gcm(size):
    key, plaintext = pairwise_key(), os.urandom(size)
    ciphertext = encrypt(key, plaintext)
    assert decrypt(key, ciphertext) == plaintext
    assert len(ciphertext) == len(FORMAT_TAG) + 12 + size + 16 and ciphertext[:4] == b"FFG1"
    # pycryptodome, keyed by the HKDF written out: the same bytes open there, and its ciphertext here.
    aes_key = hkdf_sha256(key, KEY_INFO)
    nonce, body, tag = ciphertext[4:16], ciphertext[16:-16], ciphertext[-16:]
    reference = AES.new(aes_key, AES.MODE_GCM, nonce=nonce)
    reference.update(b"FFG1")
    assert reference.decrypt_and_verify(body, tag) == plaintext
    nonce = os.urandom(12)
    sealer = AES.new(aes_key, AES.MODE_GCM, nonce=nonce)
    sealer.update(b"FFG1")
    body, tag = sealer.encrypt_and_digest(plaintext)
    assert decrypt(key, b"FFG1" + nonce + body + tag) == plaintext


def test_every_altered_byte_is_refused():
    """One bit flipped in each byte: the format tag, the nonce, the body and the GCM tag; and the
    ciphertext cut or extended."""
    key = pairwise_key()
    ciphertext = encrypt(key, os.urandom(40))
    for i in range(len(ciphertext)):
        altered = ciphertext[:i] + bytes([ciphertext[i] ^ 0x01]) + ciphertext[i + 1 :]
        with pytest.raises(ShareCiphertextError):
            decrypt(key, altered)
    for altered in (ciphertext[:-1], ciphertext + b"\0", ciphertext[:31], b"", FORMAT_TAG + bytes(28)):
        with pytest.raises(ShareCiphertextError):
            decrypt(key, altered)


def test_a_ciphertext_under_another_key_is_refused_by_name():
    key, plaintext = pairwise_key(), b"src dst shares"
    ciphertext = encrypt(key, plaintext)
    with pytest.raises(ShareCiphertextError, match="does not authenticate under this pair's key"):
        decrypt(pairwise_key(), ciphertext)
    # the pairwise key itself as the AES key (no derivation): refused too
    raw = base64.urlsafe_b64decode(key)
    nonce = os.urandom(12)
    sealer = AES.new(raw, AES.MODE_GCM, nonce=nonce)
    sealer.update(b"FFG1")
    body, tag = sealer.encrypt_and_digest(plaintext)
    with pytest.raises(ShareCiphertextError, match="does not authenticate"):
        decrypt(key, b"FFG1" + nonce + body + tag)


def test_nonces_are_fresh_for_every_encryption():
    key, plaintext = pairwise_key(), b"the same plaintext"
    ciphertexts = [encrypt(key, plaintext) for _ in range(20_000)]
    assert len({c[4:16] for c in ciphertexts}) == len(ciphertexts)
    assert len(set(ciphertexts)) == len(ciphertexts)


def test_flowers_fernet_and_this_format_refuse_each_other():
    """A side on Flower's own share encryption: its Fernet token is refused here by name, and Flower's
    decrypt refuses this format (so a mixed round fails instead of reading shares)."""
    flower = importlib.import_module(FLOWER)
    key, plaintext = pairwise_key(), b"shares"
    with pytest.raises(ShareCiphertextError, match="Fernet token.*use_cryptographic_masks"):
        decrypt(key, flower.encrypt(key, plaintext))
    with pytest.raises(InvalidToken):
        flower.decrypt(key, encrypt(key, plaintext))
    assert flower.decrypt(key, Fernet(key).encrypt(plaintext)) == plaintext  # Flower's own is untouched


def test_refusals_are_what_the_callers_catch():
    key = pairwise_key()
    with pytest.raises(InvalidToken):  # ShareCiphertextError is an InvalidToken: Flower's decrypt's error
        decrypt(key, b"forged")
    with pytest.raises(TypeError, match="must be bytes, found str"):
        decrypt(key, "a str")  # type: ignore[arg-type]
    for bad in (b"short", base64.urlsafe_b64encode(os.urandom(16)), "a str"):
        with pytest.raises(ValueError, match="pairwise key"):
            encrypt(bad, b"x")  # type: ignore[arg-type]


def test_the_installer_replaces_flowers_encryption_in_the_client_mod_only():
    client, flower = importlib.import_module(CLIENT_MOD), importlib.import_module(FLOWER)
    originals = (client.encrypt, client.decrypt)
    assert originals == (flower.encrypt, flower.decrypt)
    secagg_masks.use_cryptographic_masks()
    assert (client.encrypt, client.decrypt) == (encrypt, decrypt)
    assert (flower.encrypt, flower.decrypt) == originals  # the defining module keeps Flower's
    secagg_masks.restore()
    assert (client.encrypt, client.decrypt) == originals
