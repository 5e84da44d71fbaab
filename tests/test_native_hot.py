"""The c10d wrapper's common case in C++ (native/hot_path.cpp, capture/native_hot.py): the same records as
the Python body, field by field, for the calls it takes; every other call handed to the Python body; the
collective's result and exceptions untouched. The rest of the suite runs its collectives through it too
wherever the native part is built (.ci/install builds it)."""

from __future__ import annotations

import contextlib
import re
import sys

import pytest
import torch
import torch.distributed as dist

import otel_torchdist
from otel_torchdist import names as n
from otel_torchdist.capture import c10d
from otel_torchdist.capture import record as R

QUIET = dict(drain_interval=3600.0, span_schedule_delay=3600.0, metric_export_interval=3600.0)
TIMES = (R.T_START, R.T_END, R.SEQ)


@pytest.fixture
def hot(fake_pg, instrumented, native_built):
    instrumented(native="auto", **QUIET)
    assert c10d._hot_call is not None and c10d.HOT, "the native fast path is not active"
    dist.all_reduce(torch.ones(1))  # a group's first call goes through Python, which registers the group
    yield fake_pg


@contextlib.contextmanager
def _in_python(name: str):
    """Calls of ``name`` through the Python body meanwhile: its wrappers' op cells (torch.distributed's and
    distributed_c10d's) emptied, then put back."""
    cells = [cell for cell, spec, *_ in c10d.HOT if spec.name == name]
    saved = [cell[0] for cell in cells]
    for cell in cells:
        cell[0] = None
    try:
        yield
    finally:
        for cell, op in zip(cells, saved):
            cell[0] = op


def _call(fn, *args, **kwargs) -> tuple[tuple, bool, object]:
    """Run one captured call; (its record, whether the Python body took the outermost call, the result).
    (A call torch makes inside it, such as all_gather_into_tensor's all_gather_single, is nested: the body
    passes it through.)"""
    seen = []

    def profile(frame, event, arg):
        if event == "call" and frame.f_code is c10d.HOT[0][4].__code__ and R.TLS.outer is None:
            seen.append(frame.f_code)

    queued = len(R.QUEUE)
    sys.setprofile(profile)
    try:
        result = fn(*args, **kwargs)
    finally:
        sys.setprofile(None)
    assert len(R.QUEUE) == queued + 1, "one record per call"
    return R.QUEUE[-1], bool(seen), result


def _both(name: str, fn, *args, **kwargs) -> tuple[tuple, tuple]:
    """The record of the call through the native fast path, then of the same call through the Python body."""
    native, in_python, _ = _call(fn, *args, **kwargs)
    assert not in_python, f"{name}: the native fast path handed the call to Python"
    with _in_python(name):
        python, in_python, _ = _call(fn, *args, **kwargs)
    assert in_python
    return native, python


def _same(native: tuple, python: tuple) -> None:
    assert len(native) == len(python) == R.FIELDS
    for i, (a, b) in enumerate(zip(native, python)):
        if i in TIMES:
            continue
        assert a == b and type(a) is type(b), f"field {i}: native {a!r}, Python {b!r}"
    assert native[R.T_END] >= native[R.T_START] > 0
    assert python[R.SEQ] == native[R.SEQ] + 1  # the group's counter, one call later


CALLS = [
    ("all_reduce", lambda: dist.all_reduce(torch.ones(8, 4))),
    ("all_reduce", lambda: dist.all_reduce(torch.ones(3), op=dist.ReduceOp.MAX)),
    ("all_reduce", lambda: dist.all_reduce(torch.ones(3, dtype=torch.bfloat16), dist.ReduceOp.SUM, None, False)),
    ("all_reduce", lambda: dist.all_reduce(torch.tensor(2.0), group=dist.group.WORLD)),
    ("all_reduce", lambda: dist.all_reduce(torch.ones(6, 4).t())),  # not contiguous
    ("all_reduce", lambda: dist.all_reduce(torch.ones(4), async_op=True).wait()),  # completed by Python's _finish
    ("broadcast", lambda: dist.broadcast(torch.ones(5, dtype=torch.int64), src=0)),
    ("broadcast", lambda: dist.broadcast(torch.ones(5), 0)),
    ("reduce", lambda: dist.reduce(torch.ones(7), dst=0, op=dist.ReduceOp.MIN)),
    ("all_gather_into_tensor", lambda: dist.all_gather_into_tensor(torch.empty(16), torch.ones(4))),
    ("reduce_scatter_tensor", lambda: dist.reduce_scatter_tensor(torch.empty(2), torch.ones(8))),
    ("all_to_all_single", lambda: dist.all_to_all_single(torch.empty(8), torch.ones(8))),
    ("gather", lambda: dist.gather(torch.ones(3), [torch.empty(3) for _ in range(4)], dst=0)),  # S: n times it
    ("scatter", lambda: dist.scatter(torch.empty(3), [torch.ones(3)] * 4, src=0)),
    ("send", lambda: dist.send(torch.ones(2), dst=1)),  # a peer
]


@pytest.mark.parametrize("name,fn", CALLS, ids=[f"{i}-{name}" for i, (name, _) in enumerate(CALLS)])
def test_native_records_are_the_python_records(hot, name, fn):
    native, python = _both(name, fn)
    _same(native, python)


def test_the_callers_span_and_the_framework_context_and_step_are_recorded(hot):
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider

    from otel_torchdist.capture import context

    tracer = TracerProvider().get_tracer("test")
    step = (41, 1234, 5678, True, 99)
    R.STEP[0], saved_step = step, R.STEP[0]
    token = context.push(framework="ddp", phase="forward")
    try:
        with tracer.start_as_current_span("mine") as span:
            native, python = _both("all_reduce", lambda: dist.all_reduce(torch.ones(3)))
    finally:
        context.pop(token)
        R.STEP[0] = saved_step
    _same(native, python)
    # The caller's Context, whose current span is the caller's (capture/caller.py resolves it off the hot path).
    assert trace.get_current_span(native[R.PARENT]) is span and native[R.STEPCTX] == step and native[R.CTX] is not None
    assert trace.get_current_span() is not span
    native, python = _both("all_reduce", lambda: dist.all_reduce(torch.ones(3)))
    assert native[R.PARENT] is None is python[R.PARENT]  # no span, nothing in the context: nothing kept


def test_what_it_does_not_take_goes_to_the_python_body(hot):
    class Sub(torch.Tensor):
        pass

    x = torch.ones(4).as_subclass(Sub)
    _, in_python, _ = _call(dist.all_reduce, x)
    assert in_python  # a tensor subclass
    _, in_python, _ = _call(dist.all_gather, [torch.empty(2) for _ in range(4)], torch.ones(2))
    assert in_python  # a list of tensors


def test_the_result_and_the_exception_pass_through(hot):
    assert dist.all_reduce(torch.ones(2)) is None
    work = dist.all_reduce(torch.ones(2), async_op=True)
    assert work is not None and work.wait()
    with pytest.raises(Exception) as uninstrumented:
        c10d.HOT[0][3](torch.ones(2), op="not an op")  # the original, unwrapped
    queued = len(R.QUEUE)
    with pytest.raises(type(uninstrumented.value)) as raised:
        dist.all_reduce(torch.ones(2), op="not an op")
    address = re.compile(r"0x[0-9a-f]+")
    assert address.sub("", str(raised.value)) == address.sub("", str(uninstrumented.value))
    assert R.TLS.outer is None
    assert len(R.QUEUE) == queued + 1  # raised inside the call: recorded, as failed
    assert R.QUEUE[-1][R.ERROR][0] == type(raised.value).__name__ and R.QUEUE[-1][R.OP] == "all_reduce"


def test_a_full_queue_drops_and_counts(hot):
    saved = R._limit[0]
    R._limit[0] = len(R.QUEUE)
    before = R.dropped_records()
    try:
        dist.all_reduce(torch.ones(2))
        dist.all_reduce(torch.ones(2))
    finally:
        R._limit[0] = saved
    assert R.dropped_records() == before + 2


def test_native_off_and_uninstrument_leave_python_alone(fake_pg, instrumented, native_built):
    """native="off": every call in Python; uninstrument(): the wrappers' ops dropped."""
    instrumented(native="off", **QUIET)
    assert c10d.HOT and all(cell[0] is None for cell, *_ in c10d.HOT)
    _, in_python, _ = _call(dist.all_reduce, torch.ones(2))
    _, in_python, _ = _call(dist.all_reduce, torch.ones(2))  # the group known: still Python
    assert in_python
    otel_torchdist.uninstrument()
    assert not c10d.HOT


def _own_op(orig):
    """A native op over ``orig`` in place of all_reduce's original, laid out as all_reduce's wrapper is."""
    from otel_torchdist.capture import ddp_native, native_hot

    cell, spec, binder, _, body = next(entry for entry in c10d.HOT if entry[1].name == "all_reduce")
    mod = ddp_native.module()
    return mod, mod.hot_op(orig, body, binder.names, binder.defaults, spec.name, spec.kind, *native_hot._layout(spec, binder))


def test_the_call_in_flight_is_where_the_watchdog_looks_and_its_exception_is_the_same_object(hot):
    import threading

    from otel_torchdist import runtime

    seen = {}

    def orig(tensor, op=None, group=None, async_op=False):
        seen["blocking"] = dict(R.BLOCKING)
        seen["watchdog"] = runtime.current().watchdog.blocking_in_flight()
        return "the result"

    mod, op = _own_op(orig)
    x = torch.ones(3)
    assert mod.hot_call(op, (x,), {}) == "the result"
    (rec,) = seen["blocking"].values()
    assert list(seen["blocking"]) == [threading.get_ident()] and rec[R.OP] == "all_reduce" and rec[R.T_START] > 0
    assert [r is rec for r in seen["watchdog"]] == [True]
    assert not R.BLOCKING and R.QUEUE[-1][R.NUMEL] == 3

    failure = ValueError("from the collective")

    def failing(tensor, op=None, group=None, async_op=False):
        raise failure

    mod, op = _own_op(failing)
    with pytest.raises(ValueError) as raised:
        mod.hot_call(op, (x,), {})
    assert raised.value is failure and not R.BLOCKING and R.TLS.outer is None
    assert R.QUEUE[-1][R.ERROR] == ("ValueError", "from the collective")


def test_queued_records_are_untracked_by_the_collector_at_once(hot):
    """The collector would untrack a record (a tuple of atoms) on its first look; the native path does it
    when it queues the record, so young-generation collections never walk queued records."""
    import gc

    rec, in_python, _ = _call(dist.all_reduce, torch.ones(3, 2))
    assert not in_python and not gc.is_tracked(rec) and not gc.is_tracked(rec[R.SHAPES])


def test_threads_calling_at_once_each_get_their_records(hot):
    """Each thread's call is its own (TLS.outer and BLOCKING per thread): no record lost, none left in
    flight, every record complete."""
    import threading

    calls, threads = 300, 4
    queued = len(R.QUEUE)
    errors = []

    def work():
        try:
            for _ in range(calls):
                dist.all_reduce(torch.ones(5))
            assert R.TLS.outer is None
        except BaseException as exc:  # surfaced below: an assertion in a thread would be lost
            errors.append(exc)

    pool = [threading.Thread(target=work) for _ in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    assert not errors and not R.BLOCKING
    recs = list(R.QUEUE)[queued:]
    assert len(recs) == calls * threads
    assert all(r[R.NUMEL] == 5 and r[R.T_END] >= r[R.T_START] > 0 and r[R.END] == n.END_RETURN for r in recs)
    assert len({r[R.SEQ] for r in recs}) == calls * threads  # one sequence number each


def test_what_the_python_body_would_not_catch_propagates_before_the_call(hot):
    """A KeyboardInterrupt while the call is described propagates, as from the Python body (which catches
    Exception only): the collective is not called, nothing is recorded, the thread's state is clean."""

    class Interrupting:
        def __bool__(self):
            raise KeyboardInterrupt

    for path in (contextlib.nullcontext(), _in_python("all_reduce")):
        queued = len(R.QUEUE)
        with path, pytest.raises(KeyboardInterrupt):
            dist.all_reduce(torch.ones(2), async_op=Interrupting())
        assert len(R.QUEUE) == queued and R.TLS.outer is None and not R.BLOCKING


def test_a_failing_context_getter_hands_the_call_to_python(hot, monkeypatch):
    """OpenTelemetry with a runtime context of its own: the native path calls its getter; when that fails,
    the Python body takes the call and the result passes through."""
    from otel_torchdist.capture import caller, ddp_native, native_hot

    def failing():
        raise RuntimeError("no context here")

    monkeypatch.setattr(caller, "get_current", failing)  # what activate() hands the native part...
    native_hot.activate(ddp_native.module())
    monkeypatch.undo()  # ...while the Python body reads caller's at the call
    try:
        rec, in_python, result = _call(dist.all_reduce, torch.ones(4))
        assert result is None and in_python and rec[R.NUMEL] == 4 and R.TLS.outer is None
    finally:
        native_hot.activate(ddp_native.module())
    _, in_python, _ = _call(dist.all_reduce, torch.ones(4))
    assert not in_python
