"""The README's first two commands stay true: the demo runs, and CI runs exactly the test command."""

from __future__ import annotations

import os
import re
import subprocess
import sys

from .harness import REPO


def _readme_commands() -> list[str]:
    text = open(os.path.join(REPO, "README.md")).read()
    block = re.search(r"```bash\n(.*?)```", text, re.S).group(1)
    return [line for line in block.splitlines() if line.strip() and not line.startswith("#")]


def test_ci_runs_exactly_the_readme_test_command():
    install_and_demo, install_and_test = _readme_commands()[:2]
    ci = open(os.path.join(REPO, ".ci", "run")).read()
    assert install_and_test in ci.splitlines()
    assert install_and_demo == "pip install torch==2.13.0 -e . && otel-torchdist demo"


def test_demo_runs_and_says_where_telemetry_went(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "otel_torchdist.cli", "demo", "--steps", "4", "--run-dir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=str(tmp_path),
        env={**os.environ, "OTEL_EXPORTER_PROMETHEUS_PORT": "0"},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    err = proc.stderr
    assert "otel-torchdist demo: 2 ranks, gloo, 4 steps" in err
    assert "otel-torchdist summary: run" in err and "all_reduce" in err
    (run,) = os.listdir(tmp_path)
    files = set(os.listdir(tmp_path / run))
    for rank in (0, 1):
        assert {f"traces.rank{rank}.jsonl", f"metrics.rank{rank}.jsonl", f"summary.rank{rank}.json"} <= files
    assert f"Telemetry of every rank is in {tmp_path / run}" in err


def test_cli_errors_name_the_flag():
    proc = subprocess.run(
        [sys.executable, "-m", "otel_torchdist.cli", "demo", "--nproc", "zero"], capture_output=True, text=True
    )
    assert proc.returncode == 2
    assert "--nproc takes a whole number, got 'zero'" in proc.stderr
