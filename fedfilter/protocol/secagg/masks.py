"""Fedfilter's SecAgg+ primitives, installed in place of Flower's: AES-CTR masks and prime-field Shamir.

Masks. Flower's ``pseudo_rand_gen`` (``flwr.common.secure_aggregation.secaggplus_utils``) XOR-folds the
shared seed (a 32-byte ECDH key or a 32-byte private seed) to 32 bits and draws the masks with numpy's
Mersenne Twister. Anyone who can try 2**32 seeds, or who sees enough of the stream, can strip a mask,
so the masks do not hide a device's report. Upstream: flwrlabs/flower#7522 (fix proposed in #7570).
``aes_mask_gen`` keeps Flower's signature and output layout (one ``int64`` array per requested shape,
0-d arrays for ``()``) but keys AES-256-CTR with a domain-separated SHA-256 of the FULL seed and draws
uniformly in ``[0, num_range)`` by rejection sampling of 32-bit (ranges up to 2**32) or 64-bit words,
so there is no modulo bias at all. (Flower draws ``randint(0, num_range - 1)``, i.e. in
``[0, num_range - 2]``: its masks never take the value ``num_range - 1``; masks cancel either way,
uniformity over Z_m is what the SecAgg+ hiding argument needs.) AES-CTR through ``cryptography`` is
about 10 times faster than the ChaCha20 generator it replaces.

Shamir. Flower's ``create_shares`` / ``combine_shares`` run pycryptodome's pure-Python GF(2**128)
arithmetic, most of a secure round's time; ``fedfilter.protocol.secagg.shamir`` shares over a prime
field with Python integers, with a share format Flower's combine refuses (and vice versa).

``use_cryptographic_masks()`` replaces all three (and the key functions below), in every Flower module
that imported them by name (the client mod ``secaggplus_mod`` and the server ``secaggplus_workflow``;
both sides must use the same primitives or the masks do not cancel and the shares do not combine), so
it must run in every process that runs either side: the ServerApp and each ClientApp (e.g. in a Ray actor). A side that
runs Flower's own fails the round loudly (the Shamir share formats differ) rather than releasing a
wrong sum. Checked against flwr 1.41.0 and 1.42.0 (the module and attribute names below and the call
sites' arguments). Remove the mask override once upstream fixes #7522 and fedfilter requires that
Flower version; the Shamir override when Flower's sharing is fast.

Keys. Flower's P-384 ECDH with PEM-encoded keys (``generate_key_pairs`` ... ``generate_shared_key``)
is replaced by X25519 with raw keys (``fedfilter.protocol.secagg.keys``) at SecAgg+'s two call sites
only: the defining modules also serve Flower's node authentication, which keeps its own.

Share encryption. Flower's Fernet ``encrypt``/``decrypt`` of the share ciphertexts is replaced by
AES-256-GCM under a key of its own (``fedfilter.protocol.secagg.aead``) in Flower's SecAgg+ client mod,
their only caller (the server workflow only relays ciphertexts); the defining module keeps Flower's.

The math imports only numpy and ``cryptography``; Flower is imported only by the installer.

Examples
--------
The same seed gives the same masks on both sides:

>>> client = aes_mask_gen(b"pairwise seed", 2**32, [(2, 3), ()])
>>> server = aes_mask_gen(b"pairwise seed", 2**32, [(2, 3), ()])
>>> [m.shape for m in client], all(np.array_equal(a, b) for a, b in zip(client, server))
([(2, 3), ()], True)
"""

from __future__ import annotations

import hashlib
import importlib
import math
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from types import ModuleType

import numpy as np
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

from fedfilter.protocol.secagg import aead, keys, shamir

# Changing this tag changes every mask: both sides of a federation must run the same version.
_DOMAIN_TAG = b"fedfilter/secaggplus-mask/aes256ctr/v1"
# Output is int64, so a value must fit below 2**63.
_MAX_RANGE = 1 << 63

# attribute -> (the replacement, every flwr module that imports it by name in flwr 1.41.0 and 1.42.0, the
# defining module first so that a later `from ... import name` also gets the override). The key functions
# are replaced only in SecAgg+'s two call sites: their defining modules also serve Flower's node
# authentication (P-384 signatures), which must keep Flower's own.
_UTILS = "flwr.common.secure_aggregation.secaggplus_utils"
_SHAMIR = "flwr.common.secure_aggregation.crypto.shamir"
_CLIENT_MOD = "flwr.client.mod.secure_aggregation.secaggplus_mod"
_SERVER_WORKFLOW = "flwr.server.workflow.secure_aggregation.secaggplus_workflow"
_FLOWER_MODULES = (_UTILS, _SHAMIR, _CLIENT_MOD, _SERVER_WORKFLOW)


_SECAGG_SIDES = (_CLIENT_MOD, _SERVER_WORKFLOW)
# Replaced wherever Flower's original is found in a loaded flwr module (see use_cryptographic_masks).
_SWEPT = ("pseudo_rand_gen", "create_shares", "combine_shares")


def _overrides() -> dict[str, tuple[object, tuple[str, ...]]]:
    return {
        "pseudo_rand_gen": (aes_mask_gen, (_UTILS, _CLIENT_MOD, _SERVER_WORKFLOW)),
        "create_shares": (shamir.create_shares, (_SHAMIR, _CLIENT_MOD)),
        "combine_shares": (shamir.combine_shares, (_SHAMIR, _SERVER_WORKFLOW)),
        # X25519 with raw keys (protocol/secagg/keys.py): the device makes and parses keys, both sides agree
        # pairwise keys (the coordinator for a dropped node's neighbours, from its reconstructed key).
        "generate_key_pairs": (keys.generate_key_pairs, (_CLIENT_MOD,)),
        "private_key_to_bytes": (keys.private_key_to_bytes, (_CLIENT_MOD,)),
        "public_key_to_bytes": (keys.public_key_to_bytes, (_CLIENT_MOD,)),
        "bytes_to_private_key": (keys.bytes_to_private_key, _SECAGG_SIDES),
        "bytes_to_public_key": (keys.bytes_to_public_key, _SECAGG_SIDES),
        "generate_shared_key": (keys.generate_shared_key, _SECAGG_SIDES),
        # AES-256-GCM share ciphertexts (protocol/secagg/aead.py): only the device encrypts and decrypts them.
        "encrypt": (aead.encrypt, (_CLIENT_MOD,)),
        "decrypt": (aead.decrypt, (_CLIENT_MOD,)),
    }


# (module name, attribute) -> Flower's original, while the override is installed.
_originals: dict[tuple[str, str], object] = {}


def mask_key(seed: bytes) -> bytes:
    """The 32-byte AES-256 key for ``seed``: SHA-256 over a domain tag, the seed's length and the seed.

    Parameters
    ----------
    seed : bytes
        The mask seed (a pairwise key or a private seed), not empty.

    Returns
    -------
    bytes
        32 bytes.

    Raises
    ------
    TypeError
        If ``seed`` is not bytes.
    ValueError
        If ``seed`` is empty.

    Examples
    --------
    >>> import hashlib
    >>> key = mask_key(b"seed")
    >>> key == hashlib.sha256(_DOMAIN_TAG + bytes(1) + (4).to_bytes(8, "big") + b"seed").digest()
    True
    """
    if not isinstance(seed, (bytes, bytearray)):
        raise TypeError(f"seed must be bytes, found {type(seed).__name__}.")
    if len(seed) == 0:
        raise ValueError("seed must not be empty, found b''.")
    # The length prefix makes the encoding injective (tag || len || seed), whatever the seed's length.
    return hashlib.sha256(_DOMAIN_TAG + b"\x00" + len(seed).to_bytes(8, "big") + bytes(seed)).digest()


def _check_range(num_range: object) -> int:
    if isinstance(num_range, bool) or not isinstance(num_range, (int, np.integer)):
        raise TypeError(f"num_range must be an int, found {num_range!r}.")
    value = int(num_range)
    if not 1 <= value <= _MAX_RANGE:
        raise ValueError(f"num_range must be in [1, 2**63], found {value}.")
    return value


def _check_shapes(dimensions_list: Sequence[tuple[int, ...]]) -> list[tuple[int, ...]]:
    shapes = []
    for index, dims in enumerate(dimensions_list):
        shape = tuple(dims)
        if all(type(d) is int and d >= 0 for d in shape):  # what Flower passes (ndarray.shape): as is
            shapes.append(shape)
            continue
        if any(isinstance(d, bool) or not isinstance(d, (int, np.integer)) or d < 0 for d in shape):
            raise ValueError(f"dimensions_list[{index}] must be a tuple of non-negative ints, found {dims!r}.")
        shapes.append(tuple(int(d) for d in shape))
    return shapes


def _uniform_below(key: bytes, num_range: int, count: int) -> np.ndarray:
    """The first ``count`` accepted keystream words, each reduced mod ``num_range``.

    Words are little-endian 32-bit when ``num_range <= 2**32`` (SecAgg+'s modulus), else 64-bit.
    Rejection sampling (exact): a word w is accepted iff w < limit, the largest multiple of num_range
    not above 2**bits, so w mod num_range is exactly uniform on [0, num_range). A word is rejected with
    probability (2**bits mod num_range) / 2**bits < 1/2 (zero for a power of two such as 2**32). The
    output is the accepted words in stream order, so it does not depend on how many words each batch
    reads.
    """
    bits = 32 if num_range <= 1 << 32 else 64
    word = np.dtype("<u4") if bits == 32 else np.dtype("<u8")
    span = 1 << bits
    limit = span - (span % num_range)  # in (2**(bits-1), 2**bits]
    # AES-256 in CTR mode from counter block 0: the key is unique per seed, so the nonce may be fixed.
    encryptor = Cipher(algorithms.AES(key), modes.CTR(bytes(16))).encryptor()
    if limit == span:  # a power-of-two range: every word is accepted (SecAgg+'s 2**32 modulus)
        values = np.frombuffer(encryptor.update(bytes(count * word.itemsize)), dtype=word).astype(np.int64)
        return values if num_range == span else values % num_range
    out = np.empty(count, dtype=np.uint64)
    filled = 0
    while filled < count:
        need = count - filled
        batch = need + need // 64 + 16  # a margin so one batch almost always suffices
        words = np.frombuffer(encryptor.update(bytes(batch * word.itemsize)), dtype=word).astype(np.uint64)
        words = words[words < np.uint64(limit)]
        take = min(need, words.size)
        out[filled : filled + take] = words[:take]
        filled += take
    return (out % np.uint64(num_range)).astype(np.int64)


def aes_mask_gen(seed: bytes, num_range: int, dimensions_list: Sequence[tuple[int, ...]]) -> list[np.ndarray]:
    """Masks uniform on ``[0, num_range)``, one int64 array per shape, from AES-256-CTR keyed by ``seed``.

    Same signature and output layout as flwr 1.41.0's ``pseudo_rand_gen``. The arrays are consecutive
    slices of one stream: the same seed and shapes always give the same masks, on client and server.

    Parameters
    ----------
    seed : bytes
        The mask seed.
    num_range : int
        The masks are uniform on ``[0, num_range)``, ``1 <= num_range <= 2**63``.
    dimensions_list : sequence of tuple of int
        One shape per array (``()`` for a 0-d array).

    Returns
    -------
    list of numpy.ndarray
        One int64 array per shape.

    Raises
    ------
    TypeError
        For a bad seed or range type.
    ValueError
        For an empty seed, a range out of bounds, or a bad shape.

    Examples
    --------
    >>> masks = aes_mask_gen(b"seed", 10, [(5,)])
    >>> masks[0].dtype, bool(((masks[0] >= 0) & (masks[0] < 10)).all())
    (dtype('int64'), True)
    >>> aes_mask_gen(b"seed", 10, [(2,), (3,)])[0].tolist() == masks[0][:2].tolist()  # one stream
    True
    """
    key = mask_key(seed)
    value_range = _check_range(num_range)
    shapes = _check_shapes(dimensions_list)
    sizes = [math.prod(shape) for shape in shapes]  # exact ints (np.prod costs ~4 us a call, 30 calls a device)
    stream = _uniform_below(key, value_range, sum(sizes))
    output: list[np.ndarray] = []
    start = 0
    for shape, size in zip(shapes, sizes, strict=True):
        output.append(stream[start : start + size].reshape(shape).copy())
        start += size
    return output


def _flower_modules() -> dict[str, ModuleType]:
    modules = {name: importlib.import_module(name) for name in _FLOWER_MODULES}
    for attribute, (_, names) in _overrides().items():
        for name in names:
            if not hasattr(modules[name], attribute):
                raise RuntimeError(
                    f"{name} has no {attribute}: this Flower version differs from the ones the override was "
                    "checked against (flwr 1.41.0, 1.42.0); review protocol/secagg/masks.py."
                )
    return modules


def use_cryptographic_masks() -> None:
    """Replace Flower's SecAgg+ mask generator, Shamir sharing, key agreement and share encryption by
    fedfilter's in this process (idempotent): in the modules listed in ``_overrides`` and, for the masks
    and Shamir, in any other loaded ``flwr`` module that holds Flower's original under the same name.

    Must run in every process that runs either side of a SecAgg+ round; ``cryptographic_masks`` does
    the same for a ``with`` block.

    Raises
    ------
    RuntimeError
        If the installed Flower lacks a call site the override was checked against.

    Examples
    --------
    >>> was = cryptographic_masks_installed()
    >>> use_cryptographic_masks()
    >>> cryptographic_masks_installed()
    True
    >>> if not was:
    ...     restore()
    """
    if cryptographic_masks_installed():
        # The device's mod calls this at every SecAgg+ message: the sweep of sys.modules below cost about
        # 0.9 ms a call (0.4 s of a 100-device round). A flwr module loaded after the first install that
        # imports a primitive by name gets the replacement from the (replaced) defining module.
        return
    modules = _flower_modules()
    for attribute, (replacement, names) in _overrides().items():
        original = _originals.get((names[0], attribute), getattr(modules[names[0]], attribute))
        targets = [modules[name] for name in names]
        # A copy in one call: a thread importing meanwhile (a simulation's) changes sys.modules.
        for name, module in sys.modules.copy().items():
            if (
                attribute in _SWEPT
                and name.startswith("flwr")
                and module is not None
                and getattr(module, attribute, None) is original
            ):
                targets.append(module)
        for module in targets:
            current = getattr(module, attribute)
            if current is replacement:
                continue
            _originals.setdefault((module.__name__, attribute), current)
            setattr(module, attribute, replacement)


def cryptographic_masks_installed() -> bool:
    """True when every known Flower call site uses fedfilter's masks, Shamir sharing, key agreement and
    share encryption.

    Returns
    -------
    bool
        Whether the override is fully installed in this process.

    Examples
    --------
    >>> with cryptographic_masks():
    ...     cryptographic_masks_installed()
    True
    """
    modules = _flower_modules()
    return all(
        getattr(modules[name], attribute) is replacement
        for attribute, (replacement, names) in _overrides().items()
        for name in names
    )


def restore() -> None:
    """Put Flower's own primitives back wherever ``use_cryptographic_masks`` replaced them (for tests).

    Examples
    --------
    >>> was = cryptographic_masks_installed()
    >>> use_cryptographic_masks()
    >>> restore()
    >>> cryptographic_masks_installed()
    False
    >>> if was:
    ...     use_cryptographic_masks()
    """
    replacements = {attribute: replacement for attribute, (replacement, _) in _overrides().items()}
    for (name, attribute), original in list(_originals.items()):
        module = sys.modules.get(name)
        if module is not None and getattr(module, attribute, None) is replacements[attribute]:
            setattr(module, attribute, original)
        del _originals[(name, attribute)]


@contextmanager
def cryptographic_masks() -> Iterator[None]:
    """Install the override for the duration of a ``with`` block, then restore Flower's primitives.

    If the override was installed before the block, it stays installed after it.

    Yields
    ------
    None

    Examples
    --------
    >>> import flwr.common.secure_aggregation.secaggplus_utils as utils
    >>> with cryptographic_masks():
    ...     utils.pseudo_rand_gen is aes_mask_gen
    True
    """
    already = cryptographic_masks_installed()
    use_cryptographic_masks()
    try:
        yield
    finally:
        if not already:
            restore()
