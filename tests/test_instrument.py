"""instrument() / uninstrument(): identity restore, idempotence, refusal without half-state, P2POp."""

from __future__ import annotations

import logging
import os

import pytest
import torch
import torch.distributed as dist

import otel_torchdist
from otel_torchdist import TorchDistributedInstrumentor
from otel_torchdist.capture import c10d
from otel_torchdist.patching import _MISSING, _own_attribute

from .harness import collective_spans, library_log, read_spans


def _snapshot():
    """Every patch site that exists in this torch (c10d has no ``_broadcast_coalesced`` binding, say)."""
    found = {(id(p.owner), p.name): _own_attribute(p.owner, p.name)[0] for p in c10d.patches()}
    return {k: v for k, v in found.items() if v is not _MISSING}


def test_uninstrument_restores_every_patched_attribute_to_the_identical_object(fake_pg, instrumented):
    before = _snapshot()
    assert len(before) > 60  # both namespaces, ProcessGroup methods, Work.wait
    instrumented()
    during = _snapshot()
    replaced = [key for key in before if during[key] is not before[key]]
    assert len(replaced) == len(before), "every patch site is instrumented"
    otel_torchdist.uninstrument()
    after = _snapshot()
    assert all(after[key] is before[key] for key in before)
    # pybind methods come back as the stored descriptor, so self-binding still works
    assert c10d.c10d.ProcessGroup.__dict__["send"] is before[(id(c10d.c10d.ProcessGroup), "send")]
    dist.all_reduce(torch.ones(2))


def test_a_name_bound_while_instrumented_records_nothing_after(fake_pg, instrumented):
    """``from torch.distributed import all_reduce`` (torch's own _collective_utils does this too) keeps the
    wrapper past uninstrument(): it must then only call through, queueing nothing nobody drains."""
    import torch.distributed._functional_collectives as funcol

    from otel_torchdist.capture import record

    instrumented()
    from torch.distributed import all_reduce as bound

    bound_funcol = funcol.all_reduce
    bound_wait = dist.Work.wait
    otel_torchdist.uninstrument()
    before = len(record.QUEUE)
    x = torch.ones(4)
    for _ in range(10):
        bound(x)
        bound_wait(bound(x, async_op=True))
        bound_funcol(x, "sum", fake_pg).wait()
    assert len(record.QUEUE) == before
    assert torch.equal(x, torch.ones(4))  # the fake backend leaves the data as it is


def test_instrument_twice_is_harmless_and_names_what_it_ignored(fake_pg, instrumented):
    from opentelemetry.sdk.trace import TracerProvider

    folder = instrumented()
    first = _snapshot()
    with library_log() as said:
        otel_torchdist.instrument(run_dir="elsewhere", run_id="unit", service_name="other")
        otel_torchdist.instrument(skip_dep_check=True)  # BaseInstrumentor's own option: no option of ours ignored
        otel_torchdist.instrument(tracer_provider=TracerProvider(shutdown_on_exit=False))
    said = [m.removeprefix("otel-torchdist: ") for m in said]
    assert said[0] == (
        "already instrumented; ignored run_dir='elsewhere' (in force: %r), "
        "service_name='other' (in force: 'torch-distributed'). Call otel_torchdist.uninstrument() first to "
        "change options" % os.path.dirname(folder)
    )  # run_id is the one in force: not named
    assert said[1] == "already instrumented; instrument() again changes nothing"
    assert said[2].startswith("already instrumented; ignored tracer_provider (a different provider)")
    assert _snapshot() == first
    dist.all_reduce(torch.ones(2))
    otel_torchdist.uninstrument()
    otel_torchdist.uninstrument()  # and twice the other way: only a warning
    spans = collective_spans(read_spans(os.path.join(folder, "traces.rank0.jsonl")))
    assert [s["name"] for s in spans] == ["all_reduce"]


def test_bad_option_refuses_without_patching_anything(fake_pg):
    before = _snapshot()
    with pytest.raises(ValueError, match="protocol"):
        otel_torchdist.instrument(protocol="smoke-signals")
    assert _snapshot() == before
    assert not TorchDistributedInstrumentor().is_instrumented_by_opentelemetry


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def test_bad_variable_of_ours_names_it(fake_pg, monkeypatch):
    monkeypatch.setenv("OTEL_TORCHDIST_DRAIN_INTERVAL_MS", "every now and then")
    with pytest.raises(ValueError, match="OTEL_TORCHDIST_DRAIN_INTERVAL_MS"):
        otel_torchdist.instrument()
    assert not TorchDistributedInstrumentor().is_instrumented_by_opentelemetry


def test_bad_standard_variable_is_ignored_and_training_goes_on_captured(fake_pg, monkeypatch, instrumented):
    """The SDK in the same process ignores it with a warning: so does the library, instead of ending the job."""
    monkeypatch.setenv("OTEL_METRIC_EXPORT_INTERVAL", "every now and then")
    seen = _Records()
    logging.getLogger("otel_torchdist").addHandler(seen)
    try:
        instrumented()
    finally:
        logging.getLogger("otel_torchdist").removeHandler(seen)
    assert TorchDistributedInstrumentor().is_instrumented_by_opentelemetry
    assert any("OTEL_METRIC_EXPORT_INTERVAL='every now and then'" in m for m in seen.messages), seen.messages


def test_unwritable_run_folder_is_refused_by_name_when_files_are_the_destination(fake_pg):
    before = _snapshot()
    bad = "/etc/hostname/runs"  # under a regular file: not creatable, even by root (CI runs as root)
    with pytest.raises(ValueError, match=r"run_dir / OTEL_TORCHDIST_RUN_DIR '/etc/hostname/runs' is not writable"):
        otel_torchdist.instrument(run_dir=bad)
    assert _snapshot() == before
    assert not TorchDistributedInstrumentor().is_instrumented_by_opentelemetry
    # Exporting elsewhere, the folder is only for the summary: a warning, and training goes on captured.
    seen = _Records()
    logging.getLogger("otel_torchdist").addHandler(seen)
    otel_torchdist.instrument(run_dir=bad, traces_exporter="none", metrics_exporter="none", summary="none")
    logging.getLogger("otel_torchdist").removeHandler(seen)
    try:
        assert any("is not writable" in m for m in seen.messages)
        assert len(_snapshot()) == len(before) and _snapshot() != before
        dist.all_reduce(torch.ones(2))
    finally:
        otel_torchdist.uninstrument()
    assert _snapshot() == before


def test_sdk_disabled_patches_nothing(fake_pg, monkeypatch):
    monkeypatch.setenv("OTEL_SDK_DISABLED", "true")
    before = _snapshot()
    otel_torchdist.instrument()
    try:
        assert _snapshot() == before
    finally:
        otel_torchdist.uninstrument()


def test_p2pop_and_isend_identity_survive(fake_pg, instrumented):
    instrumented()
    # P2POp checks its op against the module's isend/irecv by identity: they must not be replaced.
    op = dist.P2POp(dist.isend, torch.ones(2), 1)
    assert op.op is dist.isend is c10d.c10d.isend
    dist.P2POp(dist.irecv, torch.ones(2), 1)
    assert not hasattr(dist.isend, "__otel_torchdist_wrapped__")


def test_wrappers_keep_names_docs_and_signatures(fake_pg, instrumented):
    import inspect

    original = inspect.signature(dist.all_reduce)
    instrumented()
    assert dist.all_reduce.__name__ == "all_reduce"
    assert dist.all_reduce.__doc__ and "all_reduce" in dist.all_reduce.__doc__ or dist.all_reduce.__doc__
    assert inspect.signature(dist.all_reduce) == original


def test_result_and_exception_pass_through(fake_pg, instrumented):
    folder = instrumented()
    work = dist.all_reduce(torch.ones(2), async_op=True)
    assert isinstance(work, dist.Work)
    assert dist.all_reduce(torch.ones(2)) is None
    objs = [None] * 4
    dist.all_gather_object(objs, {"a": 1})
    with pytest.raises(TypeError):
        dist.all_reduce("not a tensor")
    otel_torchdist.uninstrument()
    names = [s["name"] for s in collective_spans(read_spans(os.path.join(folder, "traces.rank0.jsonl")))]
    assert sorted(names) == ["all_gather_object", "all_reduce", "all_reduce", "all_reduce"]


def test_entry_point_is_registered():
    from importlib.metadata import entry_points

    eps = entry_points(group="opentelemetry_instrumentor")
    (ep,) = [e for e in eps if e.name == "torch_distributed"]
    assert ep.load() is TorchDistributedInstrumentor
    assert TorchDistributedInstrumentor().instrumentation_dependencies() == ("torch >= 2.6.0a0",)


def test_the_torch_range_takes_nvidia_containers_builds():
    """NGC 25.01's torch is 2.6.0a0+ecf3bae40a, which sorts before 2.6: the dependency check refused it and
    instrument() did nothing but log an error."""
    from packaging.requirements import Requirement

    (spec,) = TorchDistributedInstrumentor().instrumentation_dependencies()
    accepts = Requirement(spec).specifier
    assert all(accepts.contains(v, prereleases=True) for v in ("2.6.0a0+ecf3bae40a", "2.6.0", "2.13.0", "2.14.0.dev20261101"))
    assert not any(accepts.contains(v, prereleases=True) for v in ("2.5.1", "2.5.0a0+872d972e41"))


UNSEEN = """
import torch
from torch.distributed import all_reduce, init_process_group
import torch.distributed as dist
import otel_torchdist
otel_torchdist.instrument(run_dir=__import__("sys").argv[1], metrics_exporter=("file",), prometheus_port=0)
init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
all_reduce(torch.ones(2))  # torch's own function: bound before instrument()
if __import__("sys").argv[2] == "destroy":
    dist.destroy_process_group()
"""


@pytest.mark.parametrize("end", ["exit", "destroy"])
def test_a_process_group_no_collective_went_through_is_said_at_the_end(tmp_path, end):
    """Functions imported by name before instrument() are torch's own: the job ended with no run folder and
    no summary, and nothing said why."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", UNSEEN, str(tmp_path), end], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    said = [line for line in done.stderr.splitlines() if "no collective went through otel-torchdist" in line]
    assert len(said) == 1 and "import it after instrument()" in said[0], done.stderr[-3000:]
