"""Rank-tagged logging: the prefix, the level variable, rank-zero helpers."""

from __future__ import annotations

import subprocess
import sys
import textwrap

from .harness import REPO


def _run(code: str, env: dict) -> subprocess.CompletedProcess:
    import os

    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], cwd=REPO, capture_output=True, text=True, timeout=120,
        env={**os.environ, **env},
    )  # fmt: skip


SCRIPT = """
    import logging
    import otel_torchdist
    from otel_torchdist import logs
    logs.configure(__import__("os").environ.get("LEVEL", "WARNING"))
    log = otel_torchdist.get_logger("train")
    log.info("info line")
    log.warning("warning line")
    logging.getLogger("otel_torchdist").warning("otel-torchdist: library line")
    otel_torchdist.rank_zero_warning("only rank zero says this")

    @otel_torchdist.rank_zero_only
    def report():
        print("reported")

    report()
"""


def test_lines_carry_the_rank_and_rank_zero_helpers_filter():
    zero = _run(SCRIPT, {"RANK": "0"})
    three = _run(SCRIPT, {"RANK": "3"})
    # the user's lines are named by the user's logger, the library's by the library
    assert "[rank=0] WARNING train: warning line" in zero.stderr
    assert "otel-torchdist rank=0] WARNING warning line" not in zero.stderr
    assert "[otel-torchdist rank=0] WARNING library line" in zero.stderr  # no doubled prefix
    assert "[rank=0] WARNING train: only rank zero says this" in zero.stderr
    assert "reported" in zero.stdout
    assert "[rank=3] WARNING train: warning line" in three.stderr
    assert "only rank zero" not in three.stderr and "reported" not in three.stdout
    assert "info line" not in zero.stderr


def test_user_logger_is_pythons_logger_of_that_name_with_its_own_level():
    script = """
        import logging
        logging.basicConfig(level=logging.INFO)  # a configured root must not print the line a second time
        import otel_torchdist
        log = otel_torchdist.get_logger("my.loop")
        assert log is logging.getLogger("my.loop")
        log.info("step done")
        logging.getLogger("my.loop").setLevel(logging.ERROR)
        log.warning("hidden by the user's level")
    """
    run = _run(script, {"RANK": "1"})
    assert run.returncode == 0, run.stderr
    assert run.stderr.count("step done") == 1
    assert "[rank=1] INFO my.loop: step done" in run.stderr
    assert "hidden" not in run.stderr


def test_level_comes_from_one_variable(tmp_path):
    script = """
        import torch.distributed as dist
        from torch.testing._internal.distributed.fake_pg import FakeStore
        import otel_torchdist
        otel_torchdist.instrument(run_dir=%r, system_metrics=False, metrics_exporter="none", traces_exporter="none")
        import logging
        logging.getLogger("otel_torchdist").info("visible at INFO")
        otel_torchdist.uninstrument()
    """ % str(tmp_path)
    quiet = _run(script, {"RANK": "0"})
    loud = _run(script, {"RANK": "0", "OTEL_TORCHDIST_LOG_LEVEL": "info"})
    assert "visible at INFO" not in quiet.stderr
    assert "[otel-torchdist rank=0] INFO visible at INFO" in loud.stderr
