"""The live stack behind tests/test_deploy.py and tests/test_dashboards.py.

First the ranks: a real DDP training that keeps going until the test is done, with the faults the alert
rules in deploy/prometheus/rules must catch. Then (second half of this file) what surrounds it: the PromQL
of dashboards/ and deploy/ with its Grafana variables, a Prometheus configured from deploy/prometheus, and a
stand-in for the GPU series this machine cannot produce.

Each rank calls ``training(rank, world_size, port, out, args)`` (tests/launcher.py). The test steers the
job with flag files in ``args["control"]``:

* ``hang``: at the next step rank 1 sleeps ``hang_s`` before a barrier that rank 0 is already in (a
  collective in flight far past the hang threshold); rank 0 then writes ``hang-done``.
* ``silence``, then ``stop``: both ranks leave the training loop; rank 1 then uninstruments (its /metrics
  goes away, the "rank gone silent" fault) while rank 0 keeps serving.
* ``stop`` alone: both ranks leave the training loop.
* ``go``: both ranks uninstrument and finish.

Faults present for the whole run:

* straggler: rank 1 sleeps ``straggle_s`` at the start of every step, before its collectives, so rank 0
  waits for it in DDP's gradient all-reduce;
* telemetry dropped: rank 1 has a one-span export queue and pushes metrics to an OTLP endpoint nobody
  listens on (drops of kind span and metric_batch, errors of kind export);
* failed collectives: rank 1 calls an all-reduce with a reduce op that does not exist every 20 steps (it
  raises at once, on that rank alone, before any transfer).
"""

from __future__ import annotations

import dataclasses
import glob
import json
import math
import os
import re
import socket
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import torch
import torch.distributed as dist

from otel_torchdist.export import prometheus_names

from . import grafana


def _supported(**options):
    """The keyword options this version of ``instrument()`` knows (e.g. a hang threshold, once it exists)."""
    from otel_torchdist.config import Config

    known = {f.name for f in dataclasses.fields(Config)}
    return {k: v for k, v in options.items() if k in known}


def training(rank: int, ws: int, port: int, out: str, args: dict) -> dict:
    import torch.nn as nn
    from torch.utils.data import DataLoader, TensorDataset

    import otel_torchdist

    control = args["control"]
    options = dict(
        run_dir=os.path.join(out, "runs"),
        run_id=args["run_id"],
        metrics_exporter=("file", "prometheus"),
        traces_exporter="file",
        prometheus_host="127.0.0.1",
        prometheus_port=0,
        span_schedule_delay=0.2,
        drain_interval=0.05,
        summary="none",
    )
    exchange = args.get("straggler_exchange_steps", 10)
    options.update(_supported(system_interval=1.0, hang_threshold=1.0, straggler_exchange_steps=exchange))
    if rank == 1:
        options.update(
            span_queue_size=1,
            metrics_exporter=("file", "prometheus", "otlp"),
            metrics_endpoint=f"http://127.0.0.1:{args['dead_port']}/v1/metrics",
            metric_export_interval=1.0,
            timeout=1.0,
        )
    otel_torchdist.instrument(**options)
    dist.init_process_group("gloo", rank=rank, world_size=ws)
    pair = dist.new_group(list(range(ws)))  # a second process group, so dashboards see two groups

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 4))
    ddp = nn.parallel.DistributedDataParallel(model, bucket_cap_mb=0.01)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    gen = torch.Generator().manual_seed(100 + rank)
    data = TensorDataset(torch.randn(256, 32, generator=gen), torch.randn(256, 4, generator=gen))
    loader = DataLoader(data, batch_size=16)

    # The step API (record_step, set_total_steps) is looked up, not assumed, so that this job runs against
    # library versions with and without it: the tests then fail exactly on the series it did not produce.
    record_step = getattr(otel_torchdist, "record_step", None)
    set_total = getattr(otel_torchdist, "set_total_steps", None)
    if set_total is not None:
        set_total(100_000)
    steps = 0
    hung = False
    deadline = time.monotonic() + args.get("max_seconds", 400)
    stop = False
    while not stop:
        for x, y in loader:
            # The deadline is decided with the stop, in one all_reduce: on each rank's own clock one rank
            # would leave while the other went on into the next collective, and both would hang.
            flags = [float(os.path.exists(os.path.join(control, name))) for name in ("stop", "hang")]
            flags = torch.tensor(flags + [float(time.monotonic() >= deadline)])
            dist.all_reduce(flags, op=dist.ReduceOp.MAX)
            if flags[0] > 0 or flags[2] > 0:
                stop = True
                break
            if flags[1] > 0 and not hung:
                hung = True
                if rank == 1:
                    time.sleep(args["hang_s"])
                dist.barrier()
                if rank == 0:
                    open(os.path.join(control, "hang-done"), "w").close()
            if rank == 1:
                time.sleep(args["straggle_s"])
            loss = nn.functional.mse_loss(ddp(x), y)
            opt.zero_grad()
            loss.backward()
            if record_step is not None:  # before opt.step(), which closes the step
                lr = opt.param_groups[0]["lr"]
                record_step(loss=loss.item(), learning_rate=lr, samples=len(x), tokens=len(x) * 32)
            opt.step()
            if steps % 5 == 0:
                gathered = torch.empty(2 * ws)
                dist.all_gather_single(gathered, torch.tensor([loss.item(), float(steps)]))
            if steps % 10 == 0:
                dist.broadcast(torch.ones(512), src=0, group=pair)
            if rank == 1 and steps % 20 == 3:
                try:
                    dist.all_reduce(torch.ones(1), op="no such op")
                except Exception:
                    pass
            steps += 1
            time.sleep(args["pace_s"])

    silent = rank == 1 and os.path.exists(os.path.join(control, "silence"))
    if silent:
        otel_torchdist.uninstrument()  # the silent rank: its /metrics endpoint goes away
    open(os.path.join(control, f"stopped.rank{rank}"), "w").close()
    deadline = time.monotonic() + args.get("max_seconds", 400)
    while not os.path.exists(os.path.join(control, "go")) and time.monotonic() < deadline:
        time.sleep(0.1)
    if not silent:
        otel_torchdist.uninstrument()
    dist.destroy_process_group()
    return {"steps": steps, "hung": hung}


# =========================================================================================================
# The stack around the job, shared by tests/test_deploy.py and tests/test_dashboards.py: the PromQL in
# dashboards/ and deploy/, a Prometheus configured from deploy/prometheus, and a GPU stand-in.
# =========================================================================================================

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEPLOY = os.path.join(REPO, "deploy")
DASHBOARDS = os.path.join(REPO, "dashboards")
PROMETHEUS_DIR = os.path.join(DEPLOY, "prometheus")
DATASOURCES = os.path.join(DEPLOY, "grafana", "provisioning", "datasources", "datasources.yaml")

# Metric families the library does not emit yet: the job above was run and these returned no data. Every
# dashboard or rule expression that needs one of them is marked xfail(strict=True), so the day a family
# appears its cases XPASS and fail: then delete the name here.
NOT_EMITTED_YET = frozenset()

# ----------------------------------------------------------------------------------------- the PromQL
@dataclass(frozen=True)
class Expr:
    case_id: str  # stable, used as the pytest id
    expr: str
    kind: str  # panel | variable | recording | alert | traces_to_metrics
    dashboard: str = ""  # file name, for panels and variables
    exemplar: bool = False
    label: str = ""  # variables: the label whose values the variable lists
    ordered: bool = False  # variables: a query_result() whose order is the list's (else label_values())
    panel: dict | None = dataclasses.field(default=None, compare=False, hash=False)  # panels: Grafana's panel
    target: dict | None = dataclasses.field(default=None, compare=False, hash=False)  # and its query


def parse_yaml(text: str):
    """Plain dicts and lists from YAML, with ruamel.yaml (check-jsonschema, in the test extra, brings it)."""
    from ruamel.yaml import YAML

    return YAML(typ="safe", pure=True).load(text)


def load_yaml(path: str):
    with open(path) as f:
        return parse_yaml(f.read())


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def dashboard_files() -> list[str]:
    return sorted(glob.glob(os.path.join(DASHBOARDS, "*.json")))


def load_dashboard(path: str) -> dict:
    with open(path) as f:
        return json.load(f)


def all_panels(dashboard: dict) -> list[dict]:
    """Every panel, rows' nested panels (collapsed rows keep theirs inside) included."""
    out = []
    for panel in dashboard.get("panels", []):
        out.append(panel)
        out.extend(panel.get("panels", []))
    return out


def variable_query(variable: dict) -> str:
    q = variable.get("query")
    return q.get("query", "") if isinstance(q, dict) else (q or "")


_LABEL_VALUES = re.compile(r"^\s*label_values\(\s*(.+?)\s*,\s*(\w+)\s*\)\s*$", re.S)
_QUERY_RESULT = re.compile(r"^\s*query_result\((.+)\)\s*$", re.S)
_REGEX_LABEL = re.compile(r'^/(\w+)="\(\?<value>\[\^"\]\+\)"/$')


def dashboard_exprs() -> list[Expr]:
    out = []
    for path in dashboard_files():
        name = os.path.basename(path)
        stem = name[: -len(".json")]
        dashboard = load_dashboard(path)
        for var in dashboard.get("templating", {}).get("list", []):
            if var.get("type") == "query":
                case = f"{stem}/var-{var['name']}"
                m = _LABEL_VALUES.match(variable_query(var))
                if m:
                    out.append(Expr(case, m.group(1), "variable", name, label=m.group(2)))
                    continue
                m, label = _QUERY_RESULT.match(variable_query(var)), _REGEX_LABEL.match(var.get("regex", ""))
                assert m and label, f"{name}: variable {var['name']} is neither label_values() nor query_result() + /label=.../"
                out.append(Expr(case, m.group(1), "variable", name, label=label.group(1), ordered=True))
        for panel in all_panels(dashboard):
            for t in panel.get("targets", []):
                case = f"{stem}/{_slug(panel['title'])}/{t['refId']}"
                out.append(Expr(case, t["expr"], "panel", name, exemplar=bool(t.get("exemplar")), panel=panel, target=t))
    return out


def rule_groups() -> list[dict]:
    groups = []
    for path in sorted(glob.glob(os.path.join(PROMETHEUS_DIR, "rules", "*.rules.yml"))):
        groups.extend(load_yaml(path)["groups"])
    return groups


def rule_exprs() -> list[Expr]:
    out = []
    for group in rule_groups():
        for rule in group["rules"]:
            if "record" in rule:
                out.append(Expr(f"record/{rule['record']}", rule["expr"], "recording"))
            else:
                out.append(Expr(f"alert/{rule['alert']}", rule["expr"], "alert"))
    return out


def recording_rules() -> dict[str, str]:
    return {r["record"]: r["expr"] for g in rule_groups() for r in g["rules"] if "record" in r}


def traces_to_metrics_exprs() -> list[Expr]:
    out = []
    for ds in load_yaml(DATASOURCES)["datasources"]:
        for q in ds.get("jsonData", {}).get("tracesToMetrics", {}).get("queries", []):
            # Provisioning files escape $ as $$.
            case = f"traces-to-metrics/{_slug(q['name'])}"
            out.append(Expr(case, q["query"].replace("$$", "$"), "traces_to_metrics"))
    return out


# ------------------------------------------------------------------------------ schema and dependencies
def _series_to_family() -> dict[str, str]:
    from otel_torchdist import names

    out = {}
    for m in names.METRICS:
        base = prometheus_names.prometheus_name(m)
        for series in prometheus_names.prometheus_series_names((m,)):
            out[series] = base
    return out


SERIES_TO_FAMILY = _series_to_family()
_SERIES = re.compile(r"\btorchdist_[a-z0-9_]+")
_RECORDED = re.compile(r"\btorchdist:[a-z0-9_:]+")
_ALTERNATIVES = re.compile(r"\s*(torchdist:[a-z0-9_:]+)\s+or\s+(torchdist:[a-z0-9_:]+)\s*")


def referenced_series(expr: str) -> set[str]:
    return set(_SERIES.findall(expr))


def referenced_recordings(expr: str) -> set[str]:
    return set(_RECORDED.findall(expr))


def missing_families(expr: str) -> set[str]:
    """Families in NOT_EMITTED_YET ``expr`` cannot do without (through recording rules; a rule that is just
    ``a or b`` of two recorded series needs only one of them)."""
    alternatives = _ALTERNATIVES.fullmatch(expr)
    if alternatives:
        needs = [missing_families(a) for a in alternatives.groups()]
        return set().union(*needs) if all(needs) else set()
    rules = recording_rules()
    out = {SERIES_TO_FAMILY.get(s, s) for s in referenced_series(expr)} & NOT_EMITTED_YET
    for name in referenced_recordings(expr):
        out |= missing_families(rules[name])
    return out


# ------------------------------------------------------------------------------------- GPU stand-in
def gpu_only_metrics():
    """The metrics only a GPU machine has (NVML, the CUDA allocator, CUDA AMP's GradScaler)."""
    from otel_torchdist import names

    prefixes = ("torchdist.gpu.", "torchdist.cuda.", "torchdist.amp.")
    return [m for m in names.SYSTEM_METRICS if m.name.startswith(prefixes)]


class GpuStandIn:
    """A STAND-IN: no GPU exists on the machines these tests run on, so this serves synthetic series under
    the exact GPU metric names and labels of otel_torchdist/names.py, for ranks 0 and 1 of the run, from a
    small local /metrics endpoint that the test Prometheus scrapes next to the real ranks. Rank 1's GPU is
    nearly idle (the TorchdistLowGpuUtilization fault). Real GPU series come from the library on GPU machines."""

    REASONS = ("sw_power_cap", "hw_thermal_slowdown")
    DCGM = {"DCGM_FI_PROF_SM_ACTIVE": 0.7, "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": 0.35, "DCGM_FI_PROF_DRAM_ACTIVE": 0.45}

    def __init__(self, run_id: str, world_size: int = 2) -> None:
        self.run_id = run_id
        self.world_size = world_size
        self.host = socket.gethostname()
        self.t0 = time.monotonic()
        self.server: ThreadingHTTPServer | None = None

    def _labels(self, metric, rank: int) -> list[dict[str, str]]:
        from otel_torchdist import names as n

        base = {
            n.M_RUN: self.run_id,
            n.M_RANK: str(rank),
            n.M_GPU: str(rank),
            n.M_UUID: f"GPU-stand-in-{rank}",
            n.M_GPU_MODEL: "stand-in (no GPU on this machine)",
            n.M_HOST: self.host,
            n.M_DEVICE: "0",
        }
        base = {k: v for k, v in base.items() if k in metric.attributes}
        extra = [a for a in metric.attributes if a not in base]
        if not extra:
            return [base]
        (key,) = extra
        values = {
            n.M_DIRECTION: ("transmit", "receive"),
            n.M_REASON: self.REASONS,
            n.M_ERROR_KIND: ("corrected", "uncorrected"),
        }[key]
        return [{**base, key: v} for v in values]

    def _value(self, metric, labels: dict[str, str], t: float) -> float:
        rank = int(labels["rank"])
        short = metric.name.split(".", 1)[1]
        wave = math.sin(t / 5.0)
        return {
            "gpu.utilization": 0.05 if rank == 1 else 0.85 + 0.05 * wave,
            "gpu.memory.used": 30e9 + rank * 2e9 + 1e8 * wave,
            "gpu.memory.total": 80e9,
            "gpu.power": 120.0 if rank == 1 else 350.0 + 20 * wave,
            "gpu.temperature": 45.0 if rank == 1 else 68.0 + 2 * wave,
            "gpu.sm_clock": 1.98e9,
            "gpu.pcie.throughput": 5e9 if labels.get("direction") == "transmit" else 3e9,
            "gpu.nvlink.io": 4e11 * t,
            "gpu.throttled": float(rank == 1 and labels.get("reason") == "sw_power_cap"),
            "gpu.ecc.errors": float(int(t)) if labels.get("type") == "corrected" else 0.0,
            "cuda.memory.allocated": 20e9,
            "cuda.memory.reserved": 24e9,
            "cuda.memory.peak": 26e9,
            "cuda.oom_retries": float(int(t / 4)),
            "amp.grad_scale": 65536.0,
        }[short]

    def render(self) -> str:

        t = time.monotonic() - self.t0
        lines = []
        for metric in gpu_only_metrics():
            name = prometheus_names.prometheus_name(metric)
            lines.append(f"# TYPE {name} {'counter' if metric.instrument == 'counter' else 'gauge'}")
            for rank in range(self.world_size):
                for labels in self._labels(metric, rank):
                    text = ",".join(f'{k}="{v}"' for k, v in labels.items())
                    lines.append(f"{name}{{{text}}} {self._value(metric, labels, t)!r}")
        # dcgm-exporter's profiling counters (deploy/dcgm/counters.csv), labelled as it labels them: by GPU
        # UUID and node, not by run or rank; rank 1 idles here too.
        for field, busy in self.DCGM.items():
            lines.append(f"# TYPE {field} gauge")
            for rank in range(self.world_size):
                labels = f'gpu="{rank}",UUID="GPU-stand-in-{rank}",Hostname="{self.host}",modelName="stand-in"'
                lines.append(f"{field}{{{labels}}} {busy * (0.05 if rank == 1 else 1.0)!r}")
        return "\n".join(lines) + "\n"

    def start(self) -> GpuStandIn:
        stand_in = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802
                body = stand_in.render().encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    @property
    def target(self) -> str:
        assert self.server is not None
        return f"127.0.0.1:{self.server.server_address[1]}"

    def stop(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()


# --------------------------------------------------------------------------- dashboards as users set them
def variable_options(prom, dashboard: grafana.Dashboard, variable: dict) -> list[str]:
    """What a query variable lists, in the order Grafana shows it (``prom``: tests.peers.Prometheus)."""
    query = variable_query(variable)
    m = _LABEL_VALUES.match(query)
    if m:
        selector, label = m.groups()
        end = time.time()
        found = prom.api(f"label/{label}/values", **{"match[]": dashboard.expression(selector), "start": end - dashboard.time_range, "end": end})
        return sorted(found, reverse=variable.get("sort") in (2, 4, 6))
    (expr,) = _QUERY_RESULT.match(query).groups()
    label = _REGEX_LABEL.match(variable["regex"]).group(1)
    return [s["metric"][label] for s in prom.query(dashboard.expression(expr)) if label in s["metric"]]


def dashboard_as_user(prom, dashboard_file: str, run_id: str, scrape_interval: str, resolution: str) -> grafana.Dashboard:
    """``dashboard_file`` on the data source ``prom`` scrapes every ``scrape_interval``, with the run
    ``run_id`` picked, All for the other query variables, custom variables at their default and the metric
    resolution ``resolution``. Each variable is evaluated in order, as Grafana does."""
    dashboard = grafana.Dashboard(scrape_interval=scrape_interval)
    for var in load_dashboard(os.path.join(DASHBOARDS, dashboard_file))["templating"]["list"]:
        name = var["name"]
        if name == "resolution":
            dashboard.variables[name] = resolution
        elif var["type"] == "custom":
            dashboard.variables[name] = var["current"]["value"]
        else:
            found = variable_options(prom, dashboard, var)
            assert found, f"{dashboard_file}: variable {name} has no values"
            if name == "run":
                assert run_id in found, (run_id, found)
                dashboard.variables[name] = run_id
            else:
                dashboard.variables[name] = grafana.regex_value(found)
    return dashboard


# ------------------------------------------------------------------------- Prometheus from deploy/
def derived_prometheus_config(run_folder: str, stand_in_target: str) -> dict:
    """deploy/prometheus/prometheus.yml made runnable here: the same rule files (absolute paths), the same
    direct-path job with its file-SD patterns pointed at the run folder instead of targets/, a job for the
    GPU stand-in, 1 s intervals. The otel-collector and dcgm jobs are dropped: no Collector or DCGM here."""
    config = load_yaml(os.path.join(PROMETHEUS_DIR, "prometheus.yml"))
    config["global"].update(scrape_interval="1s", evaluation_interval="1s")
    config["rule_files"] = [os.path.join(PROMETHEUS_DIR, pattern) for pattern in config["rule_files"]]
    (ranks,) = [job for job in config["scrape_configs"] if job["job_name"] == "torchdist-ranks"]
    for sd in ranks["file_sd_configs"]:
        sd["files"] = [os.path.join(run_folder, os.path.basename(pattern)) for pattern in sd["files"]]
        sd["refresh_interval"] = "1s"
    gpu_job = {"job_name": "gpu-stand-in", "static_configs": [{"targets": [stand_in_target]}]}
    config["scrape_configs"] = [ranks, gpu_job]
    return config


class LiveStack:
    """A real 2-rank gloo job (``training`` above) scraped by a real Prometheus configured from deploy/,
    plus the GPU stand-in. ``start()`` returns once both ranks and the stand-in are scraped, the hang has
    been injected and every rate window has data."""

    WORLD_SIZE = 2

    def __init__(self, workdir: str, run_id: str, straggler_exchange: bool = True) -> None:
        self.workdir = workdir
        self.run_id = run_id
        self.straggler_exchange = straggler_exchange
        self.out = os.path.join(workdir, "job")
        self.control = os.path.join(workdir, "control")
        self.run_folder = os.path.join(self.out, "runs", run_id)
        self.prom = None
        self.proc = None
        self.stand_in: GpuStandIn | None = None
        self._dashboards: dict[str, grafana.Dashboard] = {}

    def start(self) -> LiveStack:
        from .harness import free_port, start_ranks, wait_for
        from .peers import Prometheus

        os.makedirs(self.control, exist_ok=True)
        try:
            self.stand_in = GpuStandIn(self.run_id, self.WORLD_SIZE).start()
            self.prom = Prometheus(os.path.join(self.workdir, "prometheus"), "")
            with open(self.prom.config_path, "w") as f:  # JSON is YAML: Prometheus reads it as its config
                json.dump(derived_prometheus_config(self.run_folder, self.stand_in.target), f, indent=1)
            self.prom.start()
            args = {
                "run_id": self.run_id,
                "control": self.control,
                "dead_port": free_port(),
                "hang_s": 2.5,
                "straggle_s": 0.05,
                "pace_s": 0.01,
                "max_seconds": 400,
                "straggler_exchange_steps": 10 if self.straggler_exchange else 0,
            }
            self.proc = start_ranks("scenarios_deploy:training", self.WORLD_SIZE, self.out, args)
            run = f'run="{self.run_id}"'
            both = lambda r: len(r) == self.WORLD_SIZE  # noqa: E731
            self.prom.wait_query(f"count by (rank) (torchdist_collective_calls_total{{{run}}})", 120, check=both)
            self.prom.wait_query(f"torchdist_gpu_utilization_ratio{{{run}}}", 30, check=both)
            open(os.path.join(self.control, "hang"), "w").close()
            wait_for(lambda: os.path.exists(os.path.join(self.control, "hang-done")), 60, what="the injected hang")
            self.prom.wait_query(f'torchdist_collective_calls_total{{{run},op="barrier"}}', 30, check=both)
            # every $__rate_interval window (20 s at the 5 s resolution) has samples from after the hang on both ranks, and there are
            # 10 s of history (the coarsest subquery step of a panel is 5 s)
            self.prom.wait_query(
                f"sum by (rank) (rate(torchdist_collective_calls_total{{{run}}}[20s])) > 0",
                60,
                check=both,
            )
            self.prom.wait_query(
                f"min by (rank) (count_over_time(torchdist_telemetry_dropped_total{{{run}}}[1m])) >= 10", 60, check=both
            )
        except BaseException:
            self.stop()
            raise
        return self

    def dashboard(self, dashboard_file: str) -> grafana.Dashboard:
        """The dashboard set as a user would: this run, All for the other variables, the finest resolution
        (this Prometheus scrapes the ranks every second)."""
        if dashboard_file not in self._dashboards:
            self._dashboards[dashboard_file] = dashboard_as_user(self.prom, dashboard_file, self.run_id, "1s", "5s")
        return self._dashboards[dashboard_file]

    def label_values(self, selector: str, label: str) -> list[str]:
        return sorted(self.prom.api(f"label/{label}/values", **{"match[]": selector}))

    def query_ok(self, expr: str) -> list[dict]:
        """Results of an instant query that must parse and return at least one finite value."""
        result = self.prom.query(expr)
        assert result, f"no data for:\n{expr}"
        values = [float(s["value"][1]) for s in result]
        assert any(math.isfinite(v) for v in values), f"only NaN/Inf for:\n{expr}\n{result}"
        return result

    def exported_trace_ids(self) -> set[str]:
        from .harness import read_spans

        ids = set()
        for path in glob.glob(os.path.join(self.run_folder, "traces.rank*.jsonl")):
            ids |= {s["traceId"] for s in read_spans(path)}
        return ids

    def silence_rank_1(self) -> None:
        """Both ranks leave the training loop; rank 1 uninstruments (its /metrics goes away)."""
        from .harness import wait_for

        open(os.path.join(self.control, "silence"), "w").close()
        open(os.path.join(self.control, "stop"), "w").close()
        wait_for(lambda: os.path.exists(os.path.join(self.control, "stopped.rank1")), 60, what="rank 1 to go silent")

    def stop(self) -> None:
        from .harness import finish_ranks

        for name in ("stop", "go"):
            open(os.path.join(self.control, name), "w").close()
        try:
            if self.proc is not None:
                finish_ranks(self.proc, self.out, self.WORLD_SIZE, timeout=120)
        finally:
            if self.prom is not None:
                self.prom.stop()
            if self.stand_in is not None:
                self.stand_in.stop()
