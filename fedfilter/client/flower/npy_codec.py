"""Flower ``Array`` <-> numpy for the mod's hot path, byte for byte what Flower itself does.

Flower stores an ``Array`` as the bytes of ``np.save`` and reads it with ``np.load``, which parses
the ``.npy`` header with ``ast.literal_eval``: about 0.1 ms per array, paid for every array the
mod reads (the model received, the model the handler returned) and writes (the report). Here:

* ``decode`` reads the one header form ``np.save`` writes for a plain C-order numeric array with a
  strict pattern and copies the data (as ``np.load`` does: a writeable array of its own); anything
  else (another header version, Fortran order, any other dtype, a size that does not match) goes
  to ``Array.numpy()`` unchanged, so it fails or succeeds exactly as before;
* ``encode`` builds the same ``Array`` as ``Array(ndarray)``: the header ``np.save`` writes for
  that dtype and shape (computed once per (dtype, shape) by ``np.save`` itself) and the array's
  bytes in C order. ``tests/client/flower/test_npy_codec.py`` checks both against Flower's own.
"""

from __future__ import annotations

import io
import math
import re
import threading

import numpy as np
from flwr.app import Array

from fedfilter.protocol.flower_api import SType

__all__ = ["decode", "encode"]

_MAGIC_V1 = b"\x93NUMPY\x01\x00"
# The header np.save writes (format 1.0) for a C-order array of a little-endian, byte or bool
# numeric dtype: no other form is taken by the fast path.
_HEADER = re.compile(
    rb"\{'descr': '([<|][fiub][1248])', 'fortran_order': False, 'shape': \(((?:\d+, )*\d*|\d+,)\), \} *\n"
)
_headers: dict[tuple[str, tuple[int, ...]], bytes] = {}
_headers_lock = threading.Lock()


def decode(array: Array) -> np.ndarray:
    """``array.numpy()``, without the header's ``ast.literal_eval`` when it has np.save's plain form.

    Parameters
    ----------
    array : Array
        A Flower ``Array``; any form other than np.save's plain one goes to ``array.numpy()``.

    Returns
    -------
    numpy.ndarray
        A writeable copy of the array's data.

    Examples
    --------
    >>> import numpy as np
    >>> decode(Array(np.arange(3, dtype=np.int32)))
    array([0, 1, 2], dtype=int32)
    """
    data = array.data
    if array.stype == SType.NUMPY and isinstance(data, bytes) and data[:8] == _MAGIC_V1 and len(data) >= 10:
        header_len = int.from_bytes(data[8:10], "little")
        match = _HEADER.fullmatch(data, 10, 10 + header_len)
        if match is not None:
            dtype = np.dtype(match.group(1).decode())
            shape = tuple(int(s) for s in match.group(2).decode().replace(",", " ").split())
            count = math.prod(shape)
            offset = 10 + header_len
            if len(data) == offset + count * dtype.itemsize:
                return np.frombuffer(data, dtype=dtype, count=count, offset=offset).reshape(shape).copy()
    return array.numpy()


def _header(dtype: np.dtype, shape: tuple[int, ...]) -> bytes:
    key = (dtype.str, shape)
    header = _headers.get(key)
    if header is None:
        buffer = io.BytesIO()
        np.save(buffer, np.zeros(shape, dtype=dtype), allow_pickle=False)
        header = buffer.getvalue()[: -dtype.itemsize * math.prod(shape) or None]
        with _headers_lock:
            if len(_headers) > 4096:  # models have a few hundred arrays at most
                _headers.clear()
            _headers[key] = header
    return header


def encode(ndarray: np.ndarray) -> Array:
    """The ``Array`` that ``Array(np.array(ndarray, order="C"))`` builds, for a numeric array.

    Parameters
    ----------
    ndarray : numpy.ndarray
        The array to send (a non-numeric dtype goes through ``Array`` itself).

    Returns
    -------
    Array
        Byte for byte the ``Array`` Flower would build.

    Examples
    --------
    >>> import numpy as np
    >>> a = np.arange(6, dtype=np.float32).reshape(2, 3)
    >>> encode(a).data == Array(a).data
    True
    >>> decode(encode(a)).shape
    (2, 3)
    """
    a = np.asarray(ndarray, order="C")  # not ascontiguousarray: that makes a 0-d array 1-d
    if a.dtype.hasobject or a.dtype.fields is not None or a.dtype.subdtype is not None:
        return Array(np.array(a, order="C"))
    data = _header(a.dtype, a.shape) + a.tobytes()
    return Array(dtype=str(a.dtype), shape=tuple(a.shape), stype=SType.NUMPY, data=data)
