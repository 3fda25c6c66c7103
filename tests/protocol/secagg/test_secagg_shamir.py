"""Prime-field Shamir sharing (``protocol/secagg/shamir.py``) against independent references and Flower's own.

References: a Gaussian elimination of the Vandermonde system mod p written here (not Lagrange), brute-force
enumeration of every polynomial over a small prime for the hiding property, and Flower's
``create_shares`` / ``combine_shares`` for the interface (same arguments, same number of shares, both
reconstruct the secrets SecAgg+ shares: 32-byte seeds and PEM private keys).
"""

from __future__ import annotations

import itertools
import os
import random
from collections import Counter

import pytest
from flwr.common.secure_aggregation.crypto import shamir as flower_shamir
from flwr.supercore.primitives.asymmetric import generate_key_pairs, private_key_to_bytes

from fedfilter.protocol.secagg import shamir as secagg_shamir
from fedfilter.protocol.secagg.masks import cryptographic_masks_installed, restore, use_cryptographic_masks
from fedfilter.protocol.secagg.shamir import MAGIC, PRIME, combine_shares, create_shares

_HEADER = 12
_VALUE = 66


def _values(share: bytes) -> list[int]:
    body = share[_HEADER:]
    return [int.from_bytes(body[i : i + _VALUE], "big") for i in range(0, len(body), _VALUE)]


def _solve_constant_term(points: list[tuple[int, int]], p: int) -> int:
    """f(0) for the polynomial of degree < len(points) through ``points`` mod p, by Gauss-Jordan
    elimination of the Vandermonde system (independent of the Lagrange formula the module uses)."""
    n = len(points)
    rows = [[pow(x, j, p) for j in range(n)] + [y % p] for x, y in points]
    for col in range(n):
        pivot = next(r for r in range(col, n) if rows[r][col] % p)
        rows[col], rows[pivot] = rows[pivot], rows[col]
        inv = pow(rows[col][col], -1, p)
        rows[col] = [v * inv % p for v in rows[col]]
        for r in range(n):
            if r != col and rows[r][col]:
                factor = rows[r][col]
                rows[r] = [(a - factor * b) % p for a, b in zip(rows[r], rows[col], strict=True)]
    return rows[0][n]


def _secrets():
    private_key, _ = generate_key_pairs()
    return [os.urandom(32), private_key_to_bytes(private_key), b"", b"\x00" * 5, os.urandom(200)]


@pytest.mark.parametrize("threshold, num", [(2, 3), (3, 5), (11, 21), (51, 100)])
def test_any_threshold_shares_reconstruct_as_with_flowers_sharing(threshold, num):
    rng = random.Random(threshold * 1000 + num)
    for secret in _secrets():
        ours = create_shares(secret, threshold, num)
        assert len(ours) == num
        if num <= 21:  # Flower's gives as many shares for the same arguments (slow beyond that)
            assert len(flower_shamir.create_shares(secret, threshold, num)) == num
        for _ in range(3):
            subset = rng.sample(ours, rng.randint(threshold, num))
            assert combine_shares(subset) == secret
        if len(secret) == 32 and num <= 21:  # Flower's reconstructs the same secret from its own shares
            theirs = flower_shamir.create_shares(secret, threshold, num)
            assert flower_shamir.combine_shares(rng.sample(theirs, threshold)) == secret


def test_each_chunk_is_the_constant_term_of_the_polynomial_through_the_shares():
    secret = os.urandom(150)
    threshold, num = 7, 12
    shares = create_shares(secret, threshold, num)
    encoded = len(secret).to_bytes(4, "big") + secret + secagg_shamir._tag(secret)
    encoded += bytes(-len(encoded) % 64)
    chunks = [int.from_bytes(encoded[i : i + 64], "big") for i in range(0, len(encoded), 64)]
    xs = [int.from_bytes(s[4:8], "big") for s in shares]
    assert xs == list(range(1, num + 1)) and all(s[:4] == MAGIC for s in shares)
    assert all(int.from_bytes(s[8:12], "big") == threshold for s in shares)
    for c, chunk in enumerate(chunks):
        points = [(x, _values(s)[c]) for x, s in zip(xs, shares, strict=True)]
        assert all(0 <= y < PRIME for _, y in points)
        for subset in (points[:threshold], points[-threshold:], points[1::2] + points[:1]):
            assert _solve_constant_term(subset, PRIME) == chunk
        # Degree t - 1 exactly: t - 1 points do not determine the chunk (a random polynomial's top
        # coefficient is 0 with probability 1/p).
        assert _solve_constant_term(points[: threshold - 1], PRIME) != chunk


def test_fewer_than_threshold_shares_are_refused():
    secret = os.urandom(32)
    shares = create_shares(secret, 5, 9)
    with pytest.raises(ValueError, match="4 shares, the threshold is 5"):
        combine_shares(shares[:4])
    with pytest.raises(ValueError, match="empty"):
        combine_shares([])


def test_wrong_shares_fail_instead_of_returning_another_secret():
    secret = os.urandom(32)
    shares = create_shares(secret, 4, 7)
    other = create_shares(os.urandom(32), 4, 7)
    for position in (_HEADER, _HEADER + 33, len(shares[0]) - 1):  # one flipped bit in one value
        bad = bytearray(shares[2])
        bad[position] ^= 0x01
        with pytest.raises(ValueError, match="Failed to combine shares"):
            combine_shares([shares[0], shares[1], bytes(bad), shares[3]])
    with pytest.raises(ValueError, match="Failed to combine shares"):  # a share of another secret, same x
        combine_shares([shares[0], shares[1], other[2], shares[3]])
    with pytest.raises(ValueError, match="distinct"):
        combine_shares([shares[0], shares[0], shares[1], shares[3]])
    with pytest.raises(ValueError, match="disagree"):
        combine_shares([shares[0], shares[1], shares[2], create_shares(secret, 3, 7)[3]])
    with pytest.raises(ValueError, match="malformed length"):
        combine_shares([shares[0][:-1]] + shares[1:4])


def test_bad_arguments_are_refused_by_name():
    with pytest.raises(ValueError, match=r"threshold=4, num=3"):
        create_shares(b"s", 4, 3)
    with pytest.raises(ValueError, match=r"threshold=0"):
        create_shares(b"s", 0, 3)
    with pytest.raises(TypeError, match="threshold"):
        create_shares(b"s", True, 3)
    with pytest.raises(TypeError, match="secret"):
        create_shares("s", 2, 3)
    with pytest.raises(TypeError, match=r"share_list\[1\]"):
        combine_shares([create_shares(b"s", 2, 3)[0], "x"])


@pytest.mark.parametrize("p, t, xs", [(7, 3, (1, 2)), (11, 3, (2, 5)), (5, 4, (1, 2, 3))])
def test_fewer_than_threshold_shares_are_uniform_whatever_the_secret(p, t, xs):
    # Brute force over every polynomial: for each secret s, the shares at t - 1 points are uniform on
    # GF(p)**(t-1), so they carry no information about s (the property Shamir's scheme promises).
    for s in range(p):
        counts = Counter(
            tuple(secagg_shamir._evaluate((s, *coefficients), x, p) for x in xs)
            for coefficients in itertools.product(range(p), repeat=t - 1)
        )
        assert len(counts) == p ** len(xs) and set(counts.values()) == {p ** (t - 1 - len(xs))}


@pytest.fixture
def flowers_own_sharing():
    """Flower's own Shamir functions for the test: a test that ran before on this worker may have installed
    fedfilter's override process-wide (it replaces them inside flwr), so it is lifted, then put back."""
    was = cryptographic_masks_installed()
    restore()
    yield
    if was:
        use_cryptographic_masks()


def test_mixing_with_flowers_sharing_fails_loudly_both_ways(flowers_own_sharing):
    secret = os.urandom(32)
    ours = create_shares(secret, 3, 5)
    theirs = flower_shamir.create_shares(secret, 3, 5)
    # Flower's combine reads our MAGIC as every share's index: duplicate, refused (never a wrong secret).
    with pytest.raises(ValueError, match="Duplicate share"):
        flower_shamir.combine_shares(ours[:3])
    with pytest.raises(ValueError, match="Flower's Shamir"):
        combine_shares(theirs[:3])
    with pytest.raises(ValueError, match="Flower's Shamir"):
        combine_shares([ours[0], theirs[1], ours[2]])
