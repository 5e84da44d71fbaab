"""benchmarks/gpu_check.py, the GPU verification: on a machine without CUDA (CI) it must say so and measure
nothing; on a GPU machine run it by hand (its checks need the GPU)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from .harness import REPO


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA GPU is present: run benchmarks/gpu_check.py itself")
def test_without_cuda_it_skips_and_says_why(tmp_path):
    out = tmp_path / "report.json"
    done = subprocess.run([sys.executable, os.path.join(REPO, "benchmarks", "gpu_check.py"), "--out", str(out)],
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "gpu_check: SKIPPED: no CUDA GPU here (torch.cuda.is_available() is False); nothing was measured"
    assert not out.exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA GPU is present: run benchmarks/gpu_collective_cost.py itself")
def test_the_collective_cost_benchmark_skips_without_cuda_and_says_why(tmp_path):
    out = tmp_path / "report.json"
    done = subprocess.run([sys.executable, os.path.join(REPO, "benchmarks", "gpu_collective_cost.py"), "--out", str(out)],
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "gpu_collective_cost: skipped: needs a CUDA GPU and NCCL (none on this machine)"
    assert not out.exists()
