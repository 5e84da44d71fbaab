"""A training script that knows nothing of OpenTelemetry, for ``opentelemetry-instrument torchrun`` (tests/
test_zero_code.py): DDP for a few steps; each rank also reads its own /metrics (port from the environment)
before it ends, and writes what it saw to OUT."""

import os
import sys
import time
import urllib.request

import torch
import torch.distributed as dist

out = sys.argv[1]
dist.init_process_group("gloo")
rank = dist.get_rank()
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 8))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(4):
    model(torch.ones(4, 8)).sum().backward()
    opt.step()
    opt.zero_grad()
time.sleep(0.5)  # the collectives reach the metrics when the background drain next runs (every 200 ms)
port = int(os.environ["OTEL_EXPORTER_PROMETHEUS_PORT"]) + int(os.environ["LOCAL_RANK"])
with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
    scraped = r.read().decode()
with open(os.path.join(out, f"scrape.rank{rank}.txt"), "w") as f:
    f.write(scraped)
dist.destroy_process_group()
