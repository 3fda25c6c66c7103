"""Shamir secret sharing over the prime field GF(2**521 - 1) with Python integers, for Flower's SecAgg+.

Why: Flower's ``create_shares`` / ``combine_shares`` (``flwr.common.secure_aggregation.crypto.shamir``)
share each 16-byte chunk with pycryptodome's pure-Python GF(2**128) arithmetic: 0.3 s to split a 32-byte
secret among 100 and 10 s among 500 (docs/results.md, "Distributed noise over SecAgg+"). The same
scheme (Shamir, CACM 1979: a random polynomial of degree t - 1 whose constant term is the secret, shares
its values at x = 1..num, the secret its Lagrange interpolation at 0 from any t of them) over a prime
field with Python's big integers is two orders of magnitude faster and just as exact.

Layout of a share (bytes): ``MAGIC`` (4) || x (4, big-endian) || t (4, big-endian) || one 66-byte value
per 64-byte chunk of the encoded secret. The secret is encoded as ``len (4) || secret || tag (16)``,
zero-padded to a multiple of 64 bytes, where ``tag`` is SHA-256 over a domain tag and the secret:
a combine from wrong shares fails the tag check (false acceptance 2**-128) instead of returning
garbage; a combine from fewer than t shares is refused by count.

Mixing with Flower's own: every share here starts with the same four bytes, which Flower's combine
reads as the share's index, so Flower's ``combine_shares`` raises "Duplicate share" on shares made here;
``combine_shares`` here refuses a share without ``MAGIC`` (Flower's). A round where one side runs
Flower's Shamir fails loudly and releases nothing.

Pure: no Flower, no I/O (randomness from ``secrets``). ``PRIME`` is the field's modulus
``2**521 - 1``; ``MAGIC`` the 4-byte header of every share.

Examples
--------
>>> shares = create_shares(b"sk1 of node 7", threshold=3, num=5)
>>> combine_shares(shares[2:]), combine_shares([shares[4], shares[0], shares[1]])
(b'sk1 of node 7', b'sk1 of node 7')
"""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Sequence
from functools import lru_cache

__all__ = ["PRIME", "MAGIC", "create_shares", "combine_shares"]

PRIME = (1 << 521) - 1  # a Mersenne prime (M521); every 64-byte chunk (< 2**512) is a field element
MAGIC = b"\xffS1\xff"  # fedfilter Shamir v1; Flower reads it as the index 0xff3153ff, the same in every share
_CHUNK = 64  # bytes of the encoded secret per field element
_VALUE = 66  # bytes per share value: ceil(521 / 8)
_HEADER = len(MAGIC) + 4 + 4
_TAG_BYTES = 16
_TAG_DOMAIN = b"fedfilter/secaggplus-shamir/v1"
_MAX_SHARES = 1 << 20  # far above any SecAgg+ neighbourhood; keeps x and t in 4 bytes


def _tag(secret: bytes) -> bytes:
    return hashlib.sha256(_TAG_DOMAIN + b"\x00" + bytes(secret)).digest()[:_TAG_BYTES]


def _encode(secret: bytes) -> list[int]:
    body = len(secret).to_bytes(4, "big") + bytes(secret) + _tag(secret)
    body += bytes(-len(body) % _CHUNK)
    return [int.from_bytes(body[i : i + _CHUNK], "big") for i in range(0, len(body), _CHUNK)]


def _decode(chunks: Sequence[int]) -> bytes:
    body = b"".join(c.to_bytes(_CHUNK, "big") if c < (1 << (8 * _CHUNK)) else b"" for c in chunks)
    if len(body) != _CHUNK * len(chunks):
        raise ValueError("Failed to combine shares: a reconstructed chunk is out of range (wrong shares).")
    length = int.from_bytes(body[:4], "big")
    if length + 4 + _TAG_BYTES > len(body):
        raise ValueError("Failed to combine shares: the reconstructed length is out of range (wrong shares).")
    secret = body[4 : 4 + length]
    if not secrets.compare_digest(body[4 + length : 4 + length + _TAG_BYTES], _tag(secret)):
        raise ValueError("Failed to combine shares: the reconstructed secret fails its tag (wrong shares).")
    if any(body[4 + length + _TAG_BYTES :]):
        raise ValueError("Failed to combine shares: non-zero padding (wrong shares).")
    return secret


def _check_split(secret: object, threshold: object, num: object) -> None:
    if not isinstance(secret, (bytes, bytearray)):
        raise TypeError(f"secret must be bytes, found {type(secret).__name__}.")
    if isinstance(threshold, bool) or not isinstance(threshold, int):
        raise TypeError(f"threshold must be an int, found {threshold!r}.")
    if isinstance(num, bool) or not isinstance(num, int):
        raise TypeError(f"num must be an int, found {num!r}.")
    if not 1 <= threshold <= num <= _MAX_SHARES:
        raise ValueError(f"need 1 <= threshold <= num <= {_MAX_SHARES}, found threshold={threshold}, num={num}.")


def _evaluate(coefficients: Sequence[int], x: int, prime: int) -> int:
    """Horner: sum_j coefficients[j] x**j mod prime."""
    y = 0
    for c in reversed(coefficients):
        y = (y * x + c) % prime
    return y


def create_shares(secret: bytes, threshold: int, num: int) -> list[bytes]:
    """``num`` shares of ``secret``, any ``threshold`` of which reconstruct it (Flower's signature).

    Per chunk s: coefficients a_1..a_{t-1} uniform on [0, p) (``secrets.randbelow``: exact), share x
    is f(x) = s + a_1 x + ... + a_{t-1} x**(t-1) mod p for x = 1..num. Any t - 1 shares are uniform
    and independent of s (the map (a_1..a_{t-1}) -> (f(x_1)..f(x_{t-1})) is a bijection of GF(p)**(t-1)
    for distinct non-zero x_i: a Vandermonde system), so they reveal nothing about the secret.

    Parameters
    ----------
    secret : bytes
        The secret.
    threshold : int
        ``t``, the number of shares that reconstruct it, ``1 <= t <= num``.
    num : int
        The number of shares, at most ``2**20``.

    Returns
    -------
    list of bytes
        The shares, share ``i`` (from 0) at ``x = i + 1``.

    Raises
    ------
    TypeError
        For a secret that is not bytes, or counts that are not ints.
    ValueError
        Unless ``1 <= threshold <= num <= 2**20``.

    Examples
    --------
    A 32-byte secret fits one 64-byte chunk, so a share is 12 header bytes and one 66-byte value:

    >>> shares = create_shares(bytes(32), threshold=2, num=4)
    >>> len(shares), len(shares[0]), shares[0][:4] == MAGIC
    (4, 78, True)
    """
    _check_split(secret, threshold, num)
    polynomials = [[chunk] + [secrets.randbelow(PRIME) for _ in range(threshold - 1)] for chunk in _encode(secret)]
    header_t = threshold.to_bytes(4, "big")
    shares = []
    for x in range(1, num + 1):
        values = b"".join(_evaluate(poly, x, PRIME).to_bytes(_VALUE, "big") for poly in polynomials)
        shares.append(MAGIC + x.to_bytes(4, "big") + header_t + values)
    return shares


@lru_cache(maxsize=4096)
def _lagrange_at_zero(xs: tuple[int, ...], prime: int) -> tuple[int, ...]:
    """lambda_j = prod_{m != j} x_m / (x_m - x_j) mod prime, so f(0) = sum_j lambda_j f(x_j).

    Cached: with no drop-outs every secret of a round is combined from the same x's."""
    out = []
    for j, xj in enumerate(xs):
        num, den = 1, 1
        for m, xm in enumerate(xs):
            if m != j:
                num = num * xm % prime
                den = den * (xm - xj) % prime
        out.append(num * pow(den, -1, prime) % prime)
    return tuple(out)


def _parse(share: object, index: int) -> tuple[int, int, bytes]:
    if not isinstance(share, (bytes, bytearray)):
        raise TypeError(f"share_list[{index}] must be bytes, found {type(share).__name__}.")
    if share[: len(MAGIC)] != MAGIC:
        raise ValueError(
            f"share_list[{index}] is not a fedfilter Shamir share (no {MAGIC!r} header): one side of this "
            "SecAgg+ round runs Flower's Shamir sharing. Install fedfilter's SecAgg+ parts on every device "
            "and on the coordinator (fedfilter.protocol.secagg.masks.use_cryptographic_masks)."
        )
    if len(share) <= _HEADER or (len(share) - _HEADER) % _VALUE:
        raise ValueError(f"share_list[{index}] has a malformed length {len(share)}.")
    x = int.from_bytes(share[4:8], "big")
    t = int.from_bytes(share[8:12], "big")
    return x, t, bytes(share[_HEADER:])


def combine_shares(share_list: Sequence[bytes]) -> bytes:
    """The secret from at least ``t`` shares (``t`` as the shares say); ``ValueError`` if they are too few,
    inconsistent or wrong. Uses the first ``t`` shares with distinct indices.

    Parameters
    ----------
    share_list : sequence of bytes
        Shares from ``create_shares``.

    Returns
    -------
    bytes
        The secret.

    Raises
    ------
    ValueError
        For no shares, fewer than ``t``, shares that disagree, Flower's own shares (no ``MAGIC``), or
        a reconstruction that fails its tag.
    TypeError
        For a share that is not bytes.

    Examples
    --------
    >>> shares = create_shares(b"secret", threshold=3, num=5)
    >>> combine_shares(shares[1:4])
    b'secret'
    >>> combine_shares(shares[:2])
    Traceback (most recent call last):
    ...
    ValueError: Failed to combine shares: 2 shares, the threshold is 3.
    """
    if not share_list:
        raise ValueError("Failed to combine shares: share_list is empty.")
    parsed = [_parse(share, i) for i, share in enumerate(share_list)]
    thresholds = {t for _, t, _ in parsed}
    lengths = {len(values) for _, _, values in parsed}
    if len(thresholds) != 1 or len(lengths) != 1:
        raise ValueError(f"Failed to combine shares: they disagree on threshold {thresholds} or length {lengths}.")
    (t,) = thresholds
    xs = [x for x, _, _ in parsed]
    if len(set(xs)) != len(xs) or not all(1 <= x <= _MAX_SHARES for x in xs):
        raise ValueError(f"Failed to combine shares: indices must be distinct and in [1, {_MAX_SHARES}], found {xs}.")
    if t < 1 or len(parsed) < t:
        raise ValueError(f"Failed to combine shares: {len(parsed)} shares, the threshold is {t}.")
    used = parsed[:t]
    lambdas = _lagrange_at_zero(tuple(x for x, _, _ in used), PRIME)
    n_chunks = len(used[0][2]) // _VALUE
    chunks = []
    for c in range(n_chunks):
        lo, hi = c * _VALUE, (c + 1) * _VALUE
        total = 0
        for lam, (_, _, values) in zip(lambdas, used, strict=True):
            y = int.from_bytes(values[lo:hi], "big")
            if y >= PRIME:
                raise ValueError("Failed to combine shares: a share value is not a field element.")
            total += lam * y
        chunks.append(total % PRIME)
    return _decode(chunks)
