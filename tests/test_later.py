"""Captures installed when the program imports what they capture (capture/later.py, on wrapt's post-import
hooks), and not after ``uninstrument()``."""

from __future__ import annotations

import sys

from otel_torchdist import health
from otel_torchdist.capture import later


def _module(tmp_path, monkeypatch, name: str) -> None:
    (tmp_path / f"{name}.py").write_text("VALUE = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, name, raising=False)


def test_the_hook_runs_once_the_module_is_imported_and_at_once_if_it_is(tmp_path, monkeypatch):
    _module(tmp_path, monkeypatch, "otel_later_probe_a")
    ran = []
    later.when_imported("otel_later_probe_a", lambda: ran.append("a"))
    assert ran == []
    import otel_later_probe_a  # noqa: F401

    assert ran == ["a"]
    later.when_imported("otel_later_probe_a", lambda: ran.append("again"))
    assert ran == ["a", "again"]


def test_after_cancel_a_waiting_hook_does_nothing(tmp_path, monkeypatch):
    _module(tmp_path, monkeypatch, "otel_later_probe_b")
    ran = []
    later.when_imported("otel_later_probe_b", lambda: ran.append("b"))
    later.cancel()
    import otel_later_probe_b  # noqa: F401

    assert ran == []


def test_a_failing_hook_is_counted_and_the_import_goes_on(tmp_path, monkeypatch):
    _module(tmp_path, monkeypatch, "otel_later_probe_c")
    health.reset()

    def broken():
        raise RuntimeError("no")

    later.when_imported("otel_later_probe_c", broken)
    import otel_later_probe_c

    assert otel_later_probe_c.VALUE == 1
    assert health.errors().get("capture") == 1


PROGRAM = """
import sys, tempfile
import torch.distributed as dist
from torch.testing._internal.distributed.fake_pg import FakeStore
import otel_torchdist
dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=2)
assert "torch.distributed.fsdp" not in sys.modules and "torch.distributed.tensor" not in sys.modules
otel_torchdist.instrument(run_dir=tempfile.mkdtemp(), summary="none", system_metrics=False,
                          traces_exporter="file", metrics_exporter=("file",))
assert "torch.distributed.fsdp" not in sys.modules and "torch.distributed.tensor" not in sys.modules, "imported"
from torch.distributed.fsdp._fully_shard._fsdp_param_group import FSDPParamGroup
import torch.distributed.tensor as t
import torch.distributed.tensor.placement_types as pt
ours = lambda f: "otel_torchdist" in f.__code__.co_filename
print(ours(FSDPParamGroup.unshard), ours(t.DTensor.redistribute), ours(pt.shard_dim_alltoall))
otel_torchdist.uninstrument()
print(ours(FSDPParamGroup.unshard), ours(t.DTensor.redistribute), ours(pt.shard_dim_alltoall))
"""


def test_fsdp_and_dtensor_captures_wait_for_their_import_and_leave_with_uninstrument():
    """A program that imports FSDP and DTensor only after instrument() (they cost a second of imports, so
    instrument() does not import them, and their captures wait) gets them captured, and uninstrument()
    restores them."""
    import subprocess

    done = subprocess.run([sys.executable, "-c", PROGRAM], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["True", "True", "True", "False", "False", "False"]


UNINSTRUMENTED = """
import gc, sys, tempfile, weakref
import torch.distributed as dist
from torch.testing._internal.distributed.fake_pg import FakeStore
import otel_torchdist
from otel_torchdist import runtime
dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=2)
left = []
for _ in range(3):
    otel_torchdist.instrument(run_dir=tempfile.mkdtemp(), summary="none", system_metrics=False,
                              traces_exporter="file", metrics_exporter=("file",), prometheus_port=0)
    left.append(weakref.ref(runtime.current()))
    otel_torchdist.uninstrument()
gc.collect()
print(sum(r() is not None for r in left), "fsdp" in str(sys.modules.get("torch.distributed.fsdp")))
"""


def test_uninstrument_lets_go_of_the_runtime_while_its_captures_still_wait():
    """wrapt keeps a waiting hook until its module is imported: the hooks of a program that never imports
    FSDP held every uninstrumented runtime, with its metric store, Prometheus registry and threads' objects
    (2.5 MB a cycle with 300 groups)."""
    import subprocess

    done = subprocess.run([sys.executable, "-c", UNINSTRUMENTED], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["0", "False"]
