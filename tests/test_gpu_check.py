"""The GPU benchmarks (benchmarks/gpu_check.py, gpu_collective_cost.py, gpu_workinfo_probe.py and the
one-call verification gpu_verify.sh): on a machine without CUDA (CI) they must say so and measure nothing;
on a GPU machine run them by hand (their checks need the GPU)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from .harness import REPO


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA GPU is present: run the benchmarks themselves")
@pytest.mark.parametrize(
    "script, says",
    [
        ("gpu_check.py", "gpu_check: SKIPPED: no CUDA GPU here (torch.cuda.is_available() is False); nothing was measured"),
        ("gpu_collective_cost.py", "gpu_collective_cost: skipped: needs a CUDA GPU and NCCL (none on this machine)"),
        ("gpu_workinfo_probe.py", "gpu_workinfo_probe: skipped: needs a CUDA GPU and NCCL (none on this machine)"),
    ],
)
def test_without_cuda_it_skips_and_says_why(tmp_path, script, says):
    out = tmp_path / "report.json"
    done = subprocess.run([sys.executable, os.path.join(REPO, "benchmarks", script), "--out", str(out)],
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == says
    assert not out.exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA GPU is present: run the verification itself")
def test_the_one_call_verification_runs_each_part_and_says_they_skipped(tmp_path, native_built):
    """benchmarks/gpu_verify.sh, what a lent GPU machine runs in one call: each part runs, and here each
    says it needs a GPU."""
    env = dict(os.environ, OUT=str(tmp_path))
    done = subprocess.run(["bash", os.path.join(REPO, "benchmarks", "gpu_verify.sh"), "quick"],
                          capture_output=True, text=True, timeout=300, env=env)  # fmt: skip
    assert done.returncode == 0, done.stderr
    log = (tmp_path / "gpu-verify.txt").read_text()
    for part in ("== build-native", "== gpu_workinfo_probe.py", "== tests", "== done"):
        assert part in log, log
    assert "gpu_workinfo_probe: skipped: needs a CUDA GPU" in log
    assert "skipped" in (tmp_path / "pytest.txt").read_text() and "== gpu_collective_cost.py" not in log
