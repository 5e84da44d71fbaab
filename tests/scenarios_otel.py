"""Ranks whose training script runs OpenTelemetry itself: global SDK providers with exporters of its own
(JSON lines, not OTLP: what a vendor's exporter would be), then ``otel_torchdist.instrument()`` with no
options. Used by tests/test_providers_ranks.py."""

from __future__ import annotations

import json
import os
from typing import Any

import torch
import torch.distributed as dist

from otel_torchdist import names as n

SERVICE = "my-trainer"


class JsonSpans:
    """A SpanExporter that writes one JSON object per span."""

    def __init__(self, path: str) -> None:
        self.path = path

    def export(self, spans) -> Any:
        from opentelemetry.sdk.trace.export import SpanExportResult

        with open(self.path, "a") as f:
            for s in spans:
                f.write(
                    json.dumps(
                        {
                            "name": n.span_base_name(s.name),
                            "exported_name": s.name,
                            "trace": f"{s.context.trace_id:032x}",
                            "span": f"{s.context.span_id:016x}",
                            "parent": f"{s.parent.span_id:016x}" if s.parent else None,
                            "links": [[f"{link.context.trace_id:032x}", f"{link.context.span_id:016x}"] for link in s.links],
                            "start": s.start_time,
                            "end": s.end_time,
                            "attributes": dict(s.attributes),
                            "resource": dict(s.resource.attributes),
                        },
                        default=str,
                    )
                    + "\n"
                )
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        pass

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True


def _metric_exporter(path: str):
    from opentelemetry.sdk.metrics.export import MetricExporter, MetricExportResult

    class JsonMetrics(MetricExporter):
        def export(self, metrics_data, timeout_millis: float = 10_000, **kwargs) -> MetricExportResult:
            points = []
            for rm in metrics_data.resource_metrics:
                for sm in rm.scope_metrics:
                    for m in sm.metrics:
                        for p in m.data.data_points:
                            value = getattr(p, "value", None)
                            points.append({"name": m.name, "unit": m.unit, "attributes": dict(p.attributes),
                                           "value": value, "count": getattr(p, "count", None),
                                           "resource": dict(rm.resource.attributes)})  # fmt: skip
            with open(path, "a") as f:
                f.write(json.dumps(points) + "\n")
            return MetricExportResult.SUCCESS

        def force_flush(self, timeout_millis: float = 10_000) -> bool:
            return True

        def shutdown(self, timeout_millis: float = 30_000, **kwargs) -> None:
            pass

    return JsonMetrics()


def global_providers(rank: int, ws: int, port: int, out: str, args: dict) -> dict:
    """DDP for a few optimizer-closed steps (or explicit steps inside the script's own spans, ``user_spans``)."""
    from opentelemetry import metrics, trace
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    import otel_torchdist

    resource = Resource({"service.name": SERVICE})
    tp = TracerProvider(resource=resource)
    tp.add_span_processor(BatchSpanProcessor(JsonSpans(os.path.join(out, f"spans.rank{rank}.jsonl"))))
    reader = PeriodicExportingMetricReader(_metric_exporter(os.path.join(out, f"metrics.rank{rank}.jsonl")), 3_600_000)
    mp = MeterProvider(metric_readers=[reader], resource=resource)
    trace.set_tracer_provider(tp)
    metrics.set_meter_provider(mp)

    otel_torchdist.instrument(run_dir=os.path.join(out, "runs"), run_id="global", summary="none", trace_every_steps=1)
    dist.init_process_group("gloo", rank=rank, world_size=ws)
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(16, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    tracer = trace.get_tracer("my.training")
    steps = args.get("steps", 4)
    for i in range(1, steps + 1):
        if args.get("user_spans"):
            with tracer.start_as_current_span("iteration"), otel_torchdist.step(i):
                with tracer.start_as_current_span("my.forward"):
                    loss = model(torch.randn(8, 16)).sum()
                loss.backward()
                opt.step()
                opt.zero_grad()
        else:
            loss = model(torch.randn(8, 16)).sum()
            loss.backward()
            opt.step()
            opt.zero_grad()
    otel_torchdist.uninstrument()
    tp.shutdown()
    mp.shutdown()
    dist.destroy_process_group()
    return {"rank": rank}
