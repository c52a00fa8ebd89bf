"""The plain-data codec of the code sandbox: the only form in which values cross between a
sample's program process and the checks (which run in the harness, see ``docs/sandbox.md``).

This module owns :func:`encode`/:func:`decode` and the frame format. It imports only the
standard library and its source is also sent, verbatim, to the sandboxed driver (which
cannot import :mod:`viasd`), so both sides run the same code. Plain data is exactly: None,
bool, int, float, complex, str, bytes, and lists, tuples, sets, frozensets and dicts of
plain data (an instance of a subclass crosses as its base type's value: a ``Counter`` as
a dict, a namedtuple as a tuple, an ``int`` whose ``__eq__`` always answers True as that
int; an object of any other class cannot cross). Values are JSON with containers tagged (``["l", …]``, ``["t", …]``,
``["s", …]``, ``["f", …]``, ``["d", [k, v], …]``, ``["b", hex]``, ``["c", re, im]``), so
decoding never runs code or builds anything but plain data.
"""

import json

__all__ = ["CrossError", "decode", "encode", "frame", "unframe_length"]

FRAME_HEADER = 8  # hex digits of the payload length


class CrossError(ValueError):
    """A value that is not plain data (or bytes that do not decode to plain data)."""


_SCALARS = (type(None), bool, int, float, str)
_SEQ_TAGS = {list: "l", tuple: "t", set: "s", frozenset: "f"}
_SEQ_TYPES = {"l": list, "t": tuple, "s": set, "f": frozenset}


# A subclass of a plain type crosses as its base type's value (a Counter as a dict, a
# namedtuple as a tuple, an int whose __eq__ always answers True as that int).
_BASES = (
    (int, int.__int__),
    (float, float.__float__),
    (str, str.__str__),
    (bytes, lambda b: bytes(memoryview(b))),
)


def _tag(x):
    t = type(x)
    if t in _SCALARS:
        return x
    for base, value in _BASES:
        if isinstance(x, base):
            return _tag(value(x)) if t is not bytes else ["b", x.hex()]
    for base, tag in _SEQ_TAGS.items():
        if isinstance(x, base):
            return [tag] + [_tag(v) for v in base.__iter__(x)]
    if isinstance(x, dict):
        return ["d"] + [[_tag(k), _tag(v)] for k, v in dict.items(x)]
    if isinstance(x, complex):
        return ["c", complex.__getattribute__(x, "real"), complex.__getattribute__(x, "imag")]
    raise CrossError(f"a {t.__name__} cannot cross (only plain data: numbers, strings, bytes, containers)")


def _untag(x):
    if type(x) in _SCALARS:
        return x
    if type(x) is not list or not x or type(x[0]) is not str:
        raise CrossError("malformed value")
    tag, rest = x[0], x[1:]
    if tag in _SEQ_TYPES:
        return _SEQ_TYPES[tag](_untag(v) for v in rest)
    if tag == "d":
        return {_untag(k): _untag(v) for k, v in rest}
    if tag == "b" and len(rest) == 1 and type(rest[0]) is str:
        return bytes.fromhex(rest[0])
    if tag == "c" and len(rest) == 2:
        return complex(rest[0], rest[1])
    raise CrossError("malformed value")


def encode(x) -> bytes:
    """``x`` (plain data) as bytes; CrossError when any part of it is not plain data."""
    try:
        return json.dumps(_tag(x), allow_nan=True, separators=(",", ":")).encode()
    except CrossError:
        raise
    except (ValueError, TypeError, RecursionError) as e:
        raise CrossError(f"the value cannot cross ({type(e).__name__})") from None


def decode(data: bytes):
    """The plain data ``data`` encodes; CrossError for anything else (never runs code)."""
    try:
        return _untag(json.loads(data))
    except CrossError:
        raise
    except (ValueError, TypeError, RecursionError, UnicodeDecodeError) as e:
        raise CrossError(f"malformed value ({type(e).__name__})") from None


def frame(payload: bytes) -> bytes:
    """``payload`` with its length header (8 hex digits)."""
    return b"%08x" % len(payload) + payload


def unframe_length(header: bytes) -> int:
    """The payload length a frame header announces; CrossError when it is not one."""
    if len(header) != FRAME_HEADER or not all(c in b"0123456789abcdef" for c in header):
        raise CrossError("malformed frame")
    return int(header, 16)
