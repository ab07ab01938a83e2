"""The vocabulary every wire message is declared in: field kinds with their bounds, fields,
messages. Each message is declared once (shared/protocol/{client_frontend,frontend_scheduler,scheduler_executor,kv_map}.py,
stats.py); its encoder, its decoder, the catalogue of which link carries it
(catalogue.py) and its rows in docs/protocol.md (doc.py) come from that one
declaration.

A kind checks one decoded value (`read`), shapes one value for the wire (`wire`), and says
its type and bounds in the doc's words (`type_text`, `range_text`). Checks raise
ProtocolError through Body.fail, so every message names its type and field the same way.
Nothing is checked on encode: the sender is trusted, the receiver never is.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, NamedTuple

from folio.shared.sampling_params import sampling_from_wire
from folio.shared.protocol.wire import (INT64, MAX_ID_LEN, MAX_TOKENS_PER_MESSAGE, Body, ProtocolError,
                               check_ints, pack)

_SUPERSCRIPT = str.maketrans("0123456789", "⁰¹²³⁴⁵⁶⁷⁸⁹")


def number_text(value: float) -> str:
    """A bound as docs/protocol.md writes it: 2³¹−1, 2²², 65 536 → 2¹⁶, 4000."""
    if isinstance(value, float) and not value.is_integer():
        return str(value)
    value = int(value)
    if value < 0:
        return "−" + number_text(-value)
    for offset, suffix in ((0, ""), (1, "−1")):
        power = (value + offset).bit_length() - 1
        if power >= 16 and value + offset == 1 << power:
            return f"2{str(power).translate(_SUPERSCRIPT)}{suffix}"
    return str(value)


# ---- kinds ------------------------------------------------------------------------------

class Kind:
    """One value's type and bounds. Subclasses are frozen dataclasses."""

    type_text = "any"
    nil_is_absent = True   # an optional field sent as nil reads as absent (booleans: refused)

    def read(self, value: Any, body: Body, key: str) -> Any:
        return value

    def wire(self, value: Any) -> Any:
        return value

    def range_text(self) -> str:
        return ""


@dataclass(frozen=True)
class Int(Kind):
    low: int = INT64[0]
    high: int = INT64[1]
    type_text = "int"

    def read(self, value, body, key):
        if isinstance(value, bool) or not isinstance(value, int) \
                or not self.low <= value <= self.high:
            raise body.fail(key, f"an integer in [{self.low}, {self.high}]")
        return value

    def range_text(self):
        if self.high == INT64[1]:
            return "" if self.low == INT64[0] else f"≥ {number_text(self.low)}"
        return f"[{number_text(self.low)}, {number_text(self.high)}]"


@dataclass(frozen=True)
class Float(Kind):
    """A number (an int is read as a float). `low_open`: the low bound is excluded."""

    low: float | None = None
    high: float | None = None
    low_open: bool = False
    type_text = "number"

    def read(self, value, body, key):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise body.fail(key, "a number")
        value = float(value)
        if self.low is not None and not (self.low < value if self.low_open
                                         else self.low <= value):
            raise body.fail(key, f"a number in {self.range_text()}")
        if self.high is not None and not value <= self.high:   # NaN fails too
            raise body.fail(key, f"a number in {self.range_text()}")
        return value

    def range_text(self):
        if self.low is None and self.high is None:
            return ""
        if self.high is None:
            return f"{'>' if self.low_open else '≥'} {number_text(self.low)}"
        return (f"{'(' if self.low_open else '['}{number_text(self.low)}, "
                f"{number_text(self.high)}]")


@dataclass(frozen=True)
class Number(Kind):
    """An int or a float, kept as sent (a count stays an int), at least `low` if given."""

    low: float | None = None
    type_text = "number"

    def read(self, value, body, key):
        if isinstance(value, bool) or not isinstance(value, (int, float)) \
                or (self.low is not None and not value >= self.low):
            raise body.fail(key, "a number" + ("" if self.low is None else f" ≥ {self.low}"))
        return value

    def range_text(self):
        return "" if self.low is None else f"≥ {number_text(self.low)}"


@dataclass(frozen=True)
class Str(Kind):
    """A string of at most max_len characters; `cut`: the encoder sends at most that many."""

    max_len: int = MAX_ID_LEN
    cut: int | None = None
    type_text = "str"

    def read(self, value, body, key):
        if not isinstance(value, str) or len(value) > self.max_len:
            raise body.fail(key, f"a string of at most {self.max_len} characters")
        return value

    def wire(self, value):
        return value if self.cut is None or value is None else value[:self.cut]

    def range_text(self):
        sent = f" (sent ≤ {number_text(self.cut)})" if self.cut and self.cut < self.max_len \
            else ""
        return f"≤ {number_text(self.max_len)} chars{sent}"


@dataclass(frozen=True)
class Bool(Kind):
    type_text = "bool"
    nil_is_absent = False

    def read(self, value, body, key):
        if not isinstance(value, bool):
            raise body.fail(key, "a boolean")
        return value


@dataclass(frozen=True)
class Bytes(Kind):
    """msgpack bin of at most max_len bytes (a pooled vector's float32s)."""

    max_len: int = 1 << 20
    type_text = "bin"

    def read(self, value, body, key):
        if not isinstance(value, bytes) or len(value) > self.max_len:
            raise body.fail(key, f"bytes, at most {self.max_len}")
        return value

    def range_text(self):
        return f"≤ {number_text(self.max_len)} bytes"


@dataclass(frozen=True)
class Ints(Kind):
    """A list of ints in [low, high], checked in C (shared.wire.check_ints)."""

    low: int = 0
    high: int = INT64[1]
    max_len: int = MAX_TOKENS_PER_MESSAGE
    type_text = "list of int"

    def read(self, value, body, key):
        return check_ints(value, self.low, self.high, self.max_len,
                          lambda rule: body.fail(key, rule))

    def wire(self, value):
        return list(value)

    def range_text(self):
        return (f"{Int(self.low, self.high).range_text() or 'any'}, "
                f"≤ {number_text(self.max_len)} items")


@dataclass(frozen=True)
class Code(Kind):
    """One of an enum's string values. `strict`: another value is refused; else it stays a
    plain string (a newer peer's code still ends the request)."""

    codes: type
    strict: bool = False
    max_len: int = 32
    type_text = "str"

    def read(self, value, body, key):
        text = Str(self.max_len).read(value, body, key)
        try:
            return self.codes(text)
        except ValueError:
            if self.strict:
                raise ProtocolError(f"{body.msg_type}: unknown {key} {text!r}") from None
            return text

    def range_text(self):
        values = ", ".join(f"`{c.value}`" for c in self.codes)
        return f"one of {values}" + ("" if self.strict else " (another: kept as a string)")


@dataclass(frozen=True)
class ListOf(Kind):
    """A list of at most max_len items, each of kind `item` (None: any value)."""

    item: Kind | None = None
    max_len: int = 1 << 16

    @property
    def type_text(self):
        return "list" if self.item is None else f"list of {_plural(self.item)}"

    def read(self, value, body, key):
        if not isinstance(value, list) or len(value) > self.max_len:
            raise body.fail(key, f"a list of at most {self.max_len} items")
        if self.item is None:
            return value
        where = Body(f"{body.msg_type}.{key}", {})
        return [self.item.read(item, where, "item") for item in value]

    def wire(self, value):
        return list(value)

    def range_text(self):
        inner = self.item.range_text() if self.item is not None else ""
        return f"≤ {number_text(self.max_len)} items" + (f"; each {inner}" if inner else "")


@dataclass(frozen=True)
class MapOf(Kind):
    """A map of string keys (≤ 64 chars) to values of kind `value`, at most max_len entries."""

    value: Kind
    max_len: int = 256

    @property
    def type_text(self):
        return f"map of {_plural(self.value)}"

    def read(self, value, body, key):
        if not isinstance(value, dict) or len(value) > self.max_len:
            raise body.fail(key, f"a map of at most {self.max_len} entries")
        where = Body(f"{body.msg_type}.{key}", value)
        for name, item in value.items():
            if not isinstance(name, str) or len(name) > 64:
                raise body.fail(key, "a map with keys of at most 64 characters")
            self.value.read(item, where, name)
        return value

    def range_text(self):
        return f"≤ {number_text(self.max_len)} entries"


@dataclass(frozen=True)
class Shape(Kind):
    """A nested map with declared fields, named for its own table in docs/protocol.md.
    Reads into a new map of the declared keys that are present (others are dropped)."""

    name: str
    fields: tuple["Field", ...]
    table: bool = True   # a table of its own in docs/protocol.md, else described inline
    type_text = "map"

    def read(self, value, body, key):
        if not isinstance(value, dict):
            raise body.fail(key, "a map")
        inner = Body(self.name, value)
        return {f.key: f.read(inner) for f in self.fields if f.key in value or f.required}

    def range_text(self):
        if self.table:
            return f"`{self.name}` (below)"
        return "{" + "; ".join(f.compact() for f in self.fields) + "}"


@dataclass(frozen=True)
class Items(Kind):
    """A fixed-position array [a, b, ...]: the first `min_len` items required."""

    name: str
    fields: tuple["Field", ...]
    min_len: int | None = None
    table: bool = False   # a table of its own in docs/protocol.md, else described inline
    type_text = "array"

    def read(self, value, body, key):
        low = len(self.fields) if self.min_len is None else self.min_len
        if not isinstance(value, list) or not low <= len(value) <= len(self.fields):
            names = ", ".join(f.key for f in self.fields)
            raise body.fail(key, f"the array [{names}]")
        inner = Body(self.name, dict(zip((f.key for f in self.fields), value)))
        return [f.read(inner) for f in self.fields[:len(value)]]

    def range_text(self):
        if self.table:
            return f"`{self.name}` (below)"
        return "[" + "; ".join(f.compact(quote=False) for f in self.fields) + "]"


@dataclass(frozen=True)
class Nil(Kind):
    """`kind`, or nil (inside a list, where absence has no meaning)."""

    kind: Kind

    @property
    def type_text(self):
        return f"{self.kind.type_text} or nil"

    def read(self, value, body, key):
        return None if value is None else self.kind.read(value, body, key)

    def range_text(self):
        return self.kind.range_text()


@dataclass(frozen=True)
class Sampling(Kind):
    """SamplingParams as a map (§3). `engine`: without the frontend-only keys."""

    engine: bool = False
    type_text = "map"

    def read(self, value, body, key):
        return sampling_from_wire(Body(body.msg_type, {key: value}), key)

    def wire(self, value):
        return value.engine_dict() if self.engine else value.to_dict()

    def range_text(self):
        return "§3" + (" (`engine_dict`)" if self.engine else "")


def _plural(kind: Kind) -> str:
    text = kind.type_text
    return {"int": "ints", "number": "numbers", "str": "strs", "bool": "bools",
            "map": "maps", "array": "arrays"}.get(text, text)


# ---- fields and messages ----------------------------------------------------------------

REQUIRED = object()   # a field's default when the field must be there


@dataclass(frozen=True)
class Field:
    """One key of a body. `attr`: its name in the decoded value (default: the key).
    `default`: REQUIRED, or what a missing (or, but for booleans, nil) field reads as; the
    encoder leaves out a non-required field whose value is None, unless `send_nil`."""

    key: str
    kind: Kind
    attr: str | None = None
    default: Any = REQUIRED
    send_nil: bool = False
    rule: str | None = None   # the range as the doc says it, where it depends on other fields

    @property
    def name(self) -> str:
        return self.attr or self.key

    @property
    def required(self) -> bool:
        return self.default is REQUIRED

    def read(self, body: Body) -> Any:
        raw = body.body
        if self.key not in raw:
            if self.required:
                raise ProtocolError(f"{body.msg_type}: missing field {self.key!r}")
            return self.default
        value = raw[self.key]
        if value is None and self.kind.nil_is_absent and not self.required:
            return self.default
        return self.kind.read(value, body, self.key)

    def range_text(self) -> str:
        return self.kind.range_text() if self.rule is None else self.rule

    def compact(self, quote: bool = True) -> str:
        """The field in a few words, for a row that describes a whole map or array."""
        parts = [self.kind.type_text, self.range_text()]
        if not self.required:
            parts.append(self.presence_text())
        name = f"`{self.key}`" if quote else self.key
        return f"{name}: " + ", ".join(p for p in parts if p)

    def presence_text(self) -> str:
        if self.required:
            return "required"
        if self.default is None or self.default == [] or self.default == ():
            return "optional" + (", may be nil" if self.send_nil else "")
        return f"optional, default {_value_text(self.default)}"


def _value_text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return f'`"{value}"`' if isinstance(value, str) else str(value)


@dataclass(frozen=True)
class Message:
    """One message: its type code, the links that carry it, its fields in wire order.

    `value`: what decoding gives. A name makes a NamedTuple of the fields' attrs (in
    `order`, else field order); a class is called with the attrs as keywords; `build`
    (values by attr -> value) replaces both. `codec`: a hand-written (encode, decode)
    pair, for a message of the per-step hot path (plan, result, outputs) or one whose
    fields refer to each other (the page map); its fields stay declared here, for the doc
    and for tests/shared/protocol/test_message_types.py, which holds the codec to them."""

    type: str
    links: tuple[str, ...]
    fields: tuple[Field, ...]
    value: Any = None
    order: tuple[str, ...] | None = None
    build: Callable[[dict[str, Any]], Any] | None = None
    codec: tuple[Callable, Callable] | None = None
    table: bool = False   # a field table of its own in docs/protocol.md
    doc_name: str | None = None   # that table's name, where the type has two declarations
    _plan: tuple = field(init=False, repr=False, compare=False, default=())

    def __post_init__(self) -> None:
        if isinstance(self.value, str):
            names = self.order or tuple(f.name for f in self.fields)
            assert sorted(names) == sorted(f.name for f in self.fields), self.type
            object.__setattr__(self, "value", NamedTuple(self.value, [(n, Any) for n in names]))
        object.__setattr__(self, "_plan", tuple(
            (f.name, f.key, f.kind.wire if type(f.kind).wire is not Kind.wire else None,
             f.required or f.send_nil) for f in self.fields))

    @property
    def name(self) -> str:
        return self.doc_name or self.type

    def pack(self, **values: Any) -> bytes:
        """The message with these attrs (a missing non-required one: left out)."""
        body: dict[str, Any] = {}
        for name, key, wire, always in self._plan:
            value = values.get(name)
            if value is None and not always:
                continue
            body[key] = value if wire is None or value is None else wire(value)
        return pack(self.type, body)

    def read_fields(self, body: Body) -> dict[str, Any]:
        return {f.name: f.read(body) for f in self.fields}

    def decode(self, body: Body) -> Any:
        if self.codec is not None:
            return self.codec[1](body)
        values = self.read_fields(body)
        if self.build is not None:
            return self.build(values)
        return values if self.value is None else self.value(**values)
