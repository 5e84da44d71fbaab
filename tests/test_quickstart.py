"""docs/quickstart.md's training script, run as the page says (torchrun, 2 gloo ranks): it trains, rank 0
prints the summary the page shows, and the run folder holds every rank's telemetry."""

from __future__ import annotations

import glob
import os
import re
import subprocess
import sys

from .harness import REPO
from .harness import free_port


def test_the_quickstart_script_runs_as_the_page_says(tmp_path):
    page = open(os.path.join(REPO, "docs", "quickstart.md")).read()
    (script,) = re.findall(r"```python\n(.*?)```", page, re.S)
    (tmp_path / "train.py").write_text(script)
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    done = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port", str(free_port()), "train.py"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    out = done.stdout + done.stderr
    assert "otel-torchdist summary: run" in out and "all_reduce" in out and "steps: 30" in out, out[-4000:]
    (folder,) = glob.glob(str(tmp_path / "otel-torchdist-runs" / "*"))
    for rank in (0, 1):
        assert os.path.getsize(os.path.join(folder, f"traces.rank{rank}.jsonl")) > 0
        assert os.path.getsize(os.path.join(folder, f"metrics.rank{rank}.jsonl")) > 0
