"""Hand-rolled OTLP span encoding, protobuf wire format and OTLP/JSON, for the span volume of a training run.

Building ``opentelemetry.proto`` message objects costs about 18 µs a span and the SDK's encoder about
35 µs; concatenating pre-encoded fragments costs a few. Attribute keys are constants, so their encoded
prefixes are computed once; attribute tuples shared by many spans (a process group's own attributes) are
encoded once per value and reused: only durations, bandwidths and sequence numbers are new per span. ``tests/test_otlp_encoding.py`` parses the output with the official protobuf
classes and compares it with the message-object encoding, field by field.

Field numbers are those of ``opentelemetry/proto/trace/v1/trace.proto`` and
``opentelemetry/proto/common/v1/common.proto``.
"""

from __future__ import annotations

import json
import struct
from typing import Any

from ..telemetry import Block

_pack_fixed64 = struct.Struct("<Q").pack
_pack_double = struct.Struct("<d").pack
_pack_fixed32 = struct.Struct("<I").pack


def varint(value: int) -> bytes:
    if value < 0:
        value += 1 << 64  # int64 negatives are ten-byte two's complement varints
    if value < 0x80:
        return bytes((value,))
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def tag(field: int, wire_type: int) -> bytes:
    return varint((field << 3) | wire_type)


def length_delimited(field: int, payload: bytes) -> bytes:
    return tag(field, 2) + varint(len(payload)) + payload


# ---------------------------------------------------------------------------------------- AnyValue (pb)
def any_value_pb(v: Any) -> bytes:
    if v is True or v is False:
        return b"\x10\x01" if v else b"\x10\x00"  # bool_value = 2
    if isinstance(v, int):
        return b"\x18" + varint(v)  # int_value = 3
    if isinstance(v, float):
        return b"\x21" + _pack_double(v)  # double_value = 4
    if isinstance(v, (list, tuple)):
        inner = b"".join(length_delimited(1, any_value_pb(x)) for x in v)
        return length_delimited(5, inner)  # array_value = 5 { values = 1 }
    s = str(v).encode()
    return b"\x0a" + varint(len(s)) + s  # string_value = 1


_key_pb_cache: dict[str, bytes] = {}
_CACHE_LIMIT = 1 << 16
_SMALL = 1 << 12  # integers below this are cached (ranks, counts); above, encoded each time


def key_value_pb(key: str, value: Any) -> bytes:
    """One ``KeyValue`` message body."""
    prefix = _key_pb_cache.get(key)
    if prefix is None:
        k = key.encode()
        prefix = _key_pb_cache[key] = b"\x0a" + varint(len(k)) + k
    if type(value) is float:
        return prefix + b"\x12\x09\x21" + _pack_double(value)
    av = any_value_pb(value)
    return prefix + b"\x12" + varint(len(av)) + av


# Most attribute values repeat from span to span (op, dtype, shapes, sizes, flags): their encodings are
# cached per (field, key, type, value). Floats (durations, bandwidths) and large integers (sequence
# numbers) are new every time and skip it: caching them would only churn the cache.
_field_pb_cache: dict[tuple, bytes] = {}


def attributes_pb(field: int, pairs) -> bytes:
    """Repeated ``KeyValue`` as field ``field`` of the enclosing message."""
    t = tag(field, 2) if field != 9 else b"\x4a"
    out = []
    cache = _field_pb_cache
    for key, value in pairs:
        if type(value) is float or type(value) is int and not -_SMALL < value < _SMALL:
            kv = key_value_pb(key, value)
            out.append(t + varint(len(kv)) + kv)
            continue
        # A tuple's items may be equal and of other types ((1,) == (True,)): encoded every time, as a list is.
        ck = (field, key, type(value), value) if not isinstance(value, tuple) else None
        try:
            enc = cache.get(ck) if ck is not None else None
        except TypeError:  # an unhashable value (a list): encode it every time
            enc = None
            ck = None
        if enc is None:
            kv = key_value_pb(key, value)
            enc = t + varint(len(kv)) + kv
            if ck is not None:
                if len(cache) > _CACHE_LIMIT:
                    cache.clear()
                cache[ck] = enc
        out.append(enc)
    return b"".join(out)


def pair_pb(key: str, value: Any) -> bytes:
    """One pair as a ``Span.attributes`` field (the native encoder's path for a value it does not encode)."""
    return attributes_pb(9, ((key, value),))


_block_pb: dict[tuple, bytes] = {}


def block_pb(field: int, block: tuple) -> bytes:
    """:func:`attributes_pb` of a :class:`Block` (as field 9, ``Span.attributes``, the one it is cached
    for), encoded once per block; a plain tuple every time: equal tuples may hold values of other types
    (``1``, ``1.0`` and ``True`` are equal) and must not share an encoding."""
    if type(block) is not Block:
        return attributes_pb(field, block)
    enc = _block_pb.get(block)
    if enc is None:
        enc = attributes_pb(field, block)
        if len(_block_pb) > _CACHE_LIMIT:
            _block_pb.clear()
        _block_pb[block] = enc
    return enc


# ------------------------------------------------------------------------------------------- JSON parts
_INF = float("inf")


def json_double(v: float) -> float | str:
    """A double as proto3's JSON mapping writes it: NaN and the infinities, which JSON has no literal for,
    as the strings "NaN", "Infinity" and "-Infinity" (``json.dumps`` would write bare NaN, invalid JSON)."""
    if v != v:
        return "NaN"
    if v == _INF:
        return "Infinity"
    if v == -_INF:
        return "-Infinity"
    return v


def any_value_json(v: Any) -> str:
    if v is True:
        return '{"boolValue":true}'
    if v is False:
        return '{"boolValue":false}'
    if isinstance(v, int):
        return '{"intValue":"%d"}' % v
    if isinstance(v, float):
        if v != v or v == _INF or v == -_INF:
            return '{"doubleValue":"%s"}' % json_double(v)
        return '{"doubleValue":%r}' % v
    if isinstance(v, (list, tuple)):
        return '{"arrayValue":{"values":[%s]}}' % ",".join(any_value_json(x) for x in v)
    return '{"stringValue":%s}' % json.dumps(str(v))


_key_json_cache: dict[str, str] = {}


_field_json_cache: dict[tuple, str] = {}


def _key_json(key: str) -> str:
    prefix = _key_json_cache.get(key)
    if prefix is None:
        prefix = _key_json_cache[key] = '{"key":%s,"value":' % json.dumps(key)
    return prefix


def attributes_json(pairs) -> list[str]:
    out = []
    cache = _field_json_cache
    keys = _key_json_cache
    for key, value in pairs:
        t = type(value)
        if t is float:
            if value - value == 0:  # finite: NaN and infinities take the general path
                out.append('%s{"doubleValue":%r}}' % (keys.get(key) or _key_json(key), value))
                continue
            ck = None
        elif t is int and not -_SMALL < value < _SMALL:
            out.append('%s{"intValue":"%d"}}' % (keys.get(key) or _key_json(key), value))
            continue
        elif isinstance(value, tuple):  # items may be equal and of other types ((1,) == (True,)): encoded every time
            ck = None
        else:
            ck = (key, t, value)
            try:
                enc = cache.get(ck)
            except TypeError:
                enc = ck = None
            if enc is not None:
                out.append(enc)
                continue
        enc = _key_json(key) + any_value_json(value) + "}"
        if ck is not None:
            if len(cache) > _CACHE_LIMIT:
                cache.clear()
            cache[ck] = enc
        out.append(enc)
    return out


def pair_json(key: str, value: Any) -> str:
    """One pair's :func:`attributes_json` (the native encoder's path for a value it does not format)."""
    return attributes_json(((key, value),))[0]


_block_json: dict[tuple, str] = {}


def block_json(block: tuple) -> str:
    """Comma-joined :func:`attributes_json` of a :class:`Block`, encoded once per block; a plain tuple
    every time (see :func:`block_pb`)."""
    if type(block) is not Block:
        return ",".join(attributes_json(block))
    enc = _block_json.get(block)
    if enc is None:
        enc = ",".join(attributes_json(block))
        if len(_block_json) > _CACHE_LIMIT:
            _block_json.clear()
        _block_json[block] = enc
    return enc


fixed64 = _pack_fixed64
fixed32 = _pack_fixed32
