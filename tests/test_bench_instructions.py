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
    (tmp_path / "log.txt").write_text(f"some output\n{bench.WALL}DDP plain:10:steps 0.500000\n")
    main, every, walls = bench._read(str(tmp_path))
    assert main == {"DDP plain:10:steps": 1000, "DDP plain:40:steps": 4000}
    assert every == {"DDP plain:10:steps": 1030, "DDP plain:40:steps": 4090}
    assert walls == {"DDP plain:10:steps": 0.5}


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


def test_the_timers_ticking_in_wall_time_are_taken_out_of_all_threads(bench, capsys):
    """Timer threads tick per second of wall time; a step under callgrind takes far longer than in reality,
    so their ticks during the steps are removed at the rate their own section measured."""
    short, long = bench._lengths(40)
    every = {
        f"DDP plain:{short}:steps": 10_000 * short,
        f"DDP plain:{long}:steps": 10_000 * long,
        # 1 000 a step of training and deferred work, plus 2 000 instructions a second of timers over
        # 0.5 s a step under callgrind: 1 000 a step that are the timers'
        f"DDP instrumented:{short}:steps": 11_500 * short,
        f"DDP instrumented:{long}:steps": 11_500 * long,
        f"DDP instrumented:{short}:flush": 500 * short,
        f"DDP instrumented:{long}:flush": 500 * long,
        "DDP instrumented:0:timers": int(2_000 * bench.TIMERS_S),
    }
    main = {k: v for k, v in every.items() if k.endswith(":steps")}
    walls = {f"DDP instrumented:{short}:steps": 0.5 * short, f"DDP instrumented:{long}:steps": 0.5 * long}

    class Args:
        steps, batch = 40, 32

    bench._report_ddp(Args, (main, every, walls))
    (row,) = [line for line in capsys.readouterr().out.splitlines() if line.startswith("DDP instrumented ")]
    # training thread 11 500 (+15 %), deferred 500, timers 1 000 taken out: all threads 11 000, +10 %
    assert row.split() == ["DDP", "instrumented", "0.01", "M", "+15.0%", "0.00", "M", "1", "k", "0.01", "M", "+10.0%"]
