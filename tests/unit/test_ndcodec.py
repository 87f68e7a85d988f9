"""numpy values on the feed (ndcodec): exact round trips, and hostile bodies refused."""

from __future__ import annotations

import msgpack
import numpy as np
import pytest

from tfcoord.client import ndcodec


def _trip(value):
    ext = ndcodec.encode(value)
    return ndcodec.decode(ext.code, ext.data)


@pytest.mark.parametrize(
    "value",
    [
        np.arange(12, dtype=np.float16).reshape(3, 4),
        np.arange(10, dtype=np.int64)[::3],  # not contiguous
        np.array(3, dtype=np.uint8),  # 0-d
        np.zeros((2, 0, 5)),
        np.array([1 + 2j]),
        np.array(["2026-12-04"], dtype="datetime64[ns]"),
        np.array([b"ab", b""]),
        np.arange(4, dtype=">i4"),  # big-endian stays big-endian
    ],
)
def test_arrays_round_trip_exactly(value):
    got = _trip(value)
    assert type(got) is np.ndarray and got.dtype == value.dtype and got.shape == value.shape
    assert np.array_equal(got, value)


@pytest.mark.parametrize("value", [np.int8(-3), np.uint64(2**64 - 1), np.float32(0.1), np.bool_(False)])
def test_scalars_round_trip_as_scalars(value):
    got = _trip(value)
    assert type(got) is type(value) and got == value


@pytest.mark.parametrize(
    ("body", "why"),
    [
        (["|O8", [1], b"\0" * 8], "not plain data"),  # Python objects: never built from peer bytes
        (["|V8", [1], b"\0" * 8], "not plain data"),
        (["i4,f8", [1], b"\0" * 12], "not plain data"),
        (["<f8", [2], b"\0" * 8], "do not hold"),
        (["<f8", [-1], b""], "non-negative"),
        (["<f8", [2**62, 2**62], b""], "do not hold"),
        (["<f8", [1]], r"\[dtype, shape, bytes\]"),
        (["x" * 40, [1], b"\0"], "exceeds"),
    ],
)
def test_hostile_array_bodies_are_refused(body, why):
    with pytest.raises(ValueError, match=why):
        ndcodec.decode(ndcodec.EXT_NDARRAY, msgpack.packb(body, use_bin_type=True))


def test_an_unknown_extension_is_refused():
    with pytest.raises(ValueError, match="unknown extension type 9"):
        ndcodec.decode(9, b"")


def test_without_numpy_native_numbers_decode_to_plain_python(monkeypatch):
    arr, scalar = ndcodec.encode(np.arange(6, dtype=np.int32).reshape(2, 3)), ndcodec.encode(np.float32(0.5))
    text = ndcodec.encode(np.array(["a"]))
    monkeypatch.setattr(ndcodec, "_np", None)  # a feeder with only msgpack installed
    assert ndcodec.decode(arr.code, arr.data) == [[0, 1, 2], [3, 4, 5]]
    assert ndcodec.decode(scalar.code, scalar.data) == 0.5
    with pytest.raises(ValueError, match="install numpy"):
        ndcodec.decode(text.code, text.data)
