"""The record schema is written twice, in Python and in the native part's C++: these hold the two together.

A record's fields are capture/record.py's constants; native/common.h lists the same fields for the C++
that writes records (hot_path.cpp, fold.cpp). The native process group's entries are read by
capture/ddp_native.py's ``E_*`` positions from the tuple timed_group.cpp's ``entry_tuple()`` builds. A
field added, moved or renamed on one side only fails here, not in a training job.
"""

from __future__ import annotations

import os
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
