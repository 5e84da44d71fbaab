"""Telemetry volume at scale: per-rank numbers measured on real training loops, extrapolated by formula.

    python benchmarks/bench_scale.py [--steps 12] [--sampling-steps 250] [--jobs 2] [--json PATH] [--no-prometheus]

Each measurement is one rank of a large job, simulated in its own process on the ``fake`` backend
(``init_process_group("fake", store=FakeStore(), rank=r, world_size=W)``: no transport, every collective
returns at once, so only its Python path runs) with ``otel_torchdist.instrument()`` and real torch
training code:

* **ddp**: ``DistributedDataParallel`` over 8 residual MLP blocks, 0.25 MB buckets (4 per step). The fake
  backend's all_reduce future carries no value, which DDP's default hook returns, so the loop registers
  the same hook returning the bucket itself;
* **fsdp2**: ``fully_shard`` per block and on the root, on a 1-D mesh;
* **3d**: a ``DeviceMesh`` pp x dp x tp = 4 x W/32 x 8: ``parallelize_module`` (colwise/rowwise) on tp,
  ``fully_shard`` on dp, and a GPipe schedule of 4 microbatches whose activations and gradients go to the
  neighbouring stages with ``batch_isend_irecv`` on pp.

Each loop reads batches from a DataLoader, steps an AdamW optimizer (which closes the training step) and
records loss, learning rate and tokens. Each job runs at a small world size and at 16 384 ranks. From
each run the script counts:

* the rank's real ``/metrics`` endpoint, scraped over HTTP: series per family;
* one OTLP metric export (``Pipeline.metric_data()``): data points, and bytes as protobuf, gzip'd
  protobuf and OTLP/JSON;
* every span the pipeline queued (the span encoder is wrapped to measure each one): spans per traced step
  by name, and bytes per span as OTLP protobuf and OTLP/JSON (the bytes that go into an export request);
* which steps are traced under each step-sampling setting, and what ``max_spans_per_step``,
  ``metrics_rank_label=False``, ``system_metrics=False`` and a coarser ``histogram_buckets`` change.

Then it multiplies out to 8, 1 024 and 16 384 ranks (formulas printed with the tables). Last, when a
``prometheus`` binary is on PATH, a real Prometheus scrapes a 4-rank job through the run folder's target
files with deploy/'s scrape settings, to show what it stores with the rank label off, what summing per
node in PromQL leaves, and what it stores with ``metrics_aggregation="node"``. Timings are not measured: nothing here depends on how fast the machine is. Takes about 1.5
minutes on 2 busy cores. ``docs/scale.md`` quotes the output.
"""
from __future__ import annotations

import argparse
import concurrent.futures
import gzip
import json
import os
import platform
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from collections import Counter
from dataclasses import dataclass, field

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

# Prometheus adds these series to every scrape target (https://prometheus.io/docs/concepts/jobs_instances/):
# up, scrape_duration_seconds, scrape_samples_scraped, scrape_samples_post_metric_relabeling,
# scrape_series_added. Each rank is a target on the direct path.
SYNTHETIC_PER_TARGET = 5
SCALES = (8, 1024, 16384)
STEP_SECONDS = 1.0  # the step time the rate tables assume
RANKS_PER_NODE = 8
SCRAPE_SECONDS = (15.0, 5.0)  # 15 s: a common choice (Prometheus' default is 1 min); 5 s: deploy/prometheus/prometheus.yml
OTLP_INTERVAL = 60.0  # metric_export_interval default (OTEL_METRIC_EXPORT_INTERVAL)
DAY = 86400


@dataclass(frozen=True, kw_only=True)
class Run:
    """One simulated rank: which loop, where in the job, and the instrument() options that differ."""

    key: str
    scenario: str
    world: int
    rank: int
    options: dict = field(default_factory=dict)
    sampling: bool = False
    """Runs --sampling-steps steps (to count which steps are traced) instead of --steps."""
    steps: int | None = None
    """Fixed number of steps (the knob runs only need a few)."""


# The 3-D job: pipeline x data x tensor parallel, innermost tensor parallel (torchtitan's mesh order).
PP, TP = 4, 8
BIG = 16384
# Ranks in middle pipeline stages (they receive and send both ways) of the 64- and the 16 384-rank 3-D job.
MID_64 = 1 * (64 // PP) + 5  # stage 1 of 4
MID_BIG = 2 * (BIG // PP) + 225  # stage 2 of 4

EVERY_STEP = {"trace_first_steps": 0, "trace_every_steps": 1}
# A coarser histogram_buckets: decades from 100 µs to 10 s, then 1 and 10 min (a hang being noticed).
COARSE = [1e-4, 1e-3, 1e-2, 0.1, 1.0, 10.0, 60.0, 600.0]
RUNS = (
    # each job at a small and a large world size: per-rank numbers must not depend on it
    Run(key="ddp", scenario="ddp", world=8, rank=0, options=EVERY_STEP),
    Run(key="ddp-16k", scenario="ddp", world=BIG, rank=0, options=EVERY_STEP),
    Run(key="fsdp2", scenario="fsdp2", world=8, rank=0, options=EVERY_STEP),
    Run(key="fsdp2-16k", scenario="fsdp2", world=BIG, rank=0, options=EVERY_STEP),
    Run(key="3d", scenario="3d", world=64, rank=MID_64, options=EVERY_STEP),
    Run(key="3d-16k", scenario="3d", world=BIG, rank=MID_BIG, options=EVERY_STEP),
    Run(key="3d-16k-rank0", scenario="3d", world=BIG, rank=0, options=EVERY_STEP),  # first stage, trace root
    # knobs, on the 3-D rank
    Run(key="cap-50", scenario="3d", world=64, rank=MID_64, options={**EVERY_STEP, "max_spans_per_step": 50}, steps=6),
    Run(key="untraced", scenario="3d", world=64, rank=MID_64, options={**EVERY_STEP, "trace_ranks": "0-7"}, steps=6),
    Run(key="no-rank-label", scenario="3d", world=64, rank=MID_64, options={**EVERY_STEP, "metrics_rank_label": False}, steps=6),
    Run(key="no-system", scenario="3d", world=64, rank=MID_64, options={**EVERY_STEP, "system_metrics": False}, steps=6),
    Run(key="coarse-buckets", scenario="3d", world=64, rank=MID_64, options={**EVERY_STEP, "histogram_buckets": COARSE}, steps=6),
    # step sampling: which steps are traced is decided from the step index alone, so the cheap DDP loop
    # counts it; the rates multiply by each job's spans per traced step
    Run(key="sampling-every", scenario="ddp", world=8, rank=0, options=EVERY_STEP, sampling=True),
    Run(key="sampling-default", scenario="ddp", world=8, rank=0, sampling=True),
    Run(key="sampling-1000", scenario="ddp", world=8, rank=0, options={"trace_every_steps": 1000}, sampling=True),
    Run(key="sampling-off", scenario="ddp", world=8, rank=0, options={"trace_first_steps": 0, "trace_every_steps": 0}, sampling=True),
    Run(
        key="sampling-ratio",
        scenario="ddp",
        world=8,
        rank=0,
        options={"traces_sampler": "parentbased_traceidratio", "traces_sampler_arg": 0.02},
        sampling=True,
    ),
)
# (setting, run that counted it, long-run share of steps traced)
SAMPLING = (
    ("every step (first 0, every 1)", "sampling-every", 1.0),
    ("default (first 10, every 100)", "sampling-default", 1 / 100),
    ("first 10, every 1000", "sampling-1000", 1 / 1000),
    ("parentbased_traceidratio 0.02", "sampling-ratio", 0.02),
    ("off (first 0, every 0)", "sampling-off", 0.0),
)


# ================================================================================== the simulated rank
def _worker(spec: dict) -> dict:
    """Run one rank's training loop instrumented; return what it exported (a JSON-able dict)."""
    import torch
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    import otel_torchdist
    from otel_torchdist import names as n
    from otel_torchdist import runtime
    from otel_torchdist.export import otlp
    from otel_torchdist.export.sinks import GZIP_LEVEL  # what goes on the wire

    torch.manual_seed(0)
    torch.set_num_threads(1)
    world, rank, steps = spec["world"], spec["rank"], spec["steps"]
    os.environ.update(spec.get("env", {}))  # LOCAL_RANK for the node-aggregation run
    folder = spec.get("run_dir") or tempfile.mkdtemp(prefix="otel-torchdist-scale-")
    run_id = spec.get("run_id", "scale-" + spec["key"])

    # Measure every span the pipeline queues, as the exporters will send it.
    spans: list[tuple[str, int, int, int]] = []  # name, trace id, protobuf bytes, OTLP/JSON bytes
    step_of_trace: dict[int, int] = {}  # trace id of a traced step -> step index
    pb_fragments: list[bytes] = []

    def measuring_encoder(span):
        text = json_encoder(span)
        pb = otlp.span_pb(span)
        spans.append((span.name, span.trace_id, len(pb), len(text.encode())))
        pb_fragments.append(pb)
        if span.name == n.SPAN_RANK_STEP:
            step_of_trace[span.trace_id] = dict(span.attributes)[n.STEP]
        return text

    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world)
    options = dict(
        prometheus_host=spec.get("host", "127.0.0.1"),
        run_dir=folder,
        run_id=run_id,
        traces_exporter="file",
        metrics_exporter=("file", "prometheus"),
        prometheus_port=0,
        summary="none",
        # The fake store cannot carry the straggler exchange; its two gauges are counted by formula.
        straggler_exchange_steps=0,
        # Slow-step warnings (one span per 100 steps at most) follow this machine's load, not the job.
        slow_step_factor=0.0,
        span_queue_size=1 << 20,  # count every span this run makes; the default queue is a rate limit
        metric_export_interval=3600.0,
    )
    options.update(spec["options"])
    otel_torchdist.instrument(**options)
    # After instrument(), which puts the native part's encoders in the table when it is built: set before,
    # this one was replaced and no span was measured.
    json_encoder = otlp.SPAN_ENCODERS["json"]
    otlp.SPAN_ENCODERS["json"] = measuring_encoder

    model, stage, groups_used = _build(spec["scenario"], world, rank)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    data = torch.utils.data.TensorDataset(torch.randn(64, 8, 64))
    loader = torch.utils.data.DataLoader(data, batch_size=None, shuffle=False)
    batches = iter(loader)
    for _ in range(steps):
        try:
            (x,) = next(batches)
        except StopIteration:
            batches = iter(loader)
            (x,) = next(batches)
        loss = stage(model, x)
        opt.step()
        opt.zero_grad()
        otel_torchdist.record_step(loss=float(loss), learning_rate=1e-3, tokens=x.numel() // 64)

    rt = runtime.current()
    for comp in rt.components:  # two system samples: CPU utilization needs a previous one
        if comp.name == "system":
            comp.sample()
            time.sleep(0.05)
            comp.sample()
    otel_torchdist.flush()
    pipeline = rt.pipeline
    if rt.prometheus is None:  # a rank that hands its metrics to its node's local rank 0: nothing to scrape
        print(json.dumps({"ready": None, "target_file": None}), flush=True)
        sys.stdin.readline()
        otel_torchdist.uninstrument()
        dist.destroy_process_group()
        return {"spec": spec}
    port = rt.prometheus.port
    host = options["prometheus_host"]
    text = _get(f"http://{host}:{port}/metrics", None)
    openmetrics = _get(f"http://{host}:{port}/metrics", "application/openmetrics-text; version=1.0.0")
    data_points = pipeline.metric_data()
    from otel_torchdist.export.sdk_metrics import metrics_pb

    pb = metrics_pb(pipeline.outbox.resource, data_points, pipeline.outbox.start_ns, time.time_ns())
    as_json = otlp.metrics_to_json(pipeline.outbox.resource, data_points, pipeline.outbox.start_ns, time.time_ns())
    steps_done = pipeline.framework.get(n.STEPS_METRIC, ())
    target_file = os.path.join(folder, run_id, f"prometheus-targets.rank{rank}.json")
    with open(target_file, encoding="utf-8") as f:
        target = json.load(f)
    resource = dict(pipeline.outbox.resource)
    empty_request_pb = len(otlp.trace_request_pb(resource, []))
    empty_request_json = len(otlp.trace_request_json(resource, []).encode())
    traces_path = os.path.join(folder, run_id, f"traces.rank{rank}.jsonl")
    traces_file_bytes = os.path.getsize(traces_path) if os.path.exists(traces_path) else 0
    from otel_torchdist import health

    drops, errors = health.drops(), health.errors()
    if spec.get("hold"):
        # Keep /metrics up for a real Prometheus until the parent says we are done (a line on stdin).
        print(json.dumps({"ready": port, "target_file": target_file}), flush=True)
        sys.stdin.readline()
    otel_torchdist.uninstrument()
    dist.destroy_process_group()

    # gzip of one export request holding the last traced step's spans (OTEL_EXPORTER_OTLP_COMPRESSION=gzip)
    gz = None
    if step_of_trace:
        last = max(step_of_trace, key=step_of_trace.get)
        frags = [f for (_, t, _, _), f in zip(spans, pb_fragments) if t == last]
        request = otlp.trace_request_pb(resource, frags)
        gz = {"spans": len(frags), "raw": len(request), "gzip": len(gzip.compress(request, compresslevel=GZIP_LEVEL))}
    return {
        "spec": spec,
        "groups": groups_used,
        "steps": steps_done,
        "scrape": _parse_exposition(text),
        "scrape_bytes": len(text.encode()),
        "openmetrics_bytes": len(openmetrics.encode()),
        "exemplars": openmetrics.count(" # {"),
        "otlp_points": {md.metric.name: len(md.points) for md in data_points if md.points},
        "otlp_bytes": {"pb": len(pb), "gzip": len(gzip.compress(pb, compresslevel=GZIP_LEVEL)), "json": len(as_json.encode())},
        "spans": spans,
        "step_of_trace": {str(t): i for t, i in step_of_trace.items()},
        "gzip_step_request": gz,
        "request_overhead": {"pb": empty_request_pb, "json": empty_request_json},
        "traces_file_bytes": traces_file_bytes,
        "target_file": target,
        "resource_rank": resource.get(n.RANK),
        "resource_instance": resource.get(n.SERVICE_INSTANCE_ID),
        "drops": drops,
        "errors": errors,
        "calls": sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith("torchdist_collective_calls_total{")),
    }


def _get(url: str, accept: str | None) -> str:
    req = urllib.request.Request(url, headers={"Accept": accept} if accept else {})
    with urllib.request.urlopen(req, timeout=30) as resp:
        return resp.read().decode()


_LINE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{.*\})?\s")


def _parse_exposition(text: str) -> dict:
    """Series per family from Prometheus text exposition: family -> [sample lines, label sets]."""
    families: dict[str, str] = {}  # sample name -> family
    declared: list[str] = []
    out: dict[str, dict] = {}
    label_names: set[str] = set()
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, fam, kind = line.split(" ", 3)
            declared.append(fam)
            suffixes = ("_bucket", "_sum", "_count", "_created") if kind == "histogram" else ("_total", "_created", "")
            for s in suffixes:
                families[fam + s] = fam
            out.setdefault(fam, {"type": kind, "samples": 0, "series": set()})
            continue
        if not line or line.startswith("#"):
            continue
        m = _LINE.match(line)
        name, labels = m.group(1), m.group(2) or ""
        fam = families.get(name, name)
        entry = out.setdefault(fam, {"type": "untyped", "samples": 0, "series": set()})
        entry["samples"] += 1
        entry["series"].add(name + labels)
        label_names.update(re.findall(r'([a-zA-Z_][a-zA-Z0-9_]*)="', labels))
    return {
        "families": {f: {"type": e["type"], "samples": e["samples"], "series": len(e["series"])} for f, e in out.items()},
        "label_names": sorted(label_names),
        "ops_groups": sorted(_op_group_pairs(text)),
    }


def _op_group_pairs(text: str) -> set[tuple[str, str]]:
    pairs = set()
    for line in text.splitlines():
        if line.startswith("torchdist_collective_calls_total{"):
            op = re.search(r'op="([^"]*)"', line).group(1)
            group = re.search(r'group="([^"]*)"', line).group(1)
            pairs.add((op, group))
    return pairs


# ------------------------------------------------------------------------------------- the three jobs
def _build(scenario: str, world: int, rank: int):
    """The model on this rank and a function running one step's forward and backward (returns the loss)."""
    import torch
    import torch.distributed as dist
    import torch.nn as nn

    class Block(nn.Module):
        def __init__(self, dim: int = 64) -> None:
            super().__init__()
            self.w1 = nn.Linear(dim, 4 * dim)
            self.w2 = nn.Linear(4 * dim, dim)

        def forward(self, x):
            return x + self.w2(torch.relu(self.w1(x)))

    def plain_step(model, x):
        loss = model(x).square().mean()
        loss.backward()
        return loss.detach()

    if scenario == "ddp":
        from torch.nn.parallel import DistributedDataParallel as DDP

        # 8 blocks of 132 KiB of fp32 parameters; 0.25 MB buckets give DDP several buckets per step.
        model = DDP(nn.Sequential(*[Block() for _ in range(8)]), bucket_cap_mb=0.25)

        # DDP's default hook returns the value of the all_reduce's future, which the fake backend leaves
        # empty; this hook is the default one (average, all_reduce the bucket) returning the bucket itself.
        def allreduce_hook(state, bucket):
            buffer = bucket.buffer().div_(world)
            return dist.all_reduce(buffer, async_op=True).get_future().then(lambda _: buffer)

        model.register_comm_hook(None, allreduce_hook)
        return model, plain_step, ["default_pg"]

    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    if scenario == "fsdp2":
        mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("dp",))
        model = nn.Sequential(*[Block() for _ in range(8)])
        for block in model:
            fully_shard(block, mesh=mesh)
        fully_shard(model, mesh=mesh)
        return model, plain_step, ["dp"]

    assert scenario == "3d", scenario
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    mesh = init_device_mesh("cpu", (PP, world // (PP * TP), TP), mesh_dim_names=("pp", "dp", "tp"))
    pp = mesh["pp"].get_group()
    stage_index, stages = pp.rank(), pp.size()
    prev_rank = dist.get_global_rank(pp, stage_index - 1) if stage_index > 0 else None
    next_rank = dist.get_global_rank(pp, stage_index + 1) if stage_index < stages - 1 else None
    model = nn.Sequential(*[Block() for _ in range(4)])  # this stage's 4 blocks
    for block in model:
        parallelize_module(block, mesh["tp"], {"w1": ColwiseParallel(), "w2": RowwiseParallel()})
        fully_shard(block, mesh=mesh["dp"])
    fully_shard(model, mesh=mesh["dp"])
    microbatches = 4

    def p2p(op, peer, tensor):
        for work in dist.batch_isend_irecv([dist.P2POp(op, tensor, peer, group=pp)]):
            work.wait()

    def pipeline_step(model, x):
        # GPipe: every microbatch forward, then every microbatch backward, activations and gradients
        # exchanged with the neighbouring stages.
        outputs = []
        for mb in x.chunk(microbatches):
            inp = mb.clone()
            if prev_rank is not None:
                p2p(dist.irecv, prev_rank, inp)
            inp.requires_grad_(prev_rank is not None)
            out = model(inp)
            if next_rank is not None:
                p2p(dist.isend, next_rank, out.detach())
            outputs.append((inp, out))
        total = 0.0
        for inp, out in outputs:
            if next_rank is not None:
                grad = torch.empty_like(out)
                p2p(dist.irecv, next_rank, grad)
                out.backward(grad)
            else:
                loss = out.square().mean() / microbatches
                loss.backward()
                total += float(loss)
            if prev_rank is not None:
                p2p(dist.isend, prev_rank, inp.grad)
        return torch.tensor(total)

    return model, pipeline_step, ["pp", "dp", "tp"]


# ======================================================================================= measurements
def _worker_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "TORCHELASTIC_", "SLURM_"))}
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    env["PYTHONWARNINGS"] = "ignore"
    return env


def _worker_command(spec: dict) -> list[str]:
    return [sys.executable, os.path.abspath(__file__), "--worker", json.dumps(spec)]


def _run_all(steps: int, sampling_steps: int, jobs: int) -> dict[str, dict]:
    specs = [
        {
            "key": r.key,
            "scenario": r.scenario,
            "world": r.world,
            "rank": r.rank,
            "options": r.options,
            "steps": r.steps or (sampling_steps if r.sampling else steps),
        }
        for r in RUNS
    ]
    env = _worker_env()

    def one(spec: dict) -> dict:
        proc = subprocess.run(_worker_command(spec), capture_output=True, text=True, env=env, timeout=600)
        if proc.returncode != 0:
            raise RuntimeError(f"run {spec['key']} failed:\n{proc.stderr[-4000:]}")
        return json.loads(proc.stdout.strip().splitlines()[-1])

    with concurrent.futures.ThreadPoolExecutor(max_workers=jobs) as pool:
        results = list(pool.map(one, specs))
    return {r["spec"]["key"]: r for r in results}


# ------------------------------------------------------------------------- a real Prometheus scraping
LIVE_RANKS = 4  # ranks 0 and 1 serve /metrics on 127.0.0.1, ranks 2 and 3 on 127.0.0.2: two "nodes"
LIVE_JOB = """\
global:
  scrape_interval: 1s
  evaluation_interval: 1s
scrape_configs:
  - job_name: torchdist-ranks      # as in deploy/prometheus/prometheus.yml
    honor_labels: true
    file_sd_configs:
      - files: ["{targets}/*targets*.json"]
        refresh_interval: 1s
"""
NODE = 'label_replace({sel}, "node", "$1", "instance", "(.+):[0-9]+")'
"""The node a series came from: the host part of its target's address (the direct path has no node label)."""


def live_prometheus(steps: int) -> dict | None:
    """A 4-rank DDP job with ``metrics_rank_label=False`` scraped by a real Prometheus through the run
    folder's file-SD target files, with deploy/'s scrape settings: what Prometheus then holds, and what
    summing over the ranks of a node leaves. None without a ``prometheus`` binary."""
    binary = shutil.which("prometheus")
    if binary is None:
        return None
    env = _worker_env()
    work = tempfile.mkdtemp(prefix="otel-torchdist-scale-prom-")
    targets = os.path.join(work, "targets")
    os.makedirs(targets)
    per_node = LIVE_RANKS // 2
    runs = {
        "live-rank-label-off": lambda rank: {"metrics_rank_label": False},
        "live-node": lambda rank: {
            "metrics_aggregation": "node",
            "node_name": "node-a" if rank < per_node else "node-b",
            "node_metrics_interval": 0.5,
        },
    }
    shared = os.path.join(work, "runs")  # the node run's ranks hand over through a shared run folder
    workers = []
    for run_id, options in runs.items():
        for rank in range(LIVE_RANKS):
            spec = {
                "key": f"{run_id}-{rank}",
                "run_id": run_id,
                "scenario": "ddp",
                "world": LIVE_RANKS,
                "rank": rank,
                "options": options(rank),
                "steps": steps,
                "hold": True,
                "host": "127.0.0.1" if rank < per_node else "127.0.0.2",
                "run_dir": shared,
                "env": {"LOCAL_RANK": str(rank % per_node), "LOCAL_WORLD_SIZE": str(per_node)},
            }
            log = open(os.path.join(work, spec["key"] + ".log"), "w")
            workers.append(
                subprocess.Popen(_worker_command(spec), stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, text=True, env=env)
            )
    prom = None
    try:
        for i, w in enumerate(workers):
            line = w.stdout.readline()
            if not line:
                raise RuntimeError(f"a live rank exited early; see {work}")
            ready = json.loads(line)
            if ready["target_file"]:
                shutil.copy(ready["target_file"], os.path.join(targets, f"{i}.prometheus-targets.json"))
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        config = os.path.join(work, "prometheus.yml")
        with open(config, "w", encoding="utf-8") as f:
            f.write(LIVE_JOB.format(targets=targets))
        prom = subprocess.Popen(
            [binary, f"--config.file={config}", f"--storage.tsdb.path={work}/data",
             f"--web.listen-address=127.0.0.1:{port}", "--log.level=error"],
            stdout=subprocess.DEVNULL, stderr=open(os.path.join(work, "prometheus.log"), "w"),
        )
        api = f"http://127.0.0.1:{port}/api/v1/"

        def query(expr: str) -> list:
            url = api + "query?" + urllib.parse.urlencode({"query": expr})
            with urllib.request.urlopen(url, timeout=10) as resp:
                return json.load(resp)["data"]["result"]

        def scalar(expr: str) -> float:
            result = query(expr)
            return float(result[0]["value"][1]) if result else 0.0

        expected_targets = LIVE_RANKS + 2  # the node run: one target per node
        calls = 'sum by (run) (torchdist_collective_calls_total{op="all_reduce"})'
        deadline = time.monotonic() + 60
        while True:  # every target scraped at least twice, and the node run's hand-overs all in
            try:
                totals = {r["metric"]["run"]: float(r["value"][1]) for r in query(calls)}
                if (
                    scalar("count(count_over_time(up[1m]) >= 2)") >= expected_targets
                    and len(set(totals.values())) == 1
                    and len(totals) == len(runs)
                ):
                    break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"Prometheus did not scrape the live ranks in 60 s; see {work}")
            time.sleep(0.5)
        out = {"version": subprocess.run([binary, "--version"], capture_output=True, text=True).stdout.splitlines()[0]}
        for run_id in runs:
            sel = f'{{run="{run_id}", __name__=~"torchdist_.*"}}'
            named = f'label_replace({sel}, "name", "$1", "__name__", "(.+)")'
            with urllib.request.urlopen(api + "labels?" + urllib.parse.urlencode({"match[]": sel}), timeout=10) as resp:
                label_names = json.load(resp)["data"]
            out[run_id] = {
                "all": scalar(f'count({{run="{run_id}"}})'),
                "torchdist": scalar(f"count({sel})"),
                "ranks": sorted(r["metric"].get("rank", "-") for r in query(f'torchdist_steps_total{{run="{run_id}"}}')),
                "labels": label_names,
                "per_node": scalar(f"count(count without (rank, instance) ({NODE.format(sel=named)}))"),
                "per_run": scalar(f"count(count without (rank, instance) ({named}))"),
                "calls_by_node": [
                    (r["metric"]["node"], r["metric"]["op"], float(r["value"][1]))
                    for r in query(
                        f'sum by (node, op) ({NODE.format(sel=f"torchdist_collective_calls_total{{run={chr(34)}{run_id}{chr(34)}}}")})'
                    )
                ],
                "calls_by_host": [
                    (r["metric"].get("host", "-"), r["metric"]["op"], float(r["value"][1]))
                    for r in query(f'sum by (host, op) (torchdist_collective_calls_total{{run="{run_id}"}})')
                ],
                "targets": scalar(f'count(up{{run="{run_id}"}})'),
            }
        return out
    finally:
        if prom is not None:
            prom.terminate()
            prom.wait(timeout=30)
        for w in workers:
            try:
                w.stdin.write("\n")
                w.stdin.close()
            except OSError:
                pass
        for w in workers:
            try:
                w.wait(timeout=60)
            except subprocess.TimeoutExpired:
                w.kill()


# ---------------------------------------------------------------------------------- per-rank summaries
def _category(family: str) -> str:
    from otel_torchdist import names as n
    from otel_torchdist.export import prometheus_names

    for label, metrics in (
        ("collective", n.COLLECTIVE_METRICS + (n.COLLECTIVE_HANGS,)),
        ("group (watchdog)", (n.GROUP_SEQ_STARTED, n.GROUP_SEQ_COMPLETED, n.COLLECTIVE_INFLIGHT_AGE)),
        ("step + user", n.STEP_METRICS),
        ("training path", n.TRAINING_PATH_METRICS),
        ("system", n.SYSTEM_METRICS),
        ("telemetry health", n.TELEMETRY_METRICS),
    ):
        if family in {prometheus_names.prometheus_name(m) for m in metrics}:
            return label
    return "other"


def series(result: dict) -> int:
    return sum(f["series"] for f in result["scrape"]["families"].values())


def points(result: dict) -> int:
    return sum(result["otlp_points"].values())


def step_spans(result: dict, first: int = 2) -> dict:
    """Spans per traced step on this rank (steps from ``first`` on: step 1 also holds the set-up), by name,
    and their mean sizes."""
    steps = {int(t): i for t, i in result["step_of_trace"].items()}
    traces = {t for t, i in steps.items() if i >= first}
    in_steps = [s for s in result["spans"] if s[1] in traces]
    count = len(traces) or 1
    by_name = Counter(s[0] for s in in_steps)
    n = len(in_steps) or 1
    return {
        "traced_steps": len(steps),
        "per_step": len(in_steps) / count,
        "by_name": {k: v / count for k, v in sorted(by_name.items(), key=lambda kv: (-kv[1], kv[0]))},
        "pb_per_span": sum(s[2] for s in in_steps) / n,
        "json_per_span": sum(s[3] for s in in_steps) / n,
        "step1": sum(1 for s in result["spans"] if steps.get(s[1]) == 1),
        "outside_steps": Counter(s[0] for s in result["spans"] if s[1] not in steps),
    }


def traced_by_rule(steps: int, first: int, every: int) -> int:
    """Steps 1..steps the default sampler keeps: the first ``first``, then every ``every``-th."""
    return sum(1 for i in range(1, steps + 1) if i <= first or (every > 0 and i % every == 0))


# ============================================================================================ report
def _fmt(x: float) -> str:
    if x >= 1e9:
        return f"{x / 1e9:,.2f} G"
    if x >= 1e6:
        return f"{x / 1e6:,.2f} M"
    if x >= 1e4:
        return f"{x / 1e3:,.1f} k"
    if x == int(x):
        return f"{int(x):,}"
    return f"{x:,.1f}"


def _bytes(x: float) -> str:
    for unit, size in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if x >= size:
            return f"{x / size:,.1f} {unit}"
    return f"{x:,.0f} B"


def _machine() -> str:
    import torch

    cpu = "unknown CPU"
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return f"{cpu}, {os.cpu_count()} CPUs, Python {platform.python_version()}, torch {torch.__version__}"


JOBS = (("ddp", "ddp", "ddp-16k"), ("fsdp2", "fsdp2", "fsdp2-16k"), ("3d", "3d", "3d-16k"))
"""(job, run measured at a small world, run at 16 384 ranks)."""


def gpu_series_per_gpu() -> dict[str, int]:
    """Series one GPU adds at most, from the samplers' code (not measured: this machine has no GPU)."""
    from otel_torchdist.system.gpu import ECC_TYPES, THROTTLE_REASONS

    return {
        "NVML gauges (utilization, memory used/total, power, temperature, SM clock)": 6,
        "PCIe throughput (transmit/receive)": 2,
        "NVLink bytes (transmit/receive)": 2,
        "throttle reasons (those the GPU supports)": len(THROTTLE_REASONS),
        "ECC errors (corrected/uncorrected)": len(ECC_TYPES),
        "CUDA allocator (allocated, reserved, peak, OOM retries) per device": 4,
    }


def job_spans_per_step(job: str, world: int, res: dict[str, dict]) -> tuple[float, float]:
    """Spans of one traced step summed over all ranks of the job, and their mean protobuf bytes."""
    if job == "3d":
        mid = step_spans(res["3d-16k"])
        edge = step_spans(res["3d-16k-rank0"])
        edges = world * 2 / PP  # first and last stages: one neighbour each
        spans = edges * (edge["per_step"] - 1) + (world - edges) * mid["per_step"] + 1  # rank 0 adds the root
        size = (edges * (edge["per_step"] - 1) * edge["pb_per_span"] + (world - edges) * mid["per_step"] * mid["pb_per_span"]) / (spans - 1)
        return spans, size
    r = step_spans(res[job if world <= 16 else job + "-16k"])
    return world * (r["per_step"] - 1) + 1, r["pb_per_span"]  # measured on rank 0: its root span once


def report(res: dict[str, dict], steps: int, sampling_steps: int) -> None:
    from otel_torchdist import names as n

    main = res["3d"]
    print(f"# machine: {_machine()}")
    print(f"# fake backend, one process per simulated rank, {steps} training steps each "
          f"({sampling_steps} for the sampling counts)")
    print(f"# 3d = pipeline {PP} x data x tensor {TP} (DeviceMesh pp/dp/tp), 4 microbatches, 4 blocks per stage")
    print()

    # ---- 1. series per rank
    print("## 1. Series per rank: the rank's own /metrics, scraped over HTTP (CPU only: no GPU series)")
    cats = ["collective", "group (watchdog)", "step + user", "training path", "system", "telemetry health"]
    print(f"{'run':<13} {'world':>6} {'rank':>5} {'op x group':>10} " + " ".join(f"{c[:11]:>11}" for c in cats)
          + f" {'total':>6} {'bytes':>7}")
    for key in ("ddp", "ddp-16k", "fsdp2", "fsdp2-16k", "3d", "3d-16k", "3d-16k-rank0"):
        r = res[key]
        by_cat = Counter()
        for fam, f in r["scrape"]["families"].items():
            by_cat[_category(fam)] += f["series"]
        spec = r["spec"]
        print(
            f"{key:<13} {spec['world']:>6} {spec['rank']:>5} {len(r['scrape']['ops_groups']):>10} "
            + " ".join(f"{by_cat[c]:>11}" for c in cats)
            + f" {series(r):>6} {r['scrape_bytes']:>7}"
        )
    print("(a series is a line of the text exposition; a histogram is 23 buckets + le=\"+Inf\" + _sum + _count = 26")
    print(" series per label set; each (op, group) pair a rank uses costs 26 + calls, bytes, bus_bytes, errors = 30)")
    for job, small, _ in JOBS:
        pairs = res[small]["scrape"]["ops_groups"]
        print(f"  {job}: {len(pairs)} (op, group) pairs: " + ", ".join(f"{op}@{g}" for op, g in pairs))
    per_gpu = gpu_series_per_gpu()
    print(f"  a GPU rank adds up to {sum(per_gpu.values())} series per GPU it uses (from otel_torchdist/system, not measured):")
    for what, count in per_gpu.items():
        print(f"    {count:>2}  {what}")
    print("  plus torchdist_amp_grad_scale (1) with a GradScaler; the straggler exchange (off here: the fake store")
    print("  cannot carry it) adds torchdist_straggler_score_ratio and torchdist_straggler_slowest_rank (2) up to 1024 ranks")
    print()

    print(f"## 2. /metrics families of the 3d rank (world {main['spec']['world']}, rank {main['spec']['rank']})")
    print(f"{'family':<52} {'type':<10} {'series':>6}  category")
    for fam, f in sorted(main["scrape"]["families"].items(), key=lambda kv: (_category(kv[0]), kv[0])):
        print(f"{fam:<52} {f['type']:<10} {f['series']:>6}  {_category(fam)}")
    print(f"labels: {', '.join(main['scrape']['label_names'])}; exemplars in an OpenMetrics scrape: {main['exemplars']} "
          f"({main['openmetrics_bytes']} bytes)")
    print()

    # ---- 3. OTLP metric export
    print(f"## 3. One OTLP metric export per rank (cumulative, every metric_export_interval: default {OTLP_INTERVAL:g} s)")
    print(f"{'run':<13} {'data points':>11} {'protobuf':>9} {'gzip':>8} {'OTLP/JSON':>10}")
    for key in ("ddp", "fsdp2", "3d", "3d-16k"):
        r = res[key]
        b = r["otlp_bytes"]
        print(f"{key:<13} {points(r):>11} {_bytes(b['pb']):>9} {_bytes(b['gzip']):>8} {_bytes(b['json']):>10}")
    print("(one histogram data point carries all its buckets: 1 OTLP point, 26 Prometheus series)")
    print()

    # ---- 4. spans per traced step
    print("## 4. Spans per traced step per rank (steps 2+; step 1 also holds the set-up), bytes per span as exported")
    print(f"{'run':<13} {'spans/step':>10} {'step 1':>6} {'pb B/span':>9} {'JSON B/span':>11} {'gzip pb B/span':>14}")
    for key in ("ddp", "ddp-16k", "fsdp2", "fsdp2-16k", "3d", "3d-16k", "3d-16k-rank0"):
        r = res[key]
        s = step_spans(r)
        if not s["per_step"]:  # every step of these runs is traced: none measured is the benchmark's fault
            raise SystemExit(f"bench_scale: no span measured in run {key}; the span encoder hook missed")
        gz = r["gzip_step_request"]
        gzs = f"{gz['gzip'] / gz['spans']:.0f}" if gz else "-"
        print(f"{key:<13} {s['per_step']:>10.1f} {s['step1']:>6} {s['pb_per_span']:>9.0f} {s['json_per_span']:>11.0f} {gzs:>14}")
    for key in ("ddp", "fsdp2", "3d-16k"):
        s = step_spans(res[key])
        print(f"  {key} per traced step: " + ", ".join(f"{k} {v:g}" for k, v in s["by_name"].items()))
    outside = step_spans(res["3d-16k"])["outside_steps"]
    print("  3d-16k spans in no step trace (once per run): " + (", ".join(f"{k} {v}" for k, v in outside.items()) or "none"))
    ov = main["request_overhead"]
    print(f"  each export request adds the resource and scope: {ov['pb']} B protobuf, {ov['json']} B JSON "
          "(one request per 512 spans at most)")
    print()

    # ---- 5. step sampling
    print(f"## 5. Step sampling: steps traced in {sampling_steps} steps (ddp rank 0), and what it means per rank at "
          f"{STEP_SECONDS:g} s steps")
    s3 = step_spans(res["3d-16k"])
    print(f"{'setting':<32} {'traced':>6} {'by rule':>7} {'spans':>6} {'long-run share':>14} "
          f"{'3d spans/s/rank':>15} {'3d pb B/s/rank':>14}")
    for label, key, share in SAMPLING:
        r = res[key]
        opts = r["spec"]["options"]
        if "traces_sampler" in opts:
            rule = "-"
        else:
            rule = str(traced_by_rule(sampling_steps, opts.get("trace_first_steps", 10), opts.get("trace_every_steps", 100)))
        rate = s3["per_step"] * share / STEP_SECONDS
        print(f"{label:<32} {step_spans(r)['traced_steps']:>6} {rule:>7} {len(r['spans']):>6} {share:>14.4g} "
              f"{rate:>15.2f} {rate * s3['pb_per_span']:>14.0f}")
    cap = res["cap-50"]
    print(f"max_spans_per_step=50 (3d rank): {step_spans(cap)['per_step']:.1f} spans per traced step, by name: "
          + ", ".join(f"{k} {v:g}" for k, v in step_spans(cap)["by_name"].items()))
    print(f"  (collective and framework spans counted alike, plus the parents of those kept); "
          f"{cap['drops'].get('span_step_limit', 0)} spans in {cap['steps']:g} steps counted in "
          f"torchdist_telemetry_dropped_total{{kind=\"span_step_limit\"}} instead")
    untraced = res["untraced"]
    print(f"trace_ranks=0-7 on the 3d rank {MID_64} (not listed): {len(untraced['spans'])} spans in {untraced['steps']:g} steps; "
          f"collective calls still counted: {untraced['calls']:g} (the traced 3d rank: {res['cap-50']['calls']:g} in as many steps)")
    print()

    # ---- 6. knobs on series
    print("## 6. Knobs that change series (3d rank, scraped)")
    base = series(main)
    off = res["no-rank-label"]
    nosys = res["no-system"]
    print(f"metrics_rank_label=True : {base} series; labels {', '.join(main['scrape']['label_names'])}")
    print(f"metrics_rank_label=False: {series(off)} series; labels {', '.join(off['scrape']['label_names'])}")
    print(f"  the rank is still its own target: {json.dumps(off['target_file'])}")
    print(f"  and its own resource: torchdist.rank={off['resource_rank']}, service.instance.id={off['resource_instance']}")
    print(f"system_metrics=False    : {series(nosys)} series ({series(nosys) - base:+d}: "
          + ", ".join(f for f in main["scrape"]["families"] if f not in nosys["scrape"]["families"]) + ")")

    coarse = res["coarse-buckets"]
    print(f"histogram_buckets={','.join(f'{b:g}' for b in COARSE)}: {series(coarse)} series ({series(coarse) - base:+d}; "
          f"{len(COARSE) + 3} per histogram label set instead of {len(n.DURATION_BUCKETS) + 3})")
    print()
    _extrapolate(res)


def _extrapolate(res: dict[str, dict]) -> None:
    gpu = sum(gpu_series_per_gpu().values())
    print("## 7. Extrapolation")
    print("series(W)     = W x (series per rank + 5 series Prometheus adds per target)      [direct path]")
    print("series/rank   = fixed (steps, user values, system, health) + 30 x (op, group) pairs + 3 x groups used")
    print("                + 2 straggler gauges up to 1024 ranks; a rank is in O(1) groups (one per mesh dimension),")
    print("                so series/rank does not grow with W (compare the small and 16k runs in section 1)")
    print("samples/s     = series(W) / scrape interval (scraping the ranks, or a Collector that re-exposes them)")
    print(f"RW @{OTLP_INTERVAL:g}s       = W x series/rank / {OTLP_INTERVAL:g} s: samples/s if each push is remote-written as it arrives")
    print(f"OTLP points/s = W x points per export / {OTLP_INTERVAL:g} s; OTLP bytes/s likewise")
    print("Prom. disk    = samples/s x 86 400 x 2 B (upper end of the 1-2 B/sample of prometheus.io/docs/prometheus/latest/storage/)")
    print()
    print(f"{'job':<6} {'ranks':>6} {'series/rank':>11} {'+1 GPU':>7} {'active series':>13} {'samples/s @15s':>14} "
          f"{'@5s':>9} {'RW @60s':>9} {'OTLP pts/s':>10} {'OTLP pb':>10} {'disk/day @15s':>13}")
    for job, small, big in JOBS:
        for w in SCALES:
            if job == "3d" and w < PP * TP:
                continue
            r = res[small if w <= 16 else big]
            per_rank = series(r) + (2 if w <= 1024 else 0)
            total = w * (per_rank + SYNTHETIC_PER_TARGET)
            s15 = total / SCRAPE_SECONDS[0]
            pts = w * (points(r) + (2 if w <= 1024 else 0)) / OTLP_INTERVAL
            pb = w * r["otlp_bytes"]["pb"] / OTLP_INTERVAL
            print(f"{job:<6} {w:>6} {per_rank:>11} {per_rank + gpu:>7} {_fmt(total):>13} {_fmt(s15):>14} "
                  f"{_fmt(total / SCRAPE_SECONDS[1]):>9} {_fmt(w * per_rank / OTLP_INTERVAL):>9} {_fmt(pts):>10} "
                  f"{_bytes(pb) + '/s':>10} {_bytes(s15 * DAY * 2):>13}")
    print(f"(with one GPU per rank add {gpu} series per rank to every total: W x {gpu} = "
          + ", ".join(f"{_fmt(w * gpu)} at {w}" for w in SCALES) + ")")
    print()
    print(f"Summed per node ({RANKS_PER_NODE} ranks per node): series(W) = W / {RANKS_PER_NODE} x series/rank")
    print("(metrics_aggregation=\"node\" exports only these, plus 5 per node target; a recording rule that drops rank and")
    print(" instance adds them beside the per-rank ones; section 8 checks both counts on a real Prometheus)")
    for job, small, big in JOBS:
        cells = []
        for w in SCALES:
            if w < RANKS_PER_NODE or (job == "3d" and w < PP * TP):
                continue
            r = res[small if w <= 16 else big]
            cells.append(f"{_fmt(w // RANKS_PER_NODE * series(r))} at {w}")
        print(f"  {job:<6} " + ", ".join(cells))
    print()
    print(f"Traces into the Collector/Jaeger at {STEP_SECONDS:g} s steps (all ranks; OTLP protobuf, uncompressed)")
    print("spans/s = (sum over ranks of spans per traced step) x long-run traced share / step time")
    head = " ".join(f"{'spans/s@' + _short(w):>11} {'MB/s':>7} {'GB/day':>7}" for w in SCALES)
    print(f"{'job':<6} {'setting':<32} {head}")
    for job, _, _ in JOBS:
        for label, _, share in SAMPLING[:-1]:
            cells = []
            for w in SCALES:
                if job == "3d" and w < PP * TP:
                    cells.append(f"{'-':>11} {'-':>7} {'-':>7}")
                    continue
                spans, size = job_spans_per_step(job, w, res)
                rate = spans * share / STEP_SECONDS
                cells.append(f"{_fmt(rate):>11} {rate * size / 1e6:>7.2f} {rate * size * DAY / 1e9:>7.1f}")
            print(f"{job:<6} {label:<32} {' '.join(cells)}")
    print("(off: nothing after the first trace_first_steps steps; 3d needs at least pp x tp = 32 ranks)")
    print()
    print("Spans in one step's trace (every rank's spans of that step share one trace id):")
    for job, _, _ in JOBS:
        print(f"  {job:<6} " + ", ".join(
            f"{_fmt(job_spans_per_step(job, w, res)[0])} at {w}" for w in SCALES if not (job == "3d" and w < PP * TP)))
    print(f"...with trace_ranks naming one node (0-{RANKS_PER_NODE - 1}) / one rank per node (0-{{W-1}}:{RANKS_PER_NODE}); "
          "the other ranks export no spans (section 5):")
    for job, _, _ in JOBS:
        cells = []
        for w in SCALES:
            if job == "3d" and w < PP * TP:
                continue
            per_rank = (job_spans_per_step(job, w, res)[0] - 1) / w
            cells.append(f"{_fmt(min(w, RANKS_PER_NODE) * per_rank + 1)} / {_fmt(max(w // RANKS_PER_NODE, 1) * per_rank + 1)} at {w}")
        print(f"  {job:<6} " + ", ".join(cells))


def report_live(live: dict | None, res: dict[str, dict]) -> None:
    print()
    print("## 8. What a real Prometheus keeps (deploy/'s torchdist-ranks job: file-SD target files, honor_labels: true)")
    if live is None:
        print("skipped: no prometheus binary on PATH (or --no-prometheus)")
        return
    run_id = "live-rank-label-off"
    r = live[run_id]
    per_rank = series(res["ddp"])
    print(f"{live['version'].split(' (')[0]}; a {LIVE_RANKS}-rank DDP job with metrics_rank_label=False, ranks 0-1")
    print("serving /metrics on 127.0.0.1 and ranks 2-3 on 127.0.0.2 (two 'nodes'), 1 s scrapes")
    print(f"series in Prometheus: {r['all']:g} ({r['torchdist']:g} torchdist_* + {r['all'] - r['torchdist']:g} per-target "
          f"series); with the rank label on the same job would hold {LIVE_RANKS} x ({per_rank} + {SYNTHETIC_PER_TARGET}) = "
          f"{LIVE_RANKS * (per_rank + SYNTHETIC_PER_TARGET)}")
    print(f"rank label on torchdist_steps_total: {', '.join(r['ranks'])} (from the target files); "
          f"label names: {', '.join(r['labels'])}")
    print(f"count(count without (rank, instance) ({NODE.format(sel='<each series, name kept>')})):")
    print(f"  {r['per_node']:g} series per-node (= 2 nodes x {r['per_run']:g}); without node: {r['per_run']:g}")
    expr = NODE.format(sel=f'torchdist_collective_calls_total{{run="{run_id}"}}')
    print(f"sum by (node, op) ({expr}):")
    for node, op, value in r["calls_by_node"]:
        print(f"  node={node} op={op} {value:g}")
    node_run = live.get("live-node")
    if node_run:
        print()
        print("the same job with metrics_aggregation=\"node\" (ranks 0-1 node-a, 2-3 node-b; LOCAL_RANK 0 exports):")
        print(f"targets: {node_run['targets']:g}; series in Prometheus: {node_run['all']:g} ({node_run['torchdist']:g} torchdist_* + "
              f"{node_run['all'] - node_run['torchdist']:g} per-target series); label names: {', '.join(node_run['labels'])}")
        print("sum by (host, op) (torchdist_collective_calls_total{run=\"live-node\"}):")
        for host, op, value in node_run["calls_by_host"]:
            print(f"  host={host} op={op} {value:g}")


def _short(w: int) -> str:
    return f"{w // 1024}k" if w >= 1024 else str(w)


# ============================================================================================== main
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=12, help="training steps per simulated rank (default 12)")
    parser.add_argument(
        "--sampling-steps",
        type=int,
        default=250,
        help="training steps of the runs that count traced steps (default 250; at least 201, so that the default "
        "sampling reaches steps 100 and 200)",
    )
    parser.add_argument("--jobs", type=int, default=2, help="simulated ranks run at once, one process each (default 2)")
    parser.add_argument("--json", metavar="PATH", help="also write every measurement to PATH as JSON")
    parser.add_argument(
        "--no-prometheus",
        action="store_true",
        help="skip section 8 (a real Prometheus scraping a 4-rank job), which runs when a prometheus binary is on PATH",
    )
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        print(json.dumps(_worker(json.loads(args.worker))))
        return 0
    if args.steps < 3:
        parser.error("--steps must be at least 3 (step 1 holds the set-up)")
    if args.sampling_steps < 201:
        parser.error("--sampling-steps must be at least 201, so that the default sampling reaches steps 100 and 200")
    res = _run_all(args.steps, args.sampling_steps, args.jobs)
    live = None if args.no_prometheus else live_prometheus(args.steps)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"runs": res, "prometheus": live}, f, default=list)
    report(res, args.steps, args.sampling_steps)
    report_live(live, res)
    return 0


if __name__ == "__main__":
    sys.exit(main())
