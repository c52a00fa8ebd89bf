"""The sandbox's plain-data codec: what crosses between a program and its checks, and what cannot."""

from __future__ import annotations

import math
from collections import Counter, OrderedDict, namedtuple

import pytest

from viasd.tasks.sandbox.codec import CrossError, decode, encode, frame, unframe_length

PLAIN = [None, True, False, 0, -(10**30), 2.5, "é\n", b"\x00\xff", 1 - 2j, [], (), set(), frozenset(), {},
         [1, (2, [3]), {4: {5: b"6"}}, {(7, 8)}, frozenset({"9"})], {"a": None, 1: 1.0, (1, 2): [True]}]  # fmt: skip


@pytest.mark.parametrize("value", PLAIN, ids=range(len(PLAIN)))
def test_plain_data_round_trips_with_its_exact_types(value):
    back = decode(encode(value))
    assert back == value and repr(back) == repr(value)


def test_nan_and_infinities_cross():
    back = decode(encode([math.nan, math.inf, -math.inf]))
    assert math.isnan(back[0]) and back[1:] == [math.inf, -math.inf]


def test_subclasses_cross_as_their_base_type():
    class Always(int):
        def __eq__(self, other):
            return True

        __hash__ = int.__hash__

    point = namedtuple("point", "x y")
    values = [Always(3), Counter("aab"), point(1, 2), OrderedDict(a=1)]
    back = decode(encode(values))
    assert back == [3, {"a": 2, "b": 1}, (1, 2), {"a": 1}]
    assert [type(v) for v in back] == [int, dict, tuple, dict]


@pytest.mark.parametrize("value", [object(), [print], {1: iter([])}, type, lambda: 0],
                         ids=["object", "builtin-in-list", "iterator-in-dict", "type", "lambda"])
def test_anything_else_cannot_cross(value):
    with pytest.raises(CrossError, match="cannot cross"):
        encode(value)


def test_deep_or_huge_values_fail_cleanly():
    deep: list = []
    for _ in range(100_000):
        deep = [deep]
    with pytest.raises(CrossError):
        encode(deep)
    with pytest.raises(CrossError):
        encode(10**5000)  # past the interpreter's int-to-str limit


@pytest.mark.parametrize("data", [b"", b"[", b'["x", 1]', b'["b", 1]', b'["d", [[1], 2]]', b"{}", b"\xff"],
                         ids=["empty", "open-bracket", "unknown-tag", "bad-bytes", "bad-dict", "object", "not-utf8"])
def test_malformed_bytes_never_decode(data):
    with pytest.raises(CrossError):
        decode(data)


def test_frames():
    assert frame(b"abc") == b"00000003abc" and unframe_length(b"00000003") == 3
    for bad in (b"0000003", b"0000000g", b"-0000001"):
        with pytest.raises(CrossError):
            unframe_length(bad)
