"""GPU and system telemetry, and the run description.

Real parts: a 2-rank gloo job training a DDP model (shared by several checks through a module-scoped
fixture), the real sampler thread in this process, a real ``/metrics`` scrape, the files a run leaves.
Values are compared with sources independent of the sampler: ``/proc``, ``os.times()``, GradScaler's own
``get_scale()``, the batches the loop drew, ``nvidia-smi`` on a GPU machine.
"""

from __future__ import annotations

import json
import logging
import os
import platform
import socket
import subprocess
import threading
import time
import urllib.request
from contextlib import contextmanager

import pytest
import torch
from prometheus_client.parser import text_string_to_metric_families

import otel_torchdist
from otel_torchdist import config, health, runtime
from otel_torchdist import names as n
from otel_torchdist.system import THREAD_NAME, SystemTelemetry
from otel_torchdist.system.describe import node_count
from otel_torchdist.system.gpu import GpuReading, NvmlSampler, match_device
from otel_torchdist.system.series import Deltas
from otel_torchdist.system.warn import LOW_GPU_UTILIZATION, MEMORY_NEAR_LIMIT, WarningState

from . import scenarios_system
from .harness import last_metrics, read_metric_lines, read_spans, run_ranks, wait_for
from otel_torchdist.export.prometheus_names import prometheus_name

RUN = "sys-ddp"
GPU_VISIBLE = torch.cuda.device_count()


def _system() -> SystemTelemetry:
    rt = runtime.current()
    assert rt is not None
    (comp,) = [c for c in rt.components if isinstance(c, SystemTelemetry)]
    return comp


def _points(comp: SystemTelemetry) -> dict[str, list]:
    return {md.metric.name: md.points for md in comp.metric_data() if md.points}


def _log_level_option(level: int) -> dict:
    """The ``log_level`` option where instrument() has one (it then sets the library logger's level)."""
    return {"log_level": logging.getLevelName(level)} if "log_level" in config.OPTION_NAMES else {}


@contextmanager
def _library_log(level: int = logging.INFO):
    """Records the ``otel_torchdist`` logger emits at ``level`` and above, from a handler on that logger
    itself (it may not propagate to pytest's), with its level opened up."""
    records: list[logging.LogRecord] = []
    handler = logging.Handler(level)
    handler.emit = records.append
    logger = logging.getLogger("otel_torchdist")
    old_level = logger.level
    logger.setLevel(level)
    logger.addHandler(handler)
    try:
        yield records
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old_level)


def _value(points: dict[str, list], name: str) -> float:
    (pt,) = points[name]
    return pt.value


# ------------------------------------------------------------------------------ a 2-rank DDP run
@pytest.fixture(scope="module")
def ddp_job(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("system") / "job")
    results = run_ranks("scenarios_system:ddp_amp_training", 2, out, {"run_id": RUN})
    return os.path.join(out, "runs", RUN), results


def _expected_description_attributes() -> dict:
    expected = {n.NODE_COUNT: 1}  # the launcher sets WORLD_SIZE = LOCAL_WORLD_SIZE = 2: one node
    if torch.version.cuda:
        expected[n.CUDA_VERSION] = torch.version.cuda
        try:  # torch's CUDA build loads the NCCL of its wheel even without a GPU on some machines
            nccl = torch.cuda.nccl.version() if torch.distributed.is_nccl_available() else None
        except Exception:
            nccl = None
        if nccl:
            expected[n.NCCL_VERSION] = ".".join(map(str, nccl))
    if GPU_VISIBLE:
        expected[n.GPU_COUNT] = GPU_VISIBLE
    return expected


def test_run_description_is_on_the_resource_of_exported_traces_and_metrics(ddp_job):
    folder, _ = ddp_job
    expected = _expected_description_attributes()
    for rank in range(2):
        spans = read_spans(os.path.join(folder, f"traces.rank{rank}.jsonl"))
        assert any(s["name"] == "all_reduce" for s in spans)  # DDP's gradient all-reduces
        metric_docs = read_metric_lines(os.path.join(folder, f"metrics.rank{rank}.jsonl"))
        metric_resources = [
            {a["key"]: a["value"] for a in rm["resource"]["attributes"]} for doc in metric_docs for rm in doc["resourceMetrics"]
        ]
        for resource in [s["resource"] for s in spans]:
            got = {k: v for k, v in resource.items() if k in n.RUN_DESCRIPTION_ATTRIBUTES}
            assert got == expected
            assert resource[n.RANK] == rank and resource[n.BACKEND] == "gloo"
        for resource in metric_resources:
            assert resource[n.NODE_COUNT] == {"intValue": "1"}
            assert n.GPU_MODELS not in resource  # gloo on CPU: this rank uses no GPU
        with open(os.path.join(folder, f"resource.rank{rank}.json")) as f:
            resource = json.load(f)
        assert {k: v for k, v in resource.items() if k in n.RUN_DESCRIPTION_ATTRIBUTES} == expected


def test_run_description_file_describes_the_rank(ddp_job):
    folder, results = ddp_job
    for rank in range(2):
        with open(os.path.join(folder, f"run-description.rank{rank}.json")) as f:
            doc = json.load(f)
        assert doc["run"] == RUN and doc["rank"] == rank and doc["local_rank"] == rank
        assert doc["backend"] == "gloo" and doc["world_size"] == 2 and doc["local_world_size"] == 2
        assert doc["node_count"] == 1
        assert doc["host"] == results[rank]["host"] == socket.gethostname()
        assert doc["pid"] == results[rank]["pid"]
        assert doc["versions"]["torch"] == torch.__version__
        assert doc["versions"]["cuda"] == torch.version.cuda
        assert doc["versions"]["python"] == platform.python_version()
        assert doc["gpu_count"] == GPU_VISIBLE and doc["gpus"] == []
        assert doc["host_resources"]["cpu_count"] == os.cpu_count()
        assert doc["mixed_precision"] == {"autocast_device": "cpu", "autocast_dtype": "bfloat16", "grad_scaler": "GradScaler"}
        assert doc["attributes"][n.AMP_DTYPE] == "bfloat16"
        assert doc["attributes"][n.NODE_COUNT] == 1


def test_dataloader_wait_histogram_counts_every_batch(ddp_job):
    folder, results = ddp_job
    for rank in range(2):
        assert results[rank]["batches"] == scenarios_system.EPOCHS * -(-scenarios_system.SAMPLES // scenarios_system.BATCH)
        (point,) = last_metrics(os.path.join(folder, f"metrics.rank{rank}.jsonl"))[n.DATALOADER_WAIT.name]
        assert point["attributes"] == {"run": RUN, "rank": str(rank)}
        assert int(point["count"]) == results[rank]["batches"]
        assert sum(int(c) for c in point["bucketCounts"]) == results[rank]["batches"]
        assert point["explicitBounds"] == list(n.DURATION_BUCKETS)
        assert 0 < point["min"] <= point["max"] and point["sum"] > 0


def test_grad_scale_is_the_scalers_own_after_its_last_update(ddp_job):
    folder, results = ddp_job
    for rank in range(2):
        (point,) = last_metrics(os.path.join(folder, f"metrics.rank{rank}.jsonl"))[n.AMP_GRAD_SCALE.name]
        assert point["asDouble"] == results[rank]["scale"]
        assert results[rank]["scale"] > 1024.0  # it grew every 3 steps: read after update(), not before


def test_patches_go_in_and_come_back_identical(ddp_job):
    _, results = ddp_job
    for result in results:
        assert result["patched"] == [True, True, True]
        assert result["restored"] == [True, True, True]


# ------------------------------------------------------------------- in this process, on this CPU
def test_process_and_host_metrics_are_plausible_and_gpu_is_quietly_absent(fake_pg, instrumented):
    health.reset()
    with _library_log() as records:
        instrumented(system_interval=0.05, **_log_level_option(logging.INFO))
        comp = _system()
        assert THREAD_NAME in [t.name for t in threading.enumerate()]
        first = wait_for(lambda: _points(comp).get(n.PROCESS_CPU_TIME.name) and _points(comp), 10, what="a sample")
        cpu0 = _value(first, n.PROCESS_CPU_TIME.name)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:  # burn CPU until a sample taken meanwhile shows it
            spin = time.perf_counter() + 0.02
            while time.perf_counter() < spin:
                pass
            second = _points(comp)
            if _value(second, n.PROCESS_CPU_TIME.name) >= cpu0 + 0.25:
                break
        times = os.times()  # the kernel's ticks, not the sampler's clock: user and system each truncated to 10 ms
        assert _value(second, n.PROCESS_CPU_TIME.name) <= min(time.process_time(), times.user + times.system + 0.02)
        assert 0 < _value(second, n.PROCESS_CPU_UTILIZATION.name) <= os.cpu_count() + 0.5
        with open("/proc/self/status") as f:
            vm_rss = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS:"))
        assert 0.8 * vm_rss < _value(second, n.PROCESS_RSS.name) < 1.25 * vm_rss
        assert abs(_value(second, n.PROCESS_OPEN_FDS.name) - len(os.listdir("/proc/self/fd"))) <= 8
        network = {pt.attributes["direction"]: pt.value for pt in second[n.HOST_NETWORK_IO.name]}
        assert set(network) == {"transmit", "receive"} and all(v >= 0 for v in network.values())
        assert not [name for name in second if name.startswith(("torchdist.gpu.", "torchdist.cuda."))]
        otel_torchdist.uninstrument()
    assert THREAD_NAME not in [t.name for t in threading.enumerate()]
    assert health.errors() == {}
    if not GPU_VISIBLE:
        said = [r for r in records if "GPU" in r.getMessage()]
        assert len(said) == 1 and "GPU metrics off" in said[0].getMessage() and said[0].levelno == logging.INFO


def test_cpu_utilization_skips_a_reading_the_clock_could_not_bracket(monkeypatch):
    """A GIL handover between the CPU reading and its stamp cannot be forced on demand, so the clock is stepped
    by hand here: a reading whose bracket stays wide gives no utilization, and the next good one closes the
    window from the last good edge instead of from the late stamp."""
    from otel_torchdist.system import process

    clock = {"now": 100.0, "cpu": 5.0, "step": 0.0}

    def monotonic():
        clock["now"] += clock["step"]
        return clock["now"]

    monkeypatch.setattr(process, "monotonic", monotonic)  # the sampler's own names: no other thread's clock
    monkeypatch.setattr(process, "process_time", lambda: clock["cpu"])
    sampler = process.ProcessSampler("h")

    def utilization():
        points = {m.metric.name: m.points for m in sampler.sample({n.M_RANK: "0"})}
        assert points[n.PROCESS_CPU_TIME.name][0].value == clock["cpu"]
        return [p.value for p in points.get(n.PROCESS_CPU_UTILIZATION.name, [])]

    assert utilization() == []  # the first edge
    clock["now"] += 1.0
    clock["cpu"] += 1.5
    clock["step"] = 0.3  # every bracket 0.3 s wide
    assert utilization() == []
    clock["step"] = 0.0
    clock["now"] += 1.0
    clock["cpu"] += 0.5
    (cores,) = utilization()
    assert cores == pytest.approx(2.0 / (1.0 + 8 * 0.3 + 1.0))  # CPU over the window since the first edge


def test_cpu_time_counter_starts_when_the_process_started():
    """CPU time is counted from the process's start: a cumulative point starting at instrument() would put
    the CPU spent importing torch inside too short a window (more cores than the machine has)."""
    import json

    from otel_torchdist.export import otlp
    from otel_torchdist.system.process import ProcessSampler

    data = ProcessSampler("h").sample({n.M_RANK: "0"})
    later = time.time_ns()
    doc = json.loads(otlp.metrics_to_json({}, data, later, later))
    metrics = {m["name"]: m for m in doc["resourceMetrics"][0]["scopeMetrics"][0]["metrics"]}
    (point,) = metrics[n.PROCESS_CPU_TIME.name]["sum"]["dataPoints"]
    with open("/proc/self/stat") as f:
        ticks = int(f.read().rsplit(")", 1)[1].split()[19])
    with open("/proc/stat") as f:
        boot = next(int(line.split()[1]) for line in f if line.startswith("btime"))
    started_s = boot + ticks / os.sysconf("SC_CLK_TCK")  # /proc's own reading, to the second of boot time
    assert abs(int(point["startTimeUnixNano"]) / 1e9 - started_s) < 1.5
    window = (later - int(point["startTimeUnixNano"])) / 1e9
    assert float(point["asDouble"]) <= window * os.cpu_count() + 0.1


def test_metrics_follow_the_schema_and_scrape_with_prometheus_names(fake_pg, instrumented):
    from torch.utils.data import DataLoader, TensorDataset

    instrumented(
        system_interval=0.05, metrics_exporter=("file", "prometheus"), prometheus_host="127.0.0.1", prometheus_port=0
    )
    comp = _system()
    for _ in DataLoader(TensorDataset(torch.ones(6, 2)), batch_size=2):
        pass
    weight = torch.nn.Parameter(torch.ones(()))
    scaler = torch.amp.GradScaler("cpu")
    scaler.scale(weight * 2).backward()
    scaler.step(torch.optim.SGD([weight], lr=0.1))
    scaler.update()
    wait_for(lambda: n.PROCESS_CPU_UTILIZATION.name in _points(comp), 10, what="two samples")
    data = [md for md in comp.metric_data() if md.points]
    assert {md.metric.name for md in data} >= {
        n.PROCESS_CPU_TIME.name, n.PROCESS_CPU_UTILIZATION.name, n.PROCESS_RSS.name, n.PROCESS_OPEN_FDS.name,
        n.HOST_NETWORK_IO.name, n.DATALOADER_WAIT.name, n.AMP_GRAD_SCALE.name,
    }  # fmt: skip
    for md in data:
        assert md.metric in n.SYSTEM_METRICS
        for pt in md.points:
            assert tuple(pt.attributes) == md.metric.attributes  # every label, in the schema's order
    body = urllib.request.urlopen(runtime.current().prometheus.url, timeout=10).read().decode()
    scraped = {s.name: s for fam in text_string_to_metric_families(body) for s in fam.samples}
    for md in data:
        base = prometheus_name(md.metric)
        name = base + "_count" if md.metric.instrument == "histogram" else base
        assert name in scraped, name
        assert scraped[name].labels["run"] == "unit" and scraped[name].labels["rank"] == "0"
    assert scraped["torchdist_dataloader_wait_time_seconds_count"].value == 3
    assert scraped["torchdist_amp_grad_scale"].value == scaler.get_scale()


def test_without_the_rank_label_metrics_keep_the_rest_in_order(fake_pg, instrumented):
    instrumented(system_interval=0.05, metrics_rank_label=False)
    comp = _system()
    wait_for(lambda: _points(comp), 10, what="a sample")
    for md in comp.metric_data():
        for pt in md.points:
            assert tuple(pt.attributes) == tuple(a for a in md.metric.attributes if a != "rank")


def test_system_metrics_off_means_no_thread_and_no_timing(fake_pg, instrumented):
    from torch.utils.data import DataLoader

    from otel_torchdist.capture import dataloader as capture

    instrumented(system_metrics=False)
    assert not [c for c in runtime.current().components if isinstance(c, SystemTelemetry)]
    assert THREAD_NAME not in [t.name for t in threading.enumerate()]
    capture.WAITS.clear()
    assert len(list(DataLoader(list(range(8)), batch_size=2))) == 4
    assert not capture.TIMED[0] and not capture.WAITS  # the batches end steps, but no wait is timed


def test_fsdp_sharded_grad_scaler_is_patched_when_imported_and_restored(fake_pg, instrumented):
    from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

    before = ShardedGradScaler.__dict__["update"]
    instrumented()
    assert ShardedGradScaler.__dict__["update"] is not before
    otel_torchdist.uninstrument()
    assert ShardedGradScaler.__dict__["update"] is before


def test_patched_calls_pass_results_and_exceptions_through(fake_pg, instrumented):
    from torch.utils.data import DataLoader, Dataset

    class Broken(Dataset):
        def __len__(self):
            return 4

        def __getitem__(self, i):
            if i == 2:
                raise KeyError("bad sample")
            return torch.tensor([float(i)])

    instrumented()
    it = iter(DataLoader(Broken(), batch_size=1))
    assert next(it).tolist() == [[0.0]] and next(it).tolist() == [[1.0]]
    with pytest.raises(KeyError, match="bad sample"):
        next(it)
    scaler = torch.amp.GradScaler("cpu")
    with pytest.raises(AssertionError, match="_scale is None"):
        scaler.update()  # its own error: update() before any scale()
    assert torch.amp.GradScaler("cpu", enabled=False).update() is None
    comp = _system()
    (wait,) = [md for md in comp.metric_data() if md.metric is n.DATALOADER_WAIT]
    assert wait.points[0].count == 2  # the failed next() is not a batch


# ------------------------------------------------------------------------------------- warnings
def _reading(util=None, used=None, total=80 << 30, gpu=0):
    return GpuReading(gpu, f"GPU-{gpu:08d}", "NVIDIA H100 80GB HBM3", utilization=util, memory_used=used, memory_total=total)


def test_low_utilization_warns_once_per_sustained_episode():
    # No GPU exists here, so the decision is driven with NVML-like readings.
    state = WarningState(utilization=0.2, window=60.0, memory_fraction=0.0)
    kinds = []
    for t in range(0, 200, 5):  # low the whole time: one warning, at the first sample 60 s after the first low one
        for w in state.observe([_reading(util=0.05)], float(t)):
            kinds.append((t, w.kind, w.started))
    assert kinds == [(60, LOW_GPU_UTILIZATION, 0.0)]
    assert state.observe([_reading(util=0.9)], 200.0) == []  # the episode ends
    assert state.observe([_reading(util=0.1)], 205.0) == []
    assert state.observe([_reading(util=0.5)], 230.0) == []  # one busy sample: not sustained
    assert state.observe([_reading(util=0.1)], 235.0) == []
    (again,) = state.observe([_reading(util=0.1)], 295.0)
    assert again.started == 235.0 and "below 20%" in again.message
    off = WarningState(utilization=0.0, window=1.0, memory_fraction=0.0)
    assert all(off.observe([_reading(util=0.0)], float(t)) == [] for t in range(100))


def test_memory_near_limit_warns_once_until_it_drops_back():
    state = WarningState(utilization=0.0, window=1.0, memory_fraction=0.9)
    total = 80 << 30
    seq = [0.5, 0.95, 0.97, 0.89, 0.93, 0.80, 0.92]
    fired = [bool(state.observe([_reading(used=int(f * total), total=total)], float(i))) for i, f in enumerate(seq)]
    assert fired == [False, True, False, False, False, False, True]  # 0.89 is within the hysteresis band
    # two GPUs are two episodes
    assert len(WarningState(0.0, 1.0, 0.9).observe([_reading(used=total, gpu=0), _reading(used=total, gpu=1)], 0.0)) == 2


def test_warning_span_with_its_event_lands_in_the_traces_file(fake_pg, instrumented):
    # No GPU exists here: the sampler's own warning path is fed NVML-like readings.
    folder = instrumented(warn_gpu_utilization=0.3, warn_gpu_utilization_window=10.0, warn_memory_fraction=0.9)
    comp = _system()
    total = 80 << 30
    with _library_log(logging.WARNING) as records:
        for t in (0.0, 5.0, 10.0, 15.0):
            comp.check_warnings([_reading(util=0.1, used=int(0.95 * total), total=total)], 1000.0 + t)
    otel_torchdist.uninstrument()
    spans = [s for s in read_spans(os.path.join(folder, "traces.rank0.jsonl")) if s["name"] == n.SPAN_WARNING]
    by_kind = {s["attributes"][n.WARNING_KIND]: s for s in spans}
    assert len(spans) == 2 and set(by_kind) == {LOW_GPU_UTILIZATION, MEMORY_NEAR_LIMIT}
    low = by_kind[LOW_GPU_UTILIZATION]
    assert "utilization stayed below 30%" in low["attributes"][n.WARNING_MESSAGE]
    assert int(low["endTimeUnixNano"]) - int(low["startTimeUnixNano"]) == pytest.approx(10e9, rel=0.01)  # the episode
    for span in spans:
        (event,) = span["events"]
        assert event["name"] == n.WARNING_EVENT
        assert {a["key"] for a in event["attributes"]} == {n.WARNING_KIND, n.WARNING_MESSAGE}
        assert span["resource"][n.RANK] == 0
    logged = [r.getMessage() for r in records if r.levelno == logging.WARNING]
    assert len(logged) == 2 and any("memory in use is 95.0%" in m for m in logged)


# ---------------------------------------------------------------------------------- pure pieces
def test_gpu_points_convert_units_and_count_nvlink_from_the_first_read():
    # Readings as gpu.py builds them from NVML (no GPU here to read).
    sampler = NvmlSampler("node-a")
    base = {"run": "r", "rank": "3"}
    first = GpuReading(2, "GPU-abc", "NVIDIA A100", 0.5, 1 << 30, 40 << 30, 250.0, 60.0, 1.41e9, 1e6, 2e6, 1000, 5000,
                       {"sw_power_cap": 1, "gpu_idle": 0}, {"corrected": 7, "uncorrected": 0})  # fmt: skip
    sampler.metric_data([first], base)
    later = GpuReading(2, "GPU-abc", "NVIDIA A100", nvlink_tx_kib=1010, nvlink_rx_kib=5000, ecc={"corrected": 9})
    data = {md.metric.name: md.points for md in sampler.metric_data([later], base)}
    tx, rx = data[n.GPU_NVLINK_IO.name]
    assert tx.attributes == {"run": "r", "rank": "3", "gpu": "2", "uuid": "GPU-abc", "model": "NVIDIA A100", "host": "node-a", "direction": "transmit"}
    assert (tx.value, rx.value) == (10 * 1024, 0)
    assert [p.value for p in data[n.GPU_ECC_ERRORS.name]] == [2]
    assert n.GPU_UTILIZATION.name not in data  # absent in that reading: no series, not a zero
    full = {md.metric.name: md.points for md in NvmlSampler("node-a").metric_data([first], base)}
    assert full[n.GPU_POWER.name][0].value == 250.0 and full[n.GPU_SM_CLOCK.name][0].value == 1.41e9
    assert {p.attributes["reason"]: p.value for p in full[n.GPU_THROTTLED.name]} == {"sw_power_cap": 1, "gpu_idle": 0}
    for name, points in full.items():
        metric = next(m for m in n.SYSTEM_METRICS if m.name == name)
        assert all(tuple(p.attributes) == metric.attributes for p in points)


def test_cuda_devices_map_to_nvml_by_uuid_then_pci_address():
    nvml = [("GPU-aaaa-1", (0, 0x18, 0)), ("GPU-bbbb-2", (0, 0x3B, 0)), ("GPU-cccc-3", (0, 0x86, 0))]
    assert match_device("bbbb-2", None, nvml) == 1  # torch prints UUIDs without "GPU-"
    assert match_device("GPU-CCCC-3", (0, 0x18, 0), nvml) == 2  # the UUID wins over the address
    assert match_device(None, (0, 0x86, 0), nvml) == 2
    assert match_device("MIG-1234", None, nvml) is None


def test_node_count_from_the_launcher():
    assert node_count({"GROUP_WORLD_SIZE": "4", "WORLD_SIZE": "32", "LOCAL_WORLD_SIZE": "8"}, 32) == 4
    assert node_count({"SLURM_NNODES": "3"}, 24) == 3
    assert node_count({"SLURM_STEP_NUM_NODES": "2", "SLURM_NNODES": "3"}, None) == 2
    assert node_count({"LOCAL_WORLD_SIZE": "8"}, 16) == 2
    assert node_count({"WORLD_SIZE": "6", "LOCAL_WORLD_SIZE": "4"}, None) is None  # uneven: unknown
    assert node_count({}, 8) is None


def test_nvml_start_reports_why_instead_of_raising():
    sampler = NvmlSampler("node-a")
    reason = sampler.start()  # on this CPU machine: NVML's library is not installed
    sampler.shutdown()
    assert reason is None or "NVML" in reason  # why, for the one INFO line
    if not os.path.exists("/dev/nvidiactl"):  # no NVIDIA driver on this machine at all
        assert reason is not None


def test_counters_from_raw_readings_never_go_back():
    d = Deltas()
    assert [d.feed("x", v) for v in (100, 150, 150, 20, 50)] == [0, 50, 50, 50, 80]


# ------------------------------------------------------------------------------------------ GPU
def _nvidia_smi() -> dict[str, dict[str, str]]:
    fields = "index,uuid,name,memory.total,memory.used,temperature.gpu,power.draw,clocks.sm"
    text = subprocess.run(
        ["nvidia-smi", f"--query-gpu={fields}", "--format=csv,noheader,nounits"], capture_output=True, text=True, check=True
    ).stdout
    rows = [dict(zip(fields.split(","), (v.strip() for v in line.split(",")))) for line in text.strip().splitlines()]
    return {row["uuid"]: row for row in rows}


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU and NVML (none on this machine)")
def test_nvml_readings_agree_with_nvidia_smi(fake_pg, instrumented):
    torch.cuda.set_device(0)
    block = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    health.reset()
    instrumented(system_interval=0.2)
    comp = _system()
    points = wait_for(lambda: (p := _points(comp)).get(n.GPU_MEMORY_USED.name) and p, 30, what="GPU points")
    smi = _nvidia_smi()
    (used,) = points[n.GPU_MEMORY_USED.name]
    labels = used.attributes
    row = smi[labels["uuid"]]
    assert labels["gpu"] == row["index"] and labels["model"] == row["name"] and labels["host"] == socket.gethostname()
    mib = 1 << 20
    assert abs(_value(points, n.GPU_MEMORY_TOTAL.name) - float(row["memory.total"]) * mib) <= 0.01 * float(row["memory.total"]) * mib
    assert abs(used.value - float(row["memory.used"]) * mib) <= max(0.1 * used.value, 1 << 30)
    assert abs(_value(points, n.GPU_TEMPERATURE.name) - float(row["temperature.gpu"])) <= 5
    if row["power.draw"] not in ("[N/A]", "[Not Supported]"):
        assert abs(_value(points, n.GPU_POWER.name) - float(row["power.draw"])) <= max(0.3 * float(row["power.draw"]), 30)
    assert 0.5 <= _value(points, n.GPU_SM_CLOCK.name) / (float(row["clocks.sm"]) * 1e6) <= 2.0
    assert 0.0 <= _value(points, n.GPU_UTILIZATION.name) <= 1.0
    (allocated,) = points[n.CUDA_ALLOCATED.name]
    assert allocated.attributes["device"] == "0" and allocated.value == torch.cuda.memory_allocated(0) >= block.numel()
    resource = runtime.current().pipeline.outbox.resource
    assert resource[n.GPU_MODELS] == [torch.cuda.get_device_properties(0).name]
    assert resource[n.GPU_COUNT] == torch.cuda.device_count() and resource[n.CUDA_VERSION] == torch.version.cuda
    assert resource[n.NCCL_VERSION] == ".".join(str(x) for x in torch.cuda.nccl.version())
    otel_torchdist.uninstrument()
    assert health.errors() == {}
    del block


def test_a_loader_read_inside_another_loaders_fetch_is_one_wait(fake_pg, instrumented):
    """A dataset that streams from a DataLoader of its own: the outer fetch is the batch, timed once (the
    inner fetches happen inside it; counted as well, the data time was counted twice)."""
    from torch.utils.data import DataLoader, IterableDataset

    from otel_torchdist.capture import dataloader as capture

    class Streaming(IterableDataset):
        def __iter__(self):
            yield from DataLoader(list(range(4)), batch_size=None)

    instrumented(system_interval=3600)  # the sampler is on (waits timed) and folds nothing meanwhile
    assert capture.TIMED[0]
    capture.WAITS.clear()
    assert len(list(DataLoader(Streaming(), batch_size=None))) == 4
    assert len(capture.WAITS) == 4  # the inner loader's four fetches are inside them
