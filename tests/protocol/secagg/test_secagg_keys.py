"""X25519 with raw keys for SecAgg+ (protocol/secagg/keys.py), against RFC 7748's test vectors and an
independent HKDF (RFC 5869 from hashlib/hmac); refusals of malformed and low-order keys."""

from __future__ import annotations

import base64
import importlib

import pytest
from cryptography.fernet import Fernet, InvalidToken
from cryptography.hazmat.primitives.asymmetric import ec
from helpers.crypto_reference import hkdf_sha256

from fedfilter.protocol.secagg import keys as secagg_keys
from fedfilter.protocol.secagg import masks as secagg_masks
from fedfilter.protocol.secagg.keys import (
    bytes_to_private_key,
    bytes_to_public_key,
    generate_key_pairs,
    generate_shared_key,
    private_key_to_bytes,
    public_key_problems,
    public_key_to_bytes,
)

# RFC 7748, section 6.1 (Curve25519): Alice's and Bob's keys and their shared secret K.
ALICE_SK = bytes.fromhex("77076d0a7318a57d3c16c17251b26645df4c2f87ebc0992ab177fba51db92c2a")
ALICE_PK = bytes.fromhex("8520f0098930a754748b7ddcb43ef75a0dbf3a0d26381af4eba4a98eaa9b4e6a")
BOB_SK = bytes.fromhex("5dab087e624a8a4b79e17f8b83800ee66f3bb1292618b6fd1c2f8b27ff88e0eb")
BOB_PK = bytes.fromhex("de9edb7d7b7dc1b4d35b61c2ece435373f8343c85b78674dadfc7e146f882b4f")
SHARED_K = bytes.fromhex("4a5d9d5ba4ce2de1728e3bf480350f25e07e21c947d19e3376f09b3c1e161742")

# RFC 7748, section 5.2: the X25519 function on (scalar, u-coordinate).
FUNCTION_VECTORS = [
    (
        "a546e36bf0527c9d3b16154b82465edd62144c0ac1fc5a18506a2244ba449ac4",
        "e6db6867583030db3594c1a424b15f7c726624ec26b3353b10a903a6d0ab1c4c",
        "c3da55379de9c6908e94ea4df28d084f32eccf03491c71f754b4075577a28552",
    ),
    (
        "4b66e9d4d1b4673c5ad22691957d6af5c11b6421e0ea01d42ca4169e7918ba0d",
        "e5210f12786811d3f4b7959d0538ae2c31dbe7106fc03c3efc4cd549c715a493",
        "95cbde9476e8907d7aade45cb4b873f88b595a68799fa152e6f8f7647aac7957",
    ),
]

# Encodings of low-order points (libsodium's blocklist): 0, 1, the order-8 points, p - 1, p, p + 1.
LOW_ORDER = [
    bytes(32),
    (1).to_bytes(32, "little"),
    bytes.fromhex("e0eb7a7c3b41b8ae1656e3faf19fc46ada098deb9c32b1fd866205165f49b800"),
    bytes.fromhex("5f9c95bca3508c24b1d0b1559c83ef5b04445cc4581c8e86d8224eddd09f1157"),
    ((1 << 255) - 20).to_bytes(32, "little"),
    ((1 << 255) - 19).to_bytes(32, "little"),
    ((1 << 255) - 18).to_bytes(32, "little"),
]


def _ladder(scalar: bytes, u: bytes) -> bytes:
    """RFC 7748 section 5's X25519 (clamping, Montgomery ladder) with Python integers."""
    p, a24 = 2**255 - 19, 121665
    k = bytearray(scalar)
    k[0], k[31] = k[0] & 248, (k[31] & 127) | 64
    n, x1 = int.from_bytes(k, "little"), int.from_bytes(u, "little") % (1 << 255) % p
    x2, z2, x3, z3, swap = 1, 0, x1, 1, 0
    for t in reversed(range(255)):
        bit = (n >> t) & 1
        if swap ^ bit:
            x2, x3, z2, z3 = x3, x2, z3, z2
        swap = bit
        a, b, c, d = (x2 + z2) % p, (x2 - z2) % p, (x3 + z3) % p, (x3 - z3) % p
        aa, bb, da, cb = a * a % p, b * b % p, d * a % p, c * b % p
        e = (aa - bb) % p
        x3, z3 = (da + cb) ** 2 % p, x1 * (da - cb) ** 2 % p
        x2, z2 = aa * bb % p, e * (aa + a24 * e) % p
    if swap:
        x2, z2 = x3, z3
    return (x2 * pow(z2, p - 2, p) % p).to_bytes(32, "little")


@pytest.mark.parametrize("scalar, u, expected", FUNCTION_VECTORS)
def test_the_x25519_function_matches_rfc_7748_section_5_2(scalar, u, expected):
    private = bytes_to_private_key(bytes.fromhex(scalar))
    assert private.exchange(bytes_to_public_key(bytes.fromhex(u))) == bytes.fromhex(expected)


def test_fresh_keys_match_a_pure_python_ladder():
    for _ in range(3):
        (sk_a, pk_a), (_, pk_b) = generate_key_pairs(), generate_key_pairs()
        raw_a, raw_b = private_key_to_bytes(sk_a), public_key_to_bytes(pk_b)
        assert public_key_to_bytes(pk_a) == _ladder(raw_a, (9).to_bytes(32, "little"))
        assert sk_a.exchange(pk_b) == _ladder(raw_a, raw_b)


def test_rfc_7748_section_6_1_keys_and_the_pairwise_key_both_sides_derive():
    alice, bob = bytes_to_private_key(ALICE_SK), bytes_to_private_key(BOB_SK)
    assert public_key_to_bytes(alice.public_key()) == ALICE_PK and private_key_to_bytes(alice) == ALICE_SK
    assert public_key_to_bytes(bob.public_key()) == BOB_PK
    a = generate_shared_key(alice, bytes_to_public_key(BOB_PK))
    b = generate_shared_key(bob, bytes_to_public_key(ALICE_PK))
    expected = base64.urlsafe_b64encode(hkdf_sha256(SHARED_K, secagg_keys._KDF_INFO))
    assert a == b == expected
    Fernet(a)  # Flower's callers use it as a Fernet key


def test_fresh_pairs_agree_and_a_wrong_key_fails_to_decrypt():
    (sk_a, pk_a), (sk_b, pk_b), (sk_c, _) = generate_key_pairs(), generate_key_pairs(), generate_key_pairs()
    assert len(private_key_to_bytes(sk_a)) == len(public_key_to_bytes(pk_a)) == 32
    ab, ba = generate_shared_key(sk_a, pk_b), generate_shared_key(sk_b, pk_a)
    assert ab == ba
    token = Fernet(ab).encrypt(b"shares")
    assert Fernet(ba).decrypt(token) == b"shares"
    with pytest.raises(InvalidToken):
        Fernet(generate_shared_key(sk_c, pk_a)).decrypt(token)


def test_a_private_key_is_parsed_once_not_once_per_neighbour():
    sk = private_key_to_bytes(generate_key_pairs()[0])
    assert bytes_to_private_key(sk) is bytes_to_private_key(bytes(bytearray(sk)))


@pytest.mark.parametrize("data", [b"", bytes(31), bytes(33), "x" * 32, None])
def test_keys_of_the_wrong_length_or_type_are_refused_by_name(data):
    with pytest.raises(ValueError, match="public key must be 32 raw bytes"):
        bytes_to_public_key(data)
    with pytest.raises(ValueError, match="private key must be 32 raw bytes"):
        bytes_to_private_key(data)


@pytest.mark.parametrize("point", LOW_ORDER)
def test_an_exchange_with_a_low_order_point_is_refused(point):
    with pytest.raises(ValueError, match="low-order point"):
        generate_shared_key(generate_key_pairs()[0], bytes_to_public_key(point))


def _flowers_pem_pair() -> list[bytes]:
    asymmetric = importlib.import_module("flwr.supercore.primitives.asymmetric")
    return [asymmetric.public_key_to_bytes(asymmetric.generate_key_pairs()[1]) for _ in range(2)]


def test_public_key_problems_name_each_refused_neighbour():
    sk1 = private_key_to_bytes(generate_key_pairs()[0])
    good = [public_key_to_bytes(generate_key_pairs()[1]) for _ in range(2)]
    keys = {
        "1": good,
        "2": [LOW_ORDER[2], good[1]],  # pk1 meets sk1 only after training: checked here
        "3": [good[0], bytes(31)],
        "4": _flowers_pem_pair(),  # a device on Flower's own P-384 keys
        "5": [good[0]],
    }
    problems = public_key_problems(sk1, keys)
    assert len(problems) == 4
    assert "node 2" in problems[0] and "low-order" in problems[0]
    assert "node 3" in problems[1] and "found 31 bytes" in problems[1]
    assert "node 4" in problems[2] and "PEM" in problems[2] and "-----BEGIN" in problems[2]
    assert "node 5" in problems[3] and "pair" in problems[3]
    assert public_key_problems(sk1, {"1": good}) == []


def test_the_override_reaches_secaggs_call_sites_and_leaves_node_authentication_alone():
    client = importlib.import_module(secagg_masks._CLIENT_MOD)
    server = importlib.import_module(secagg_masks._SERVER_WORKFLOW)
    asymmetric = importlib.import_module("flwr.supercore.primitives.asymmetric")
    symmetric = importlib.import_module("flwr.common.secure_aggregation.crypto.symmetric_encryption")
    with secagg_masks.cryptographic_masks():
        assert client.generate_key_pairs is secagg_keys.generate_key_pairs
        assert client.bytes_to_private_key is server.bytes_to_private_key is secagg_keys.bytes_to_private_key
        assert client.generate_shared_key is server.generate_shared_key is secagg_keys.generate_shared_key
        # Flower's node authentication signs with P-384 through the defining modules: untouched.
        assert isinstance(asymmetric.generate_key_pairs()[0], ec.EllipticCurvePrivateKey)
        assert symmetric.generate_shared_key is not secagg_keys.generate_shared_key


def test_a_pairwise_key_checked_at_share_keys_is_agreed_once(monkeypatch):
    agreed = []
    derive = secagg_keys._pairwise_key
    monkeypatch.setattr(secagg_keys, "_pairwise_key", lambda *pair: agreed.append(pair) or derive(*pair))
    sk1, _ = generate_key_pairs()
    pk1 = public_key_to_bytes(generate_key_pairs()[1])
    raw = private_key_to_bytes(sk1)
    assert public_key_problems(raw, {"1": [pk1, pk1]}) == [] and agreed == [(raw, pk1)]
    key = generate_shared_key(bytes_to_private_key(raw), bytes_to_public_key(pk1))  # Flower's collect stage
    assert len(agreed) == 1  # found, not agreed again
    # used once: a later call agrees it afresh, to the same key
    assert key == generate_shared_key(bytes_to_private_key(raw), bytes_to_public_key(pk1)) and len(agreed) == 2


def test_keys_waiting_for_the_collect_stage_are_bounded_and_an_evicted_one_is_agreed_again(monkeypatch):
    monkeypatch.setattr(secagg_keys, "_PENDING_PK1", 2)
    monkeypatch.setattr(secagg_keys, "_pending", secagg_keys.OrderedDict())
    raw = private_key_to_bytes(generate_key_pairs()[0])
    pks = [public_key_to_bytes(generate_key_pairs()[1]) for _ in range(3)]
    assert public_key_problems(raw, {str(i): [pk, pk] for i, pk in enumerate(pks)}) == []
    assert list(secagg_keys._pending) == [(raw, pks[1]), (raw, pks[2])]  # the oldest went
    own = bytes_to_private_key(raw)
    for pk in pks:  # each, found or agreed again, is the key both ends derive
        assert generate_shared_key(own, bytes_to_public_key(pk)) == secagg_keys._pairwise_key(raw, pk)
    assert not secagg_keys._pending
