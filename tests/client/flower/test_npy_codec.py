"""The mod's Array codec gives exactly what Flower's own ``Array(ndarray)`` / ``Array.numpy()`` give."""

from __future__ import annotations

import io

import numpy as np
import pytest
from flwr.app import Array
from flwr.common.constant import SType

from fedfilter.client.flower.npy_codec import decode, encode

RNG = np.random.default_rng(3)
ARRAYS = [
    RNG.standard_normal((16, 1, 8, 8)).astype(np.float32),
    RNG.standard_normal((32,)).astype(np.float64),
    RNG.standard_normal(()).astype(np.float32),  # a 0-d array
    np.zeros((0, 5), dtype=np.float32),
    np.arange(7, dtype=np.int64),
    np.array([True, False]),
    np.arange(6, dtype=np.uint8).reshape(2, 3),
    RNG.standard_normal((3, 4)).astype(np.float16),
    RNG.standard_normal((5, 6)).astype(np.float32)[:, ::2],  # not contiguous
    np.asfortranarray(RNG.standard_normal((4, 3))),
]


def _same(a: np.ndarray, b: np.ndarray) -> None:
    assert a.dtype == b.dtype and a.shape == b.shape
    assert a.tobytes() == b.tobytes()  # bitwise, NaN payloads and -0.0 included
    assert a.flags.writeable and b.flags.writeable


@pytest.mark.parametrize("a", ARRAYS, ids=lambda a: f"{a.dtype}{a.shape}")
def test_encode_is_byte_for_byte_flowers_array(a):
    ours, flowers = encode(a), Array(np.array(a, order="C"))
    fields = ("dtype", "shape", "stype", "data")
    assert [getattr(ours, f) for f in fields] == [getattr(flowers, f) for f in fields]


@pytest.mark.parametrize("a", ARRAYS, ids=lambda a: f"{a.dtype}{a.shape}")
def test_decode_is_flowers_numpy(a):
    array = Array(np.array(a, order="C"))
    _same(decode(array), array.numpy())
    assert not np.shares_memory(decode(array), np.frombuffer(array.data, dtype=np.uint8))  # an array of its own


def _npy(a: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, a, allow_pickle=False)
    return buffer.getvalue()


@pytest.mark.parametrize(
    "a",
    [
        np.asfortranarray(RNG.standard_normal((4, 3))),  # fortran_order True in the header
        RNG.standard_normal((3,)).astype(">f8"),  # big-endian
        np.zeros(3, dtype=[("x", "<f4"), ("y", "<i2")]),  # structured
        np.array([1 + 2j], dtype=np.complex64),
    ],
    ids=["fortran", "big-endian", "structured", "complex"],
)
def test_other_headers_go_to_flowers_numpy(a):
    array = Array(dtype=str(a.dtype), shape=tuple(a.shape), stype=SType.NUMPY, data=_npy(a))
    _same(decode(array), array.numpy())


def test_damaged_data_fails_exactly_as_flowers_numpy():
    good = _npy(np.arange(10, dtype=np.float32))
    for data in (good[:-3], good + b"\x00" * 4, good[:20], b"not an npy file at all"):
        array = Array(dtype="float32", shape=(10,), stype=SType.NUMPY, data=data)
        try:
            expected = array.numpy()
        except Exception as err:  # noqa: BLE001 - whatever Flower raises, ours must raise too
            with pytest.raises(type(err)):
                decode(array)
        else:
            _same(decode(array), expected)
