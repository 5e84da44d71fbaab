"""Zero code: ``opentelemetry-instrument torchrun --nproc_per_node=2 train.py`` with opentelemetry-distro,
the launch line the README gives, end to end. The distro sets global SDK providers from the standard
variables in every Python process of the job; the workers' telemetry goes through them to a real OTLP/HTTP
receiver, the per-rank /metrics stays up (the distro's OTEL_METRICS_EXPORTER=otlp does not turn it off), and
torchrun's launcher is not instrumented (no run of its own, no second summary)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from otel_torchdist import names as n

from .harness import REPO, free_port, wait_for
from .test_faults_export import OtlpHttpReceiver
from otel_torchdist.export.prometheus_names import prometheus_name

BIN = os.path.dirname(sys.executable)


def _attributes(kvs) -> dict:
    from google.protobuf.json_format import MessageToDict

    return {kv.key: next(iter(MessageToDict(kv.value).values())) for kv in kvs}


@pytest.mark.skipif(not os.path.exists(os.path.join(BIN, "opentelemetry-instrument")), reason="opentelemetry-distro is not installed")
def test_opentelemetry_instrument_with_torchrun_instruments_the_workers(tmp_path):
    from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    rx = OtlpHttpReceiver()
    out, runs = tmp_path / "out", tmp_path / "runs"
    out.mkdir()
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "TORCHELASTIC_"))},
        "PYTHONPATH": REPO + os.pathsep + os.environ.get("PYTHONPATH", ""),
        "OTEL_SERVICE_NAME": "zero-code",
        "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
        "OTEL_EXPORTER_OTLP_ENDPOINT": rx.endpoint,
        "OTEL_LOGS_EXPORTER": "none",
        "OTEL_METRIC_EXPORT_INTERVAL": "500",
        "OTEL_EXPORTER_PROMETHEUS_PORT": str(free_port()),
        "OTEL_TORCHDIST_RUN_DIR": str(runs),
        "OTEL_TORCHDIST_TRACE_EVERY_STEPS": "1",
    }
    cmd = [os.path.join(BIN, "opentelemetry-instrument"), os.path.join(BIN, "torchrun"), "--nproc_per_node=2",
           f"--master_port={free_port()}", os.path.join(REPO, "tests", "zero_code_train.py"), str(out)]  # fmt: skip
    try:
        done = subprocess.run(cmd, env=env, cwd=str(tmp_path), capture_output=True, text=True, timeout=240)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        wait_for(lambda: any(r["path"] == "/v1/metrics" for r in rx.requests), 10, what="metrics at the receiver")
    finally:
        rx.stop()

    spans, metric_ranks = [], set()
    for req in list(rx.requests):
        if req["path"] == "/v1/traces":
            for rs in ExportTraceServiceRequest.FromString(req["body"]).resource_spans:
                resource = _attributes(rs.resource.attributes)
                spans += [(resource, n.span_base_name(s.name), _attributes(s.attributes)) for ss in rs.scope_spans for s in ss.spans]
        elif req["path"] == "/v1/metrics":
            for rm in ExportMetricsServiceRequest.FromString(req["body"]).resource_metrics:
                for sm in rm.scope_metrics:
                    for m in sm.metrics:
                        if m.name == n.COLLECTIVE_CALLS.name:
                            metric_ranks |= {_attributes(p.attributes)[n.M_RANK] for p in m.sum.data_points}
    collectives = [(res, attrs) for res, name, attrs in spans if name == "allreduce" or name == "all_reduce"]
    assert {attrs[n.RANK] for _, attrs in collectives} == {"0", "1"}, "both workers' DDP all-reduces"
    assert all(res["service.name"] == "zero-code" for res, _ in collectives)  # the distro's Resource
    assert metric_ranks == {"0", "1"}
    for rank in range(2):
        scraped = (out / f"scrape.rank{rank}.txt").read_text()
        assert f'{prometheus_name(n.COLLECTIVE_CALLS)}{{' in scraped and f'rank="{rank}"' in scraped
    # One run, the workers': the launcher made none and said nothing.
    assert len(os.listdir(runs)) == 1, os.listdir(runs)
    assert done.stderr.count("otel-torchdist summary") == 1, done.stderr[-3000:]


@pytest.mark.parametrize(
    "argv,launcher",
    [
        (["/usr/bin/python3", "/usr/local/bin/torchrun", "--nproc_per_node=2", "train.py"], True),
        (["python", "-m", "torch.distributed.run", "--nproc_per_node=2", "train.py"], True),
        (["python", "-um", "torch.distributed.launch", "--use-env", "train.py"], True),
        (["python", "-mtorch.distributed.run", "train.py"], True),
        (["python", "-X", "dev", "-m", "torch.distributed.run", "t.py"], True),
        (["python", "-W", "ignore", "/venv/lib/site-packages/torch/distributed/run.py", "t.py"], True),
        (["C:\\py\\python.exe", "C:\\py\\Scripts\\torchrun-script.py"], True),
        (["python", "train.py", "torchrun"], False),  # a worker, whatever its arguments say
        (["python", "-m", "tests.launcher", "x"], False),
        (["python", "-c", "from multiprocessing.resource_tracker import main; main(5)"], False),
        (["python", "-u", "torchrun_helper.py"], False),
        (["python"], False),
    ],
)
def test_torchs_launcher_is_told_from_the_command_line(argv, launcher):
    from otel_torchdist.instrumentor import torch_launcher

    assert torch_launcher(argv) is launcher


def test_a_process_that_never_joins_a_process_group_leaves_no_run_and_no_summary(instrumented, capsys):
    """What a job's helper processes do under opentelemetry-instrument (the resource tracker, a spawned
    DataLoader worker): instrumented, they capture nothing, and must not write into the workers' run."""
    import otel_torchdist

    folder = instrumented(summary="rank0")
    otel_torchdist.uninstrument()
    assert not os.path.exists(folder)
    assert "otel-torchdist summary" not in capsys.readouterr().err
