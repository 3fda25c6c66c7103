"""A cryptographic mask generator for Flower's SecAgg+, installed in place of Flower's own.

Why: Flower's ``pseudo_rand_gen`` (``flwr.common.secure_aggregation.secaggplus_utils``) XOR-folds the
shared seed (a 32-byte ECDH key or a 32-byte private seed) to 32 bits and draws the masks with numpy's
Mersenne Twister. Anyone who can try 2**32 seeds, or who sees enough of the stream, can strip a mask,
so the masks do not hide a device's report. Upstream: flwrlabs/flower#7522 (fix proposed in #7570).

``chacha_mask_gen`` keeps Flower's signature and output layout (one ``int64`` array per requested
shape, 0-d arrays for ``()``) but keys ChaCha20 with a domain-separated SHA-256 of the FULL seed and
draws uniformly in ``[0, num_range)`` by rejection sampling of 64-bit words, so there is no modulo
bias at all. (Flower draws ``randint(0, num_range - 1)``, i.e. in ``[0, num_range - 2]``: its masks
never take the value ``num_range - 1``; masks cancel either way, uniformity over Z_m is what the
SecAgg+ hiding argument needs.)

``use_cryptographic_masks()`` replaces the generator in every Flower module that imported it by name
(the client mod ``secaggplus_mod`` and the server ``secaggplus_workflow``; both must use the same
generator or the masks do not cancel), so it must run in every process that runs either side: the
ServerApp and each ClientApp (e.g. in a Ray actor). Checked against flwr 1.41.0 (the module and
attribute names below and the call sites' ``(seed, num_range, shapes)`` arguments). Remove this module
once upstream fixes #7522 and fedfilter requires that Flower version.

The math (``chacha_mask_gen``) imports only numpy and ``cryptography``; Flower is imported only by the
installer.
"""

from __future__ import annotations

import hashlib
import importlib
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from types import ModuleType

import numpy as np
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms

# Changing this tag changes every mask: both sides of a federation must run the same version.
_DOMAIN_TAG = b"fedfilter/secaggplus-mask/chacha20/v1"
_WORD_BYTES = 8
_TWO_64 = 1 << 64
# Output is int64, so a value must fit below 2**63.
_MAX_RANGE = 1 << 63

# Every flwr module that does `from ...secaggplus_utils import pseudo_rand_gen` (flwr 1.41.0), plus the
# defining module itself so that later `from ... import pseudo_rand_gen` also gets the override.
_FLOWER_MODULES = (
    "flwr.common.secure_aggregation.secaggplus_utils",
    "flwr.client.mod.secure_aggregation.secaggplus_mod",
    "flwr.server.workflow.secure_aggregation.secaggplus_workflow",
)
_ATTRIBUTE = "pseudo_rand_gen"

# module name -> Flower's original generator, while the override is installed.
_originals: dict[str, object] = {}


def mask_key(seed: bytes) -> bytes:
    """The 32-byte ChaCha20 key for ``seed``: SHA-256 over a domain tag, the seed's length and the seed."""
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
        if any(isinstance(d, bool) or not isinstance(d, (int, np.integer)) or d < 0 for d in shape):
            raise ValueError(f"dimensions_list[{index}] must be a tuple of non-negative ints, found {dims!r}.")
        shapes.append(tuple(int(d) for d in shape))
    return shapes


def _uniform_below(key: bytes, num_range: int, count: int) -> np.ndarray:
    """The first ``count`` accepted 64-bit keystream words, each reduced mod ``num_range``.

    Rejection sampling (exact): a little-endian 64-bit word w is accepted iff w < limit, the largest
    multiple of num_range not above 2**64, so w mod num_range is exactly uniform on [0, num_range).
    A word is rejected with probability (2**64 mod num_range) / 2**64 < num_range / 2**64 (below
    2**-32 for SecAgg+'s num_range <= 2**32, below 1/2 always). The output is the accepted words in
    stream order, so it does not depend on how many words each batch reads.
    """
    limit = _TWO_64 - (_TWO_64 % num_range)  # in (2**63, 2**64]
    # ChaCha20 with a 16-byte nonce (32-bit counter 0 || 96-bit nonce 0): the key is unique per seed.
    encryptor = Cipher(algorithms.ChaCha20(key, bytes(16)), mode=None).encryptor()
    out = np.empty(count, dtype=np.uint64)
    filled = 0
    while filled < count:
        need = count - filled
        batch = need + need // 64 + 16  # a margin so one batch almost always suffices
        words = np.frombuffer(encryptor.update(bytes(batch * _WORD_BYTES)), dtype="<u8")
        if limit < _TWO_64:
            words = words[words < np.uint64(limit)]
        take = min(need, words.size)
        out[filled : filled + take] = words[:take]
        filled += take
    return (out % np.uint64(num_range)).astype(np.int64)


def chacha_mask_gen(seed: bytes, num_range: int, dimensions_list: Sequence[tuple[int, ...]]) -> list[np.ndarray]:
    """Masks uniform on ``[0, num_range)``, one int64 array per shape, from ChaCha20 keyed by ``seed``.

    Same signature and output layout as flwr 1.41.0's ``pseudo_rand_gen``. The arrays are consecutive
    slices of one stream: the same seed and shapes always give the same masks, on client and server.
    """
    key = mask_key(seed)
    value_range = _check_range(num_range)
    shapes = _check_shapes(dimensions_list)
    sizes = [int(np.prod(shape, dtype=np.int64)) for shape in shapes]
    stream = _uniform_below(key, value_range, sum(sizes))
    output: list[np.ndarray] = []
    start = 0
    for shape, size in zip(shapes, sizes, strict=True):
        output.append(stream[start : start + size].reshape(shape).copy())
        start += size
    return output


def _flower_modules() -> list[ModuleType]:
    modules = [importlib.import_module(name) for name in _FLOWER_MODULES]
    for module in modules:
        if not hasattr(module, _ATTRIBUTE):
            raise RuntimeError(
                f"{module.__name__} has no {_ATTRIBUTE}: this Flower version differs from the one the "
                "override was checked against (flwr 1.41.0); review client/secagg_masks.py."
            )
    return modules


def use_cryptographic_masks() -> None:
    """Replace Flower's SecAgg+ mask generator by ``chacha_mask_gen`` in this process (idempotent).

    Patches the modules listed in ``_FLOWER_MODULES`` and any other loaded ``flwr`` module that holds
    Flower's original generator under that name.
    """
    modules = _flower_modules()
    original = _originals.get(_FLOWER_MODULES[0], getattr(modules[0], _ATTRIBUTE))
    for name, module in list(sys.modules.items()):
        if name.startswith("flwr") and module is not None and getattr(module, _ATTRIBUTE, None) is original:
            modules.append(module)
    for module in modules:
        current = getattr(module, _ATTRIBUTE)
        if current is chacha_mask_gen:
            continue
        _originals.setdefault(module.__name__, current)
        setattr(module, _ATTRIBUTE, chacha_mask_gen)


def cryptographic_masks_installed() -> bool:
    """True when every known Flower call site uses ``chacha_mask_gen``."""
    return all(getattr(module, _ATTRIBUTE) is chacha_mask_gen for module in _flower_modules())


def restore() -> None:
    """Put Flower's own generator back wherever ``use_cryptographic_masks`` replaced it (for tests)."""
    for name, original in list(_originals.items()):
        module = sys.modules.get(name)
        if module is not None and getattr(module, _ATTRIBUTE, None) is chacha_mask_gen:
            setattr(module, _ATTRIBUTE, original)
        del _originals[name]


@contextmanager
def cryptographic_masks() -> Iterator[None]:
    """Install the override for the duration of a ``with`` block, then restore Flower's generator."""
    already = cryptographic_masks_installed()
    use_cryptographic_masks()
    try:
        yield
    finally:
        if not already:
            restore()
