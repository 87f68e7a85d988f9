"""numpy arrays and scalars on the data feed, as msgpack extension types, without pickle.

TensorFlowOnSpark pickles what its feed carries, so a map function that returns numpy
results (``tf_feed.batch_results(squares.numpy())``) hands numpy values back to Spark,
and ``rdd_out.sum()`` adds them. The feed port is reachable from the network, so we
never unpickle; instead an array travels as its dtype, shape and raw bytes::

    ext EXT_NDARRAY  = msgpack [dtype.str, [dim, ...], bytes]   -> numpy.ndarray
    ext EXT_NPSCALAR = msgpack [dtype.str, bytes]               -> numpy scalar (np.int32 ...)

Only plain data dtypes cross (bool, integers, floats, complex, datetimes, fixed-width
bytes/str): an object or structured dtype is refused when decoding, so no Python object
is ever built from peer bytes. Object arrays are sent as lists of their elements
instead. Where numpy is not importable (a feeder needs only msgpack), native-endian
numeric values decode to lists and Python numbers, as they did before numpy was carried.
"""

from __future__ import annotations

import math
import sys
from typing import Any

import msgpack

#: msgpack extension codes (0..127 are the application's).
EXT_NDARRAY = 1
EXT_NPSCALAR = 2
#: A dtype string is a few characters ("<f8", "<U12", "<M8[ns]"); more is not a dtype.
MAX_DTYPE_LEN = 32
#: numpy's own limit on dimensions is 64; TensorFlow tensors have far fewer.
MAX_NDIM = 64
#: Kinds carried as raw bytes: bool, signed, unsigned, float, complex, timedelta,
#: datetime, bytes, str. Not "O" (Python objects) nor "V" (structured, may hold objects).
DATA_KINDS = frozenset("biufcmMSU")
#: Without numpy: struct formats of the native-endian numeric dtypes, by (kind, itemsize).
_FORMATS = {
    ("b", 1): "?",
    ("i", 1): "b",
    ("i", 2): "h",
    ("i", 4): "i",
    ("i", 8): "q",
    ("u", 1): "B",
    ("u", 2): "H",
    ("u", 4): "I",
    ("u", 8): "Q",
    ("f", 2): "e",
    ("f", 4): "f",
    ("f", 8): "d",
}

#: numpy, or None: typed Any so the checker sees both branches of ``_np is not None``.
_np: Any
try:
    import numpy as _np
except ImportError:  # a feeder without numpy: decode to plain Python (see _plain)
    _np = None


def is_numpy(obj: Any) -> bool:
    module = type(obj).__module__
    return module == "numpy" or module.startswith("numpy.")


def encode(obj: Any) -> Any:
    """msgpack's ``default`` hook for numpy values: an ExtType, or a list for object arrays.

    Raises:
        TypeError: ``obj`` is not a numpy array or scalar (msgpack's own signal).
    """
    if not is_numpy(obj) or not hasattr(obj, "dtype"):
        raise TypeError(f"cannot serialize {type(obj).__module__}.{type(obj).__qualname__}")
    dtype = obj.dtype
    if dtype.kind not in DATA_KINDS:
        return obj.tolist()  # object/structured: their elements, each packed on its own
    if getattr(obj, "ndim", None) is not None and not isinstance(obj, _np.generic):
        body = [dtype.str, list(obj.shape), obj.tobytes()]
        return msgpack.ExtType(EXT_NDARRAY, msgpack.packb(body, use_bin_type=True))
    return msgpack.ExtType(EXT_NPSCALAR, msgpack.packb([dtype.str, obj.tobytes()], use_bin_type=True))


def decode(code: int, data: bytes) -> Any:
    """msgpack's ``ext_hook``: the numpy value an extension carries.

    Raises:
        ValueError: an unknown code, a malformed body, a dtype that is not plain data, or
            bytes that do not match the dtype and shape (the frame is then refused whole).
    """
    if code not in (EXT_NDARRAY, EXT_NPSCALAR):
        raise ValueError(f"unknown extension type {code}")
    body = msgpack.unpackb(
        data, raw=False, max_str_len=MAX_DTYPE_LEN, max_array_len=MAX_NDIM, max_map_len=0, max_ext_len=0
    )
    if code == EXT_NDARRAY:
        if not (isinstance(body, list) and len(body) == 3):
            raise ValueError("a numpy array must be [dtype, shape, bytes]")
        dstr, shape, raw = body
        if not (isinstance(shape, list) and all(type(d) is int and d >= 0 for d in shape)):
            raise ValueError("a numpy array's shape must be a list of non-negative ints")
    else:
        if not (isinstance(body, list) and len(body) == 2):
            raise ValueError("a numpy scalar must be [dtype, bytes]")
        dstr, raw = body
        shape = None
    if not isinstance(dstr, str) or not isinstance(raw, bytes):
        raise ValueError("a numpy value's dtype must be a str and its data bytes")
    kind, itemsize, order = _parse(dstr)
    count = 1 if shape is None else math.prod(shape)
    if count * itemsize != len(raw):
        raise ValueError(f"{len(raw)} bytes do not hold {count} item(s) of dtype {dstr!r}")
    if _np is not None:
        dtype = _np.dtype(dstr)
        if dtype.kind not in DATA_KINDS or dtype.itemsize != itemsize:
            raise ValueError(f"dtype {dstr!r} is not plain data")
        if shape is None:
            return _np.frombuffer(raw, dtype=dtype)[0]
        if itemsize == 0:
            return _np.zeros(shape, dtype=dtype)
        # A copy: frombuffer over bytes is read-only, and a map function may write to it.
        return _np.frombuffer(raw, dtype=dtype).reshape(shape).copy()
    return _plain(kind, itemsize, order, dstr, raw, shape)


def _parse(dstr: str) -> tuple[str, int, str]:
    """(kind, itemsize, byte order) of a dtype string such as '<f8', '|b1', '<U3', '<M8[ns]'."""
    if len(dstr) < 3 or dstr[0] not in "<>|=" or dstr[1] not in DATA_KINDS:
        raise ValueError(f"dtype {dstr[:MAX_DTYPE_LEN]!r} is not plain data")
    digits = dstr[2:].split("[", 1)[0]
    if not digits.isdigit():
        raise ValueError(f"dtype {dstr!r} is not plain data")
    itemsize = int(digits) * (4 if dstr[1] == "U" else 1)  # '<U3' is 3 characters of 4 bytes
    return dstr[1], itemsize, dstr[0]


def _plain(kind: str, itemsize: int, order: str, dstr: str, raw: bytes, shape: list[int] | None) -> Any:
    native = "<" if sys.byteorder == "little" else ">"
    fmt = _FORMATS.get((kind, itemsize))
    if fmt is None or (itemsize > 1 and order != native):
        raise ValueError(f"a numpy value of dtype {dstr!r} arrived; install numpy to receive it")
    # Any: typeshed types memoryview.cast by literal formats, and fmt is one of _FORMATS'.
    raw_view: Any = memoryview(raw)
    view = raw_view.cast(fmt)
    if shape is None or not shape:
        return view[0]
    if 0 in shape:
        return _empty(shape)
    return raw_view.cast(fmt, shape).tolist()


def _empty(shape: list[int]) -> Any:
    if shape[0] == 0:
        return []
    return [_empty(shape[1:]) for _ in range(shape[0])]
