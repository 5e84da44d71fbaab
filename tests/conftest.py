from __future__ import annotations

import os

import pytest


@pytest.fixture
def fake_pg():
    """A 4-rank ``fake`` process group inside the test process (no transport: collectives return at once)."""
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    assert not dist.is_initialized()
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=4)
    yield dist.group.WORLD
    if dist.is_initialized():
        dist.destroy_process_group()


@pytest.fixture
def gloo_alone():
    """A 1-rank gloo group in the test process (DDP needs a backend whose futures carry the tensors)."""
    import torch.distributed as dist

    assert not dist.is_initialized()
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield dist.group.WORLD
    if dist.is_initialized():
        dist.destroy_process_group()


@pytest.fixture
def instrumented(tmp_path):
    """instrument() into a temporary run folder; always uninstrumented afterwards."""
    import otel_torchdist

    started = []

    def start(**options):
        opts = dict(
            run_dir=str(tmp_path / "runs"),
            run_id="unit",
            metrics_exporter=("file",),
            traces_exporter="file",
            summary="none",
        trace_every_steps=1,  # these tests read every span back
        )
        opts.update(options)
        otel_torchdist.instrument(**opts)
        started.append(True)
        return str(tmp_path / "runs" / opts["run_id"])

    yield start
    if started and otel_torchdist.TorchDistributedInstrumentor().is_instrumented_by_opentelemetry:
        otel_torchdist.uninstrument()


@pytest.fixture(scope="session")
def native_built():
    """otel-torchdist's native part, compiled for this torch (``.ci/install`` runs ``otel-torchdist
    build-native``; without it the first test that needs it compiles it, about a minute)."""
    from otel_torchdist import native

    if not native.is_built():
        native.build()
    return native.library_path()


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch):
    for var in list(os.environ):
        if var.startswith(("OTEL_", "TORCHELASTIC_", "SLURM_")):
            monkeypatch.delenv(var, raising=False)
