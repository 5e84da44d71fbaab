"""The native span encoders (native/encode.cpp, otlp.use_native): byte for byte what the Python encoders
write, for the spans a run makes and for the odd ones (which they hand to Python); the doubles in them as
Python's repr writes them. The rest of the suite reads traces files written through them wherever the
native part is built (.ci/install builds it)."""

from __future__ import annotations

import math
import random
import struct
from collections import namedtuple

import pytest
import torch
import torch.distributed as dist

import otel_torchdist
from otel_torchdist import native, telemetry
from otel_torchdist.drain import spans
from otel_torchdist.export import otlp
from otel_torchdist.capture import groups
from otel_torchdist.capture import record as R

from .test_otlp_encoding import SHARED, SPANS


@pytest.fixture
def mod(native_built):
    module = native.load()
    otlp.use_native(module)
    yield module
    otlp.use_native(None)


def test_doubles_are_written_as_float_repr_writes_them(mod):
    rng = random.Random(8)
    values = [0.0, -0.0, 1.0, -1.0, 0.1, 1 / 3, 1e-4, 1e-5, 9.99e-5, 1e15, 1e16, 9999999999999998.0, 1e22, 1e23,
              5e-324, 2.2250738585072014e-308, 1.7976931348623157e308, 0.40959999999999996, 123456789.125]  # fmt: skip
    while len(values) < 300_000:
        x = struct.unpack("<d", struct.pack("<Q", rng.getrandbits(64)))[0]  # any bit pattern
        if math.isfinite(x):
            values.append(x)
        values.append(rng.randint(1, 10**12) / 1e9)  # durations in seconds, from nanoseconds
        values.append(rng.random() * 10 ** rng.randint(-12, 20))  # bandwidths
    wrong = [(x, mod.double_repr(x)) for x in values if mod.double_repr(x) != repr(x)]
    assert not wrong, wrong[:5]


class _F(float):
    pass


_Pair = namedtuple("_Pair", "a b")


ODD = [
    # values the native encoders hand to Python, keys and names it has not seen, ids at their limits
    telemetry.SpanData("odd", 1, 2, None, 0, 1, [("nan", math.nan), ("inf", -math.inf), ("big", 2**70), ("min", -(2**63)),
                  ("max", 2**63 - 1), ("sub", _F(0.5)), ("none", None), ("t", (1, "a", 2.5)), ("b", True), (7, 1.5),
                  ("ключ", 2.0), ("quote\"key", 3)]),  # fmt: skip
    telemetry.SpanData("spán \"name\"", (1 << 128) - 1, (1 << 64) - 1, (1 << 64) - 1, 2**62, 2**63 - 1, [("d", 1e-5)]),
    telemetry.SpanData("zero_parent", 5, 6, 0, 1, 2, [], shared=((), SHARED)),
    telemetry.SpanData("unsampled_remote", 5, 6, 7, 1, 2, [("x", 0.0)], sampled=False, remote_parent=True),
    telemetry.SpanData("linked", 5, 6, 7, 1, 2, [("x", 1)], links=((8, 9, ()), ((1 << 128) - 1, 10, (("k", "v"),)))),
    *(telemetry.SpanData("equal", 1, 2, None, 1, 2, [("v", (x, 2)), ("n", _Pair(x, 2))], shared=((("a", x),),)) for x in (1, 1.0, True, 1)),
]


def _collective_spans() -> list[telemetry.SpanData]:
    """The spans a run's collectives make: records from real calls on the fake backend."""
    from otel_torchdist import runtime

    world = dist.get_world_size()
    for op in (
        lambda: dist.all_reduce(torch.ones(4)),
        lambda: dist.broadcast(torch.ones(3, 2), src=1),
        lambda: dist.all_gather_into_tensor(torch.empty(4 * world), torch.ones(4)),
        lambda: dist.barrier(),
        lambda: dist.reduce_scatter_tensor(torch.empty(2), torch.ones(2 * world)),
        lambda: dist.all_reduce(torch.ones(4, dtype=torch.float16), op=dist.ReduceOp.MAX, async_op=True).wait(),
    ):
        op()
    records = list(R.QUEUE)
    out = []
    for rec in records:
        gi = groups.BY_ID[rec[R.GROUP]]
        seconds = (rec[R.T_END] - rec[R.T_START]) / 1e9
        out.append(spans.collective_span(rec, gi, seconds, runtime.current().pipeline.offset_ns, 0xABCDEF, 0x1234, True))
    return out


def _same(mod, span: telemetry.SpanData) -> None:
    for python, ours in ((otlp.span_json, mod.span_json), (otlp.span_pb, mod.span_pb)):
        try:
            expected = python(span)
        except Exception as exc:  # the native encoder raises what Python raises
            with pytest.raises(type(exc)):
                ours(span)
            continue
        assert ours(span) == expected, span
        assert ours(span) == expected  # and again, with what the first call cached


def test_spans_are_encoded_byte_for_byte_as_python_encodes_them(mod, fake_pg, instrumented):
    instrumented(native="off", drain_interval=3600.0, traces_sampler="always_on")
    collective = _collective_spans()
    assert len(collective) == 6 and all(s.shared for s in collective)
    for span in SPANS + ODD + collective:
        _same(mod, span)


def test_spans_the_python_encoders_refuse_are_refused_alike(mod):
    for span in (
        telemetry.SpanData("neg_start", 1, 2, None, -5, 1, []),  # JSON writes it; protobuf's fixed64 cannot
        telemetry.SpanData("neg_span", 1, -2, None, 1, 2, []),
        telemetry.SpanData("huge_trace", 1 << 130, 2, None, 1, 2, []),
        telemetry.SpanData("bad_pairs", 1, 2, None, 1, 2, [("a", 1, 2)]),
    ):
        _same(mod, span)


def test_instrument_encodes_with_the_native_part_and_native_off_with_python(fake_pg, instrumented, native_built):
    module = native.load()
    instrumented(native="auto", drain_interval=3600.0)
    assert otlp.SPAN_ENCODERS == {"json": module.span_json, "pb": module.span_pb, "data": otlp.span_data}
    otel_torchdist.uninstrument()
    assert otlp.SPAN_ENCODERS == {"json": otlp.span_json, "pb": otlp.span_pb, "data": otlp.span_data}
    instrumented(native="off", drain_interval=3600.0)
    assert otlp.SPAN_ENCODERS == {"json": otlp.span_json, "pb": otlp.span_pb, "data": otlp.span_data}
