"""The GPU benchmarks (benchmarks/gpu_check.py, the GPU verification, gpu_collective_cost.py and gpu_workinfo_probe.py): on a machine
without CUDA (CI) they must say so and measure nothing; on a GPU machine run them by hand (their checks need
the GPU)."""

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
