"""The record schema is written twice, in Python and in the native part's C++: these hold the two together.

A record's fields are capture/record.py's constants; native/common.h lists the same fields for the C++
that writes records (hot_path.cpp, fold.cpp). The native process group's entries are read by
capture/ddp_native.py's ``E_*`` positions from the tuple timed_group.cpp's ``entry_tuple()`` builds. A
field added, moved or renamed on one side only fails here, not in a training job.
"""

from __future__ import annotations

import ast
import os
import pathlib
import re

from otel_torchdist.capture import ddp_native
from otel_torchdist.capture import record as R

NATIVE = os.path.join(os.path.dirname(R.__file__), "..", "native")


def _read(name: str) -> str:
    with open(os.path.join(NATIVE, name)) as f:
        return f.read()


def _flat(name: str) -> str:
    return name.replace("_", "").lower()


def test_common_h_lists_the_record_fields_in_record_py_order():
    enum = re.search(r"namespace record \{.*?enum : Py_ssize_t \{(.*?)\};", _read("common.h"), re.S)
    assert enum, "native/common.h: the record enum moved"
    cpp = [_flat(name.strip().removeprefix("k")) for name in enum.group(1).split(",") if name.strip()]
    python = sorted((value, name) for name, value in vars(R).items() if name.isupper() and isinstance(value, int) and name != "FIELDS" and not name.startswith("_"))
    fields = [name for value, name in python if value < R.FIELDS]
    assert [value for value, _ in python if value < R.FIELDS] == list(range(R.FIELDS)), python
    assert cpp == [_flat(name) for name in fields] + ["fields"]


def test_entry_tuple_writes_what_ddp_native_reads():
    body = re.search(r"PyObject\* items\[(\d+)\] = \{(.*?)\};", _read("timed_group.cpp"), re.S)
    assert body, "native/timed_group.cpp: entry_tuple() moved"
    items = [m.group(1) or m.group(2) for m in re.finditer(r"e\.(\w+)|\b(dtype|error)\b(?!\.)", body.group(2))]
    assert int(body.group(1)) == len(items)
    positions = sorted((v, k) for k, v in vars(ddp_native).items() if k.startswith("E_") and isinstance(v, int))
    assert [v for v, _ in positions] == list(range(len(items)))
    read = [_flat(k.removeprefix("E_")) for _, k in positions]
    written = [_flat({"graph_task": "task", "t0": "t0", "t1": "t1"}.get(item, item)) for item in items]
    assert read == written


# ------------------------------------------------------------------------- contexts read by their names
def _literal_index(node: ast.expr) -> bool:
    if isinstance(node, ast.Constant):
        return isinstance(node.value, int)
    if isinstance(node, ast.UnaryOp):
        return _literal_index(node.operand)
    if isinstance(node, ast.Slice):
        return any(part is not None and _literal_index(part) for part in (node.lower, node.upper))
    return False


# What these names hold in the package: a record, a step context, a framework context, a snapshot of the three.
_CONTEXTS = {"rec", "step", "ctx", "fw", "snap"}


def test_records_and_contexts_are_read_by_their_fields_names():
    """A record by capture/record.py's constants, a step context by capture/step_context.py's, a framework
    context by capture/context.py's: never by a bare position, which silently reads another field once one
    moves."""
    package = pathlib.Path(R.__file__).parent.parent
    found = []
    for path in sorted(package.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name) and node.value.id in _CONTEXTS:
                if _literal_index(node.slice):
                    found.append(f"{path.relative_to(package)}:{node.lineno}: {ast.unparse(node)}")
    assert not found, "\n".join(found)


def test_the_step_context_holds_what_its_fields_name(fake_pg, instrumented):
    """The tuple steps.py writes when a step begins, read by step_context's names: in the step's shared trace,
    then inside a span of the caller's (its trace, its span as the parent, the shared trace kept for the link)."""
    from opentelemetry.sdk.trace import TracerProvider

    import otel_torchdist
    from otel_torchdist import runtime
    from otel_torchdist.capture import step_context as S
    from otel_torchdist.steps import step_ids

    instrumented()
    tracker = runtime.current().pipeline.step_tracker
    key = tracker.trace_key
    with otel_torchdist.step(5):
        ctx = R.STEP[0]
        trace, root, span = step_ids(key, 5, 0)
        assert len(ctx) == S.FIELDS
        assert ctx[S.SERIAL] == tracker.serial and R.RECENT_STEPS[ctx[S.SERIAL] % len(R.RECENT_STEPS)] is ctx
        assert (ctx[S.TRACE], ctx[S.SPAN], ctx[S.ROOT], ctx[S.SHARED]) == (trace, span, root, trace)
        assert (ctx[S.SAMPLED], ctx[S.PARENT], ctx[S.INDEX], ctx[S.OCCURRENCE]) == (True, None, 5, 0)
    with otel_torchdist.step(5):  # the same number again: its second occurrence, ids of their own
        assert R.STEP[0][S.INDEX] == 5 and R.STEP[0][S.OCCURRENCE] == 1
        assert R.STEP[0][S.SHARED] != trace
    tracer = TracerProvider().get_tracer("test")
    with tracer.start_as_current_span("iteration") as mine, otel_torchdist.step(6):
        ctx = R.STEP[0]
        theirs = mine.get_span_context()
        trace6, root6, span6 = step_ids(key, 6, 0)
        assert ctx[S.PARENT] == (theirs.trace_id, theirs.span_id)
        assert (ctx[S.TRACE], ctx[S.SPAN], ctx[S.ROOT], ctx[S.SHARED]) == (theirs.trace_id, span6, root6, trace6)
        assert ctx[S.SAMPLED] and ctx[S.INDEX] == 6
