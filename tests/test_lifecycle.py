"""Start and end of an instrumented process: late instrument(), flush at exit without teardown."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time

from otel_torchdist import names as n

from .harness import REPO, collective_spans, read_spans, run_ranks


def test_instrument_after_init_and_flush_at_exit(tmp_path):
    out = str(tmp_path / "job")
    run_ranks("instrument_after_init_no_uninstrument", 2, out)
    folder = os.path.join(out, "runs", "late")
    for rank in range(2):
        spans = collective_spans(read_spans(os.path.join(folder, f"traces.rank{rank}.jsonl")))
        assert sorted(s["name"] for s in spans) == ["all_reduce"] * 5 + ["broadcast"]
        assert spans[0]["resource"][n.RANK] == rank
        # The summary is written only when the runtime closes: here, by the exit finalizer of a spawned child.
        assert os.path.exists(os.path.join(folder, f"summary.rank{rank}.json"))
        assert os.path.exists(os.path.join(folder, f"metrics.rank{rank}.jsonl"))
    (b,) = [s for s in read_spans(os.path.join(folder, "traces.rank0.jsonl")) if s["name"] == "broadcast"]
    assert b["attributes"][n.COLL_ROOT] == 1


def test_plain_script_flushes_at_exit_quickly(tmp_path):
    script = textwrap.dedent(
        f"""
        import torch, torch.distributed as dist
        from torch.testing._internal.distributed.fake_pg import FakeStore
        import otel_torchdist
        otel_torchdist.instrument(run_dir={str(tmp_path)!r}, run_id="atexit", metrics_exporter=("file",))
        dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=8)
        for _ in range(100):
            dist.all_reduce(torch.ones(16))
        print("training done", flush=True)
        """
    )
    start = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=120,
        env={**os.environ, "OTEL_BSP_SCHEDULE_DELAY": "60000"},  # nothing leaves before exit
    )
    elapsed = time.monotonic() - start
    assert proc.returncode == 0, proc.stderr
    spans = collective_spans(read_spans(os.path.join(str(tmp_path), "atexit", "traces.rank0.jsonl")))
    assert len(spans) == 100
    # The summary is printed on rank 0 at exit, with the table and where the telemetry went.
    assert "otel-torchdist summary: run atexit, rank 0 of 8 (fake)" in proc.stderr
    assert "all_reduce" in proc.stderr and "run folder:" in proc.stderr
    assert elapsed < 60


def test_ranks_agree_on_a_run_id_without_a_collective(tmp_path):
    out = str(tmp_path / "job")
    results = run_ranks("agreed_run_id", 3, out)
    run_ids = {r["run_id"] for r in results}
    assert len(run_ids) == 1
    assert {r["again"] for r in results} == run_ids  # instrument() again on the same group: the same run
    assert len({r["instance"] for r in results}) == 3
    assert all(r["seq_before_first_collective"] == 0 for r in results)  # the agreement used no collective
    (run_id,) = run_ids
    assert os.listdir(os.path.join(out, "runs")) == [run_id]


def test_run_id_sources(monkeypatch):
    from otel_torchdist.identity import run_id_from_env

    assert run_id_from_env("mine") == "mine"
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    assert run_id_from_env(None) == "slurm-4242"
    monkeypatch.setenv("SLURM_STEP_ID", "3")
    assert run_id_from_env(None) == "slurm-4242.3"
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "job/7")
    assert run_id_from_env(None) == "job-7"  # wins over SLURM, sanitized for a folder name
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "none")  # torchrun's "not set"
    assert run_id_from_env(None) == "slurm-4242.3"


def test_an_elastic_attempt_ignores_the_value_a_previous_attempt_left(monkeypatch):
    """torchelastic's store outlives the workers: a rank takes only an attempt value written after it started."""
    import datetime
    import threading

    import torch.distributed as dist
    from torch.distributed import distributed_c10d as c10d

    from otel_torchdist import identity

    monkeypatch.setattr(identity, "_agreed", {})
    dist.init_process_group("gloo", store=dist.TCPStore("127.0.0.1", 0, 1, True), rank=0, world_size=1)
    try:
        store = c10d._get_default_store()
        store.set(identity.ATTEMPT_KEY, f"{identity.process_start_time() - 5:.6f} stale")
        monkeypatch.setattr(identity, "ATTEMPT_TIMEOUT", datetime.timedelta(seconds=1))
        assert identity._agree_attempt(1, 2) == "restart2"  # only the stale value, until the deadline
        monkeypatch.setattr(identity, "ATTEMPT_TIMEOUT", datetime.timedelta(seconds=20))
        writer = threading.Timer(0.3, lambda: store.set(identity.ATTEMPT_KEY, f"{time.time():.6f} fresh"))
        writer.start()
        assert identity._agree_attempt(1, 2) == "fresh"
        writer.join()
        store.set(identity.ATTEMPT_KEY, f"{time.time():.6f} later")
        assert identity._agree_attempt(1, 2) == "fresh"  # instrument() again on this group: what was agreed
        monkeypatch.setattr(identity, "_agreed", {})  # as on a new group
        mine = identity._agree_attempt(0, 2)  # rank 0 writes a new value, which the others then take
        monkeypatch.setattr(identity, "_agreed", {})
        assert mine not in ("fresh", "stale", "later", "restart2") and identity._agree_attempt(1, 2) == mine
    finally:
        dist.destroy_process_group()


def test_a_restarted_job_keeps_the_run_id_its_first_attempt_agreed(monkeypatch):
    """torchrun without --rdzv-id (TORCHELASTIC_RUN_ID "none"): rank 0 of a restart made a new run id while
    the other ranks read the one the first attempt left in the agent's store, so one attempt's ranks wrote
    to two run folders under two run ids."""
    import torch.distributed as dist
    from torch.distributed import distributed_c10d as c10d

    from otel_torchdist import identity

    monkeypatch.setattr(identity, "_agreed", {})
    dist.init_process_group("gloo", store=dist.TCPStore("127.0.0.1", 0, 1, True), rank=0, world_size=1)
    try:
        first = identity._agree_run_id(0)
        assert c10d._get_default_store().get(identity.STORE_KEY).decode() == first
        monkeypatch.setattr(identity, "_agreed", {})  # the restarted processes: the store is the agent's
        assert identity._agree_run_id(1) == first
        assert identity._agree_run_id(0) == first
    finally:
        dist.destroy_process_group()


def test_process_start_time_is_before_now_and_after_boot():
    from otel_torchdist import identity

    started = identity.process_start_time()
    assert started <= time.time() and time.time() - started < 24 * 3600


def test_a_group_destroyed_while_uninstrumented_is_not_reported_by_the_next_instrumentation(instrumented):
    """destroy_process_group() after uninstrument() goes unseen: the next instrument() must not keep the old
    group alive nor report it (the watchdog's per-group gauges would carry every group of every cycle)."""
    import torch
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    import otel_torchdist
    from otel_torchdist.capture import groups

    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=2)
    instrumented()
    dist.all_reduce(torch.ones(2))
    old = dist.group.WORLD
    otel_torchdist.uninstrument()
    dist.destroy_process_group()
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=2)
    try:
        instrumented()
        dist.all_reduce(torch.ones(2))
        assert [gi.pg for gi in groups.all_groups()] == [dist.group.WORLD]
        assert all(gi.pg is not old for gi in groups.all_groups())
    finally:
        otel_torchdist.uninstrument()
        dist.destroy_process_group()


def test_a_group_destroyed_after_uninstrument_is_let_go_before_the_interpreter_ends(tmp_path):
    """A group destroyed while uninstrumented is still held by the library: left to the interpreter's teardown,
    a gloo group's destructor can abort the process ("terminate called without an active exception"). The
    library lets it go at exit, while the interpreter is whole: an exit handler registered before the
    library's runs after it (atexit runs them last in, first out) and finds the group gone."""
    script = tmp_path / "destroyed.py"
    script.write_text(
        textwrap.dedent(
            """
            import atexit, gc, os, weakref
            import torch, torch.distributed as dist
            held = []
            atexit.register(lambda: (gc.collect(), print("freed at exit:", held[0]() is None, flush=True)))
            import otel_torchdist
            dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
            otel_torchdist.instrument(run_dir=os.environ["RUN_DIR"], summary="none", prometheus_port=0)
            sub = dist.new_group([0], group_desc="sub")
            dist.all_reduce(torch.ones(2), group=sub)
            otel_torchdist.uninstrument()
            dist.destroy_process_group(sub)  # unseen by the library: it is uninstrumented
            held.append(weakref.ref(sub))
            del sub
            gc.collect()
            print("freed before exit:", held[0]() is None, flush=True)
            dist.destroy_process_group()
            """
        )
    )
    env = dict(os.environ, RUN_DIR=str(tmp_path / "runs"), PYTHONPATH=REPO)
    out = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "freed before exit: False" in out.stdout  # the library still holds it, until the next instrument()
    assert "freed at exit: True" in out.stdout


def test_a_destroyed_group_leaves_the_functional_collectives_cache(fake_pg, instrumented):
    """funcol remembers each group argument's GroupInfo: a destroyed group must leave it (held there, it would
    live on; its name, taken by a later group, would find the old GroupInfo)."""
    import gc
    import weakref

    import torch
    import torch.distributed as dist
    import torch.distributed._functional_collectives as fc

    from otel_torchdist.capture import funcol

    instrumented()
    sub = dist.new_group([0, 1, 2, 3], group_desc="sub")
    fc.wait_tensor(fc.all_reduce(torch.ones(2), "sum", sub))
    assert sub in funcol._group_cache
    gone = weakref.ref(sub)
    dist.destroy_process_group(sub)
    del sub
    gc.collect()
    assert gone() is None and not funcol._group_cache


def test_an_explicit_flush_at_the_end_shares_the_ends_flush_timeout(fake_pg, instrumented, monkeypatch):
    """destroy_process_group() starts the process's end, whose flushes share one flush_timeout: a flush() of
    the program's after it waited a whole flush_timeout more (7.5 s against a never-answering endpoint
    where the issue allows 5)."""
    import torch.distributed as dist

    import otel_torchdist
    from otel_torchdist import runtime

    instrumented(flush_timeout=5.0)
    rt = runtime.current()
    asked: list[float] = []
    monkeypatch.setattr(rt.pipeline, "flush", lambda timeout, **kw: asked.append(timeout) or True)
    otel_torchdist.flush()
    dist.destroy_process_group()  # the end begins: its own flush takes what it needs of the 5 s
    otel_torchdist.flush()
    otel_torchdist.flush(timeout=1.0)  # a timeout of the program's own is its own
    assert asked[0] == 5.0 and asked[-1] == 1.0
    assert asked[-2] <= rt.end_budget() + 0.01 and asked[-2] <= asked[-3] <= 5.0
