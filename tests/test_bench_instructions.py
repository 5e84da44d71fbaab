"""The instruction benchmark's arithmetic: reading callgrind's per-thread dumps and the two-length difference.

valgrind does not run in CI, so the dump files here are written by the test in callgrind's own format (the
``desc: Trigger`` and ``summary`` lines the benchmark reads, as callgrind 3.19 writes them).
"""

from __future__ import annotations

import importlib.util
import os

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))


@pytest.fixture(scope="module")
def bench():
    path = os.path.join(HERE, os.pardir, "benchmarks", "bench_instructions.py")
    spec = importlib.util.spec_from_file_location("bench_instructions", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _dump(folder, pid: int, part: int, thread: int, label: str | None, count: int) -> None:
    name = f"cg.{pid}.{part}-{thread:02d}" if part else f"cg.{pid}-{thread:02d}"
    trigger = f"dump {label}" if label else "Program termination"
    with open(os.path.join(folder, name), "w") as f:
        f.write(f"version: 1\ncreator: callgrind-3.19.0\npid: {pid}\npart: {part}\nthread: {thread}\n")
        f.write(f"desc: I1 cache: \ndesc: Trigger: {trigger}\n\npositions: line\nevents: Ir\nsummary: {count}\ntotals: {count}\n")


def test_read_sums_threads_per_section_and_keeps_the_main_thread_apart(bench, tmp_path):
    _dump(tmp_path, 7, 1, 1, "DDP plain:10:steps", 1000)
    _dump(tmp_path, 7, 1, 2, "DDP plain:10:steps", 30)  # a gloo thread
    _dump(tmp_path, 7, 2, 1, "DDP plain:40:steps", 4000)
    _dump(tmp_path, 7, 2, 3, "DDP plain:40:steps", 90)
    _dump(tmp_path, 7, 0, 1, None, 123456)  # the dump at exit belongs to no section
    main, every, threads = bench._read(str(tmp_path))
    assert main == {"DDP plain:10:steps": 1000, "DDP plain:40:steps": 4000}
    assert every == {"DDP plain:10:steps": 1030, "DDP plain:40:steps": 4090}
    assert threads == {"DDP plain:10:steps": {"01": 1000, "02": 30}, "DDP plain:40:steps": {"01": 4000, "03": 90}}


def test_per_unit_is_the_difference_of_the_two_lengths(bench):
    short, long = bench._lengths(40)
    assert (short, long) == (10, 40)
    counts = {
        # 500 fixed (a flush's metric export, callgrind's requests) + 100 per step
        f"DDP instrumented:{short}:steps": 500 + 100 * short,
        f"DDP instrumented:{long}:steps": 500 + 100 * long,
        f"DDP instrumented:{short}:flush": 700 + 7 * short,
        f"DDP instrumented:{long}:flush": 700 + 7 * long,
    }
    assert bench._per_unit(counts, 40) == {("DDP instrumented", "steps"): 100.0, ("DDP instrumented", "flush"): 7.0}


def test_the_timer_threads_are_taken_out_of_all_threads(bench, tmp_path, capsys):
    """Timer threads tick per second of wall time, and a step under callgrind takes far longer than in
    reality: the threads busy while the training thread sleeps are the timers, left out of all threads."""
    short, long = bench._lengths(40)
    for part, n in ((1, short), (3, long)):
        _dump(tmp_path, 7, part, 1, f"DDP plain:{n}:steps", 10_000 * n)
        _dump(tmp_path, 7, part, 4, f"DDP plain:{n}:steps", 100 * n)  # gloo's thread
    for part, n in ((5, short), (7, long)):
        _dump(tmp_path, 7, part, 1, f"DDP instrumented:{n}:steps", 11_000 * n)
        _dump(tmp_path, 7, part, 4, f"DDP instrumented:{n}:steps", 100 * n)
        _dump(tmp_path, 7, part, 9, f"DDP instrumented:{n}:steps", 3_000 * n)  # a timer, ticking in wall time
        _dump(tmp_path, 7, part + 1, 1, f"DDP instrumented:{n}:flush", 500 * n)
    _dump(tmp_path, 7, 9, 1, "DDP instrumented:0:timers", 50)  # callgrind's own request on the sleeping thread
    _dump(tmp_path, 7, 9, 4, "DDP instrumented:0:timers", 0)
    _dump(tmp_path, 7, 9, 9, "DDP instrumented:0:timers", 2_000)

    class Args:
        steps, batch = 40, 32

    bench._report_ddp(Args, bench._read(str(tmp_path)))
    out = capsys.readouterr().out.splitlines()
    (row,) = [line for line in out if line.startswith("DDP instrumented ")]
    (added,) = [line for line in out if line.startswith("all threads, per DDP step")]
    assert "otel-torchdist 2 k instructions over plain DDP" in added  # 11 600 - 10 100
    # training thread 11 000 (+10 %), deferred 500, timers 3 000 taken out: all threads 11 600 over 10 100
    assert row.split() == ["DDP", "instrumented", "0.011", "M", "+10.0%", "0.001", "M", "3", "k", "0.012", "M", "+14.9%"]
