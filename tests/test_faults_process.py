"""Faults on the training side never hurt training, and what could be kept is kept.

Real processes throughout: torchrun (elastic restart, SIGTERM forwarded to the ranks), gloo ranks from the
launcher, and the fake backend for a million collectives in one process.
"""

from __future__ import annotations

import glob
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections import Counter

import pytest

from otel_torchdist import names as n
from tests.harness import REPO, collective_spans, last_metrics, metric_value, read_spans, run_ranks, wait_for


def _torchrun(out: str, mode: str, restarts: int = 0) -> subprocess.Popen:
    os.makedirs(out, exist_ok=True)
    env = {**os.environ, "PYTHONPATH": REPO + os.pathsep + os.environ.get("PYTHONPATH", "")}
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
        "--max-restarts", str(restarts), "--monitor-interval", "0.2",
        "-m", "tests.scenarios_faults", out, mode,
    ]  # fmt: skip
    log = open(os.path.join(out, "torchrun.log"), "w")
    return subprocess.Popen(cmd, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)


def _log(out: str) -> str:
    return open(os.path.join(out, "torchrun.log")).read()


def _spans_by_instance(out: str) -> dict[str, list[dict]]:
    by: dict[str, list[dict]] = {}
    for path in glob.glob(os.path.join(out, "runs", "*", "traces.rank*.jsonl")):
        for span in read_spans(path):
            by.setdefault(span["resource"][n.SERVICE_INSTANCE_ID], []).append(span)
    return by


# ----------------------------------------------------------------------- rank failure, elastic restart
@pytest.fixture(scope="module")
def elastic(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("elastic"))
    proc = _torchrun(out, "fail", restarts=1)
    try:
        proc.wait(240)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise AssertionError("torchrun did not finish:\n" + _log(out)[-4000:]) from None
    return {"out": out, "rc": proc.returncode, "log": _log(out), "spans": _spans_by_instance(out)}


def test_failed_rank_exception_is_unchanged_and_the_job_restarts(elastic):
    assert elastic["rc"] == 0, elastic["log"][-4000:]
    assert "ValueError: planted failure on rank 1 at step 3" in elastic["log"]
    for rank in (0, 1):
        assert os.path.exists(os.path.join(elastic["out"], f"done.rank{rank}.attempt1"))


def test_restart_gets_fresh_instance_ids_and_the_same_run_id(elastic):
    spans = elastic["spans"]
    run_ids = {s["resource"][n.RUN_ID] for group in spans.values() for s in group}
    assert len(run_ids) == 1
    (run_id,) = run_ids
    assert set(spans) == {f"{run_id}-rank0", f"{run_id}-rank1", f"{run_id}-rank0-attempt1", f"{run_id}-rank1-attempt1"}
    for instance, group in spans.items():
        assert {s["resource"][n.RESTART_COUNT] for s in group} == {1 if "attempt1" in instance else 0}


def test_a_restart_makes_new_step_ids_that_its_ranks_share(elastic):
    """torchelastic keeps the run id and the store across attempts while steps count from 1 again: the
    attempts' step traces and spans must not share ids, and the ranks of one attempt must share theirs."""
    spans = elastic["spans"]
    run_id = next(iter(spans)).split("-rank")[0]
    ids = Counter((s["traceId"], s["spanId"]) for group in spans.values() for s in group)
    assert max(ids.values()) == 1, [k for k, v in ids.items() if v > 1][:3]
    traces = {}
    for suffix in ("", "-attempt1"):
        rank_steps = [
            {s["attributes"][n.STEP]: s for s in spans[f"{run_id}-rank{rank}{suffix}"] if s["name"] == n.SPAN_RANK_STEP}
            for rank in (0, 1)
        ]
        roots = {s["attributes"][n.STEP]: s for s in spans[f"{run_id}-rank0{suffix}"] if s["name"] == n.SPAN_STEP}
        for step in (1, 2):
            r0, r1 = rank_steps[0][step], rank_steps[1][step]
            assert r0["traceId"] == r1["traceId"] == roots[step]["traceId"]
            assert r0["parentSpanId"] == r1["parentSpanId"] == roots[step]["spanId"]
            assert (r0["flags"], r1["flags"]) == (0x101, 0x301)  # rank 1's parent is in rank 0's process
        traces[suffix] = {rank_steps[0][step]["traceId"] for step in (1, 2)}
    assert not traces[""] & traces["-attempt1"]


def test_failed_rank_exports_the_step_it_failed_in(elastic):
    run_id = next(iter(elastic["spans"])).split("-rank")[0]
    failed = [s for s in elastic["spans"][f"{run_id}-rank1"] if s["name"] == n.SPAN_RANK_STEP]
    by_step = {s["attributes"][n.STEP]: s for s in failed}
    assert sorted(by_step) == [1, 2, 3]
    step3 = by_step[3]
    assert step3["status"]["code"] == 2
    assert step3["status"]["message"] == "ValueError: planted failure on rank 1 at step 3"
    (event,) = step3["events"]
    assert event["name"] == n.EXCEPTION_EVENT
    assert all(by_step[i].get("status", {}).get("code", 0) != 2 for i in (1, 2))


def test_surviving_rank_flushed_up_to_the_failure(elastic):
    run_id = next(iter(elastic["spans"])).split("-rank")[0]
    survivor = elastic["spans"][f"{run_id}-rank0"]
    steps = sorted(s["attributes"][n.STEP] for s in survivor if s["name"] == n.SPAN_RANK_STEP)
    assert steps[:2] == [1, 2]
    # Step 3's gradient all-reduce: gloo failed it when the peer died (or, depending on timing, torchrun's
    # SIGTERM came first and it is exported unfinished). Either way it was exported, and says so.
    ddp = [s for s in collective_spans(survivor) if s["attributes"].get(n.COLL_FRAMEWORK) == "ddp"]
    assert sum(1 for s in ddp if s["attributes"][n.COLL_OP] == "all_reduce") == 3
    last = ddp[-1]
    assert last.get("status", {}).get("code") == 2 or last["attributes"][n.COLL_END_SOURCE] == n.END_UNFINISHED


# ------------------------------------------------------------------------------------------- SIGTERM
def _sigterm(proc: subprocess.Popen, ready, timeout: float) -> float:
    """Once ``ready()`` has run, send SIGTERM; seconds until the process ended (killed if it did not)."""
    try:
        ready()
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout)
        return time.monotonic() - t0
    finally:
        proc.kill()


def test_sigterm_flushes_and_exits_within_the_flush_timeout(tmp_path):
    out = str(tmp_path)
    proc = _torchrun(out, "stuck")

    def ready() -> None:
        wait_for(lambda: len(glob.glob(os.path.join(out, "started.rank*"))) == 2, 60, what="both ranks started")
        time.sleep(1.0)  # rank 1 is now inside its all_reduce, rank 0 asleep in Python

    took = _sigterm(proc, ready, 60)
    assert took < 3.0 + 5.0, _log(out)[-3000:]  # flush_timeout 3 s, plus torchrun's own shutdown
    spans = _spans_by_instance(out)
    (stuck,) = [v for k, v in spans.items() if k.endswith("rank1")]
    ops = collective_spans(stuck)
    assert [s["attributes"][n.COLL_END_SOURCE] for s in ops][-1] == n.END_UNFINISHED
    assert len(ops) == 3
    for rank in (0, 1):
        (path,) = glob.glob(os.path.join(out, "runs", "*", f"metrics.rank{rank}.jsonl"))
        calls = metric_value(last_metrics(path), n.COLLECTIVE_CALLS, op="all_reduce")
        assert calls == 2 + rank  # rank 1 made a third call, exported unfinished


_PREAMBLE = """
import os, signal, sys, threading, time
import torch, torch.distributed as dist
from torch.testing._internal.distributed.fake_pg import FakeStore
import otel_torchdist
otel_torchdist.instrument(run_dir=sys.argv[1], run_id="sig", metrics_exporter=("file",))
dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=2)
"""


def _script(tmp_path, body: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", _PREAMBLE + textwrap.dedent(body), str(tmp_path)],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def test_a_sigterm_handler_the_program_sets_later_decides_alone(tmp_path):
    """Preemption code (Lightning, Slurm scripts) installs its SIGTERM handler once training starts: it
    checkpoints and exits 0. The watcher ended the process 0.5 s after the signal instead."""
    proc = _script(
        tmp_path,
        """
        stop = threading.Event()
        signal.signal(signal.SIGTERM, lambda signum, frame: stop.set())
        os.kill(os.getpid(), signal.SIGTERM)
        while not stop.is_set():
            dist.all_reduce(torch.ones(4))
        time.sleep(1.5)  # the checkpoint
        for _ in range(3):
            dist.all_reduce(torch.ones(4))
        print("checkpoint saved", flush=True)
        """,
    )
    assert proc.returncode == 0 and "checkpoint saved" in proc.stdout, proc.stderr[-2000:]
    # telemetry went on after the signal: the last collectives are in the run folder
    spans = collective_spans(read_spans(os.path.join(str(tmp_path), "sig", "traces.rank0.jsonl")))
    assert len(spans) == 3


def test_a_forked_child_is_not_the_rank(tmp_path):
    """A fork (DataLoader worker, multiprocessing child) inherits the watcher's pipe: terminating the child
    ended the parent (143), and a child exiting normally flushed and printed a summary of its own."""
    proc = _script(
        tmp_path,
        """
        import multiprocessing as mp
        ctx = mp.get_context("fork")
        stuck = ctx.Process(target=time.sleep, args=(30,))
        stuck.start()
        time.sleep(0.5)
        stuck.terminate()
        stuck.join()
        done = ctx.Process(target=dist.all_reduce, args=(torch.ones(4),))
        done.start()
        done.join()
        time.sleep(1.0)  # the parent's watcher would have ended it by now
        dist.all_reduce(torch.ones(4))
        print("parent went on", stuck.exitcode, done.exitcode, flush=True)
        """,
    )
    assert proc.returncode == 0 and "parent went on -15 0" in proc.stdout, proc.stderr[-2000:]
    assert proc.stderr.count("otel-torchdist summary") == 1


_FORK_RANKS = """
import os, socket, sys
import torch, torch.distributed as dist, torch.multiprocessing as mp
import otel_torchdist

def rank(r, port, again):
    if again:  # the rank's own code instruments too, as a script written for torchrun does
        otel_torchdist.instrument(run_dir=sys.argv[1], run_id="forked", metrics_exporter=("file",))
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=r, world_size=2)
    model = torch.nn.Linear(4, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(20):
        model(torch.ones(2, 4)).sum().backward()
        for p in model.parameters():
            dist.all_reduce(p.grad)
        opt.step()
        opt.zero_grad()
    if r == 0:
        dist.destroy_process_group()  # rank 1 leaves it to the process's end

if __name__ == "__main__":
    otel_torchdist.instrument(run_dir=sys.argv[1], run_id="forked", metrics_exporter=("file",))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.start_processes(rank, args=(port, sys.argv[2] == "again"), nprocs=2, start_method="fork")
    print("parent done", flush=True)
"""


@pytest.mark.parametrize("again", ["inherited", "again"])
def test_ranks_a_fork_launcher_starts_from_an_instrumented_parent_are_instrumented(tmp_path, again):
    """Notebook and fork launchers (Lightning's ddp_notebook, accelerate's notebook_launcher): the parent
    called instrument(), the ranks are its forks. They ran on the parent's patches with no thread to drain
    them: 100 of 169 calls counted, the rest dropped, no summary; and a rank's own instrument() was refused
    ("Attempting to instrument while already instrumented")."""
    script = tmp_path / "fork_ranks.py"
    script.write_text(_FORK_RANKS)
    proc = subprocess.run(
        [sys.executable, str(script), str(tmp_path), again], cwd=REPO, capture_output=True, text=True, timeout=120,
        env={**os.environ, "OTEL_EXPORTER_PROMETHEUS_PORT": "0"},
    )  # fmt: skip
    assert proc.returncode == 0 and "parent done" in proc.stdout, proc.stderr[-3000:]
    assert "already instrumented" not in proc.stderr, proc.stderr[-3000:]
    for r in (0, 1):
        with open(os.path.join(str(tmp_path), "forked", f"summary.rank{r}.json")) as f:
            summary = json.load(f)
        assert [(row["op"], row["calls"]) for row in summary["collectives"]] == [("all_reduce", 40)], summary
        metrics = last_metrics(os.path.join(str(tmp_path), "forked", f"metrics.rank{r}.jsonl"))
        assert metric_value(metrics, n.STEPS_METRIC) == 20
        dropped = [p for p in metrics.get(n.TELEMETRY_DROPPED.name, []) if p["attributes"].get("kind") == "record"]
        assert all(int(p["asInt"]) == 0 for p in dropped), dropped
    assert proc.stderr.count("otel-torchdist summary") == 1  # rank 0's; the parent made no process group


def test_uninstrument_from_another_thread_then_instrument_again_flushes_on_sigterm(tmp_path):
    """Signal handlers can only be changed on the main thread: uninstrument() on another thread left the
    first instrumentation's SIGTERM handler and watcher in place, the second instrument() installed none, and
    SIGTERM ended the process without flushing what the second one recorded."""
    proc = _script(
        tmp_path,
        """
        dist.all_reduce(torch.ones(2))
        t = threading.Thread(target=otel_torchdist.uninstrument)
        t.start()
        t.join()
        print("watchers", [x.name for x in threading.enumerate()].count("otel-torchdist-sigterm"), flush=True)
        otel_torchdist.instrument(run_dir=sys.argv[1], run_id="sig2", metrics_exporter=("file",))
        for _ in range(20):
            dist.all_reduce(torch.ones(2))
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)
        print("still alive", flush=True)
        """,
    )
    assert proc.returncode == -signal.SIGTERM, (proc.returncode, proc.stderr[-2000:])
    assert "watchers 0" in proc.stdout and "still alive" not in proc.stdout
    assert "otel-torchdist summary: run sig2" in proc.stderr, proc.stderr[-2000:]
    with open(os.path.join(str(tmp_path), "sig2", "summary.rank0.json")) as f:
        summary = json.load(f)
    assert sum(row["calls"] for row in summary["collectives"]) == 20, summary["collectives"]


def test_uninstrument_leaves_a_wakeup_fd_set_after_it_alone():
    """asyncio's add_signal_handler sets its own wakeup fd after instrument(): uninstrument() took it away."""
    script = textwrap.dedent(
        """
        import asyncio, os, signal
        import otel_torchdist
        otel_torchdist.instrument(traces_exporter="none", metrics_exporter=("none",))
        loop = asyncio.new_event_loop()
        ran = []
        loop.add_signal_handler(signal.SIGUSR1, lambda: (ran.append(1), loop.stop()))
        otel_torchdist.uninstrument()
        loop.call_later(0.1, os.kill, os.getpid(), signal.SIGUSR1)
        loop.call_later(5, loop.stop)
        loop.run_forever()
        print("ran" if ran else "never ran", flush=True)
        """
    )
    proc = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert proc.stdout.strip() == "ran", proc.stderr[-2000:]


def test_sigterm_during_the_exit_flush_waits_for_it(tmp_path):
    """torchrun stops a rank whose peer died just as the rank's own exception ends it: the SIGTERM lands
    in the exit handler's flush. It must not cut that flush short (it did, and the rank's run folder missed
    its spans and summary)."""
    from tests.test_faults_export import BlackHole  # a real socket that accepts and never answers

    out = str(tmp_path)
    hole = BlackHole()
    env = {**os.environ, "PYTHONPATH": REPO + os.pathsep + os.environ.get("PYTHONPATH", "")}
    log = open(os.path.join(out, "torchrun.log"), "w")
    cmd = [sys.executable, "-m", "tests.scenarios_faults", "exiting", out, hole.endpoint]
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)

    def ready() -> None:
        wait_for(lambda: os.path.exists(os.path.join(out, "ready")), 60, what="the rank's collectives")
        wait_for(lambda: hole.connections, 10, what="the exit flush sending to the black hole")

    try:
        took = _sigterm(proc, ready, 30)
    finally:
        hole.stop()
    text = _log(out)
    assert "RuntimeError: planted: the program ends with an exception" in text
    assert proc.returncode in (-signal.SIGTERM, 128 + signal.SIGTERM), text[-3000:]
    assert took < 2 * 3.0 + 5.0, text[-3000:]  # the flush is bounded by flush_timeout (3 s) per exporter
    # The summary is written last, after the exporters' flush: the close ran to its end.
    with open(os.path.join(out, "runs", "exiting", "summary.rank0.json")) as f:
        summary = json.load(f)
    assert [(c["op"], c["calls"]) for c in summary["collectives"]] == [("all_reduce", 3)]


# --------------------------------------------------------------------------------- collective errors
@pytest.fixture(scope="module")
def errors_job(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("errors"))
    results = run_ranks("scenarios_faults:collective_errors", 2, out)
    spans = [read_spans(os.path.join(out, "runs", "errors-ws2", f"traces.rank{r}.jsonl")) for r in range(2)]
    return {"results": results, "spans": spans}


def test_bad_calls_raise_exactly_what_they_raise_uninstrumented(errors_job):
    for result in errors_job["results"]:
        plain, seen = result["plain"], result["seen"]
        for name in ("all_gather_into_tensor", "all_gather", "reduce_scatter_tensor", "no_group"):
            assert seen[name] == plain[name], name
            if name != "no_group":
                assert seen[name + ":raised_in"] == ["distributed_c10d.py"]  # where torch raised it, not by us


def test_error_spans_carry_status_and_message(errors_job):
    for rank, result in enumerate(errors_job["results"]):
        errors = [s for s in collective_spans(errors_job["spans"][rank]) if s.get("status", {}).get("code") == 2]
        by_op = {}
        for s in errors:
            by_op.setdefault(s["attributes"][n.COLL_OP], []).append(s)
        for name in ("all_gather_into_tensor", "all_gather", "reduce_scatter_tensor"):
            (span,) = by_op[name]
            assert span["attributes"][n.ERROR_TYPE] == "RuntimeError"
            assert result["seen"][name][1].split("[...]")[-1][:60] in span["status"]["message"]
        (gone,) = by_op["all_reduce"] if rank == 0 else [s for s in by_op["all_reduce"] if s["attributes"][n.COLL_GROUP_DESC] == "uninitialized"]
        assert gone["attributes"][n.ERROR_TYPE] == "ValueError"
        assert "Default process group has not been initialized" in gone["status"]["message"]
    timed_out = [s for s in errors_job["spans"][1] if s.get("status", {}).get("code") == 2 and s["attributes"].get(n.COLL_GROUP_DESC) not in ("default_pg", "uninitialized")]
    (span,) = timed_out
    assert 1.5 < float(errors_job["results"][1]["seen"]["timeout_after"][0]) < 10
    assert errors_job["results"][1]["seen"]["timeout"][1][:40] in span["status"]["message"]


# ------------------------------------------------------------------------------------------- threads
def test_concurrent_threads_and_ddp_lose_and_mix_up_nothing(tmp_path):
    count, nthreads, steps = 300, 4, 10
    results = run_ranks("scenarios_faults:threads", 2, str(tmp_path), {"count": count, "threads": nthreads, "steps": steps})
    for rank, result in enumerate(results):
        assert result["wrong"] == []
        folder = os.path.join(str(tmp_path), "runs", "threads-ws2")
        metrics = last_metrics(os.path.join(folder, f"metrics.rank{rank}.jsonl"))
        spans = collective_spans(read_spans(os.path.join(folder, f"traces.rank{rank}.jsonl")))
        for i in range(nthreads):
            group = f"thread{i}"
            assert metric_value(metrics, n.COLLECTIVE_CALLS, op="all_reduce", group=group) == count
            assert metric_value(metrics, n.COLLECTIVE_BYTES, op="all_reduce", group=group) == count * 8 * (i + 1) * 4
            mine = [s for s in spans if s["attributes"][n.COLL_GROUP_DESC] == group]
            assert len(mine) == count
            assert {s["attributes"][n.COLL_NUMEL] for s in mine} == {8 * (i + 1)}
            assert sorted(s["attributes"][n.COLL_SEQ] for s in mine) == list(range(1, count + 1))
        ddp = [s for s in spans if s["attributes"].get(n.COLL_FRAMEWORK) == "ddp" and s["attributes"][n.COLL_OP] == "all_reduce"]
        assert len(ddp) == steps * result["buckets"]
        assert {s["attributes"][n.COLL_GROUP_DESC] for s in ddp} == {"default_pg"}
        assert "torchdist.telemetry.dropped" not in metrics or all(
            float(p.get("asInt", 0)) == 0 for p in metrics["torchdist.telemetry.dropped"]
        )


# ---------------------------------------------------------------------------------------------- soak
def test_a_million_collectives_in_bounded_memory_with_nothing_leaked(tmp_path):
    total = 1_000_000
    proc = subprocess.run(
        [sys.executable, "-m", "tests.scenarios_faults", "soak", str(total), str(tmp_path)],
        cwd=REPO, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    rss = dict((int(i), mb) for i, mb in result["rss_mb"])
    # After warm-up, growth is bounded by the configured queues, not by the number of collectives.
    assert rss[total] - rss[total // 5] < 32, result["rss_mb"]
    assert result["after"] == result["before"], result  # no thread or descriptor left behind
    folder = os.path.join(str(tmp_path), "runs", "soak")
    metrics = last_metrics(os.path.join(folder, "metrics.rank0.jsonl"))
    assert metric_value(metrics, n.COLLECTIVE_CALLS, op="all_reduce") == total  # metrics exact
    # Steps 1-10 (100 collectives each) and the never-ending last step (traced, capped) are sampled.
    exported = len(collective_spans(read_spans(os.path.join(folder, "traces.rank0.jsonl"))))
    drops = result["drops"]
    capped = total // 2 - 10_000
    assert drops.get("span_step_limit") == capped
    assert exported + drops.get("span", 0) == 10 * 100 + 10_000  # every traced span exported or counted
    assert result["errors"] == {}
