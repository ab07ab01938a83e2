"""msgpack framing with a protocol version, and checked reading of message bodies.

Every message is the msgpack array [version, type, body] where body is a map. Decoding
never trusts the peer: sizes, types and ranges are checked, and any violation raises
ProtocolError, which receivers log and answer or drop. Only msgpack crosses a socket.
"""

from __future__ import annotations

import sys
from array import array
from typing import Any

import msgpack

PROTOCOL_VERSION = 1
MAX_MESSAGE_BYTES = 64 * 2**20
MAX_TOKENS_PER_MESSAGE = 1 << 22
MAX_ID_LEN = 256
MAX_TOKEN_ID = 2**31 - 1
MAX_BLOCK_ID = 2**31 - 1
INT64 = (-(2**63), 2**63 - 1)


class ProtocolError(ValueError):
    """A message that is not valid Folio protocol: garbage, wrong version, bad field."""


def pack(msg_type: str, body: dict[str, Any]) -> bytes:
    return msgpack.packb([PROTOCOL_VERSION, msg_type, body], use_bin_type=True)


def unpack(data: bytes, max_bytes: int = MAX_MESSAGE_BYTES) -> tuple[str, dict[str, Any]]:
    if len(data) > max_bytes:
        raise ProtocolError(f"message of {len(data)} bytes exceeds the limit of {max_bytes}")
    try:
        obj = msgpack.unpackb(data, raw=False, strict_map_key=True, max_str_len=max_bytes,
                              max_bin_len=max_bytes, max_array_len=MAX_TOKENS_PER_MESSAGE,
                              max_map_len=1 << 16, max_ext_len=0)
    except Exception as error:   # msgpack raises several unrelated types
        raise ProtocolError(f"not a msgpack message: {type(error).__name__}: {error}") from None
    if not isinstance(obj, list) or len(obj) != 3:
        raise ProtocolError("a message must be the array [version, type, body]")
    version, msg_type, body = obj
    if version != PROTOCOL_VERSION:
        raise ProtocolError(f"protocol version {version!r} is not supported "
                            f"(this build speaks {PROTOCOL_VERSION})")
    if not isinstance(msg_type, str):
        raise ProtocolError("message type must be a string")
    if not isinstance(body, dict):
        raise ProtocolError(f"{msg_type}: body must be a map")
    return msg_type, body


class Body:
    """Typed, range-checked reads from one message body."""

    def __init__(self, msg_type: str, body: dict[str, Any]) -> None:
        self.msg_type = msg_type
        self.body = body

    def _get(self, name: str, optional: bool) -> Any:
        if name not in self.body:
            if optional:
                return None
            raise ProtocolError(f"{self.msg_type}: missing field {name!r}")
        return self.body[name]

    def fail(self, name: str, rule: str) -> ProtocolError:
        return ProtocolError(f"{self.msg_type}: field {name!r} must be {rule}")

    def int(self, name: str, low: int = INT64[0], high: int = INT64[1],
            optional: bool = False) -> int | None:
        value = self._get(name, optional)
        if value is None and optional:
            return None
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            raise self.fail(name, f"an integer in [{low}, {high}]")
        return value

    def float(self, name: str, optional: bool = False) -> float | None:
        value = self._get(name, optional)
        if value is None and optional:
            return None
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise self.fail(name, "a number")
        return float(value)

    def str(self, name: str, max_len: int = MAX_ID_LEN, optional: bool = False) -> str | None:
        value = self._get(name, optional)
        if value is None and optional:
            return None
        if not isinstance(value, str) or len(value) > max_len:
            raise self.fail(name, f"a string of at most {max_len} characters")
        return value

    def bool(self, name: str, default: bool = False) -> bool:
        value = self.body.get(name, default)
        if not isinstance(value, bool):
            raise self.fail(name, "a boolean")
        return value

    def ints(self, name: str, low: int = 0, high: int = INT64[1],
             max_len: int = MAX_TOKENS_PER_MESSAGE, optional: bool = False) -> list[int]:
        value = self._get(name, optional)
        if value is None and optional:
            return []
        return check_ints(value, low, high, max_len, lambda rule: self.fail(name, rule))

    def list(self, name: str, max_len: int = 1 << 16, optional: bool = False) -> list[Any]:
        value = self._get(name, optional)
        if value is None and optional:
            return []
        if not isinstance(value, list) or len(value) > max_len:
            raise self.fail(name, f"a list of at most {max_len} items")
        return value

    def map(self, name: str, optional: bool = False) -> dict[str, Any]:
        value = self._get(name, optional)
        if value is None and optional:
            return {}
        if not isinstance(value, dict):
            raise self.fail(name, "a map")
        return value

    def pairs(self, name: str, high: int) -> list[tuple[int, int]]:
        flat = self.ints(name, 0, high, optional=True)
        if len(flat) % 2:
            raise self.fail(name, "a flat list of (source, destination) pairs")
        return list(zip(flat[0::2], flat[1::2]))


_INT_ONLY = frozenset({int})
# [0, 2**31 - 1] and [0, 2**63 - 1] (token ids, handles, counts: every per-step list) are
# checked in three C passes: exact types, an array's unsigned conversion (which refuses
# anything negative, too big or not an int), then the top bit of each item's bytes.
# high -> (array type code, item size, index of the top byte in an item)
_UNSIGNED = {high: (code, size, size - 1 if sys.byteorder == "little" else 0)
             for high, code, size in ((2**31 - 1, "I", 4), (2**63 - 1, "Q", 8))
             if array(code).itemsize == size}


def check_ints(value: Any, low: int, high: int, max_len: int, fail) -> list[int]:
    """`value` if it is a list of at most max_len ints (not bools) in [low, high], else
    raises fail(rule). What the unsigned fast test does not accept, check_ints_general
    accepts or refuses with its usual message."""
    unsigned = _UNSIGNED.get(high) if low == 0 else None
    if (unsigned is not None and type(value) is list and len(value) <= max_len
            and _INT_ONLY.issuperset(map(type, value))):
        code, size, top = unsigned
        try:
            words = array(code, value).tobytes()
        except OverflowError:
            pass
        else:
            if words[top::size].isascii():   # every top bit clear: each item <= high
                return value
    return check_ints_general(value, low, high, max_len, fail)


def check_ints_general(value: Any, low: int, high: int, max_len: int, fail) -> list[int]:
    if not isinstance(value, list) or len(value) > max_len:
        raise fail(f"a list of at most {max_len} integers")
    # type() is int excludes bools; map/min/max run in C, which matters on the per-step path.
    if value and not (_INT_ONLY.issuperset(map(type, value))
                      and low <= min(value) and max(value) <= high):
        raise fail(f"a list of integers in [{low}, {high}]")
    return value
