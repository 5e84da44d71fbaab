"""The per-rank Prometheus ``/metrics`` endpoint.

It serves the same exporter-neutral points as the OTLP and file exporters, named by
``prometheus_names.prometheus_name`` (the OpenTelemetry Collector's translation, so scraping a rank directly
and scraping a Collector give the same series). Histogram buckets carry the latest sampled span
as an OpenMetrics exemplar (labels ``trace_id``, ``span_id``), which Prometheus keeps when run with
``--enable-feature=exemplar-storage`` and Grafana turns into a link to the Jaeger trace.

Each rank listens on base port + local rank. A taken port is not fatal: the rank warns, binds a free port
instead, and writes the address it got into the run folder (``prometheus-targets.rank<R>.json``, in
Prometheus' file service-discovery format), so nothing has to be guessed.
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Callable
from typing import Any

from prometheus_client.core import CollectorRegistry, CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.exposition import start_http_server
from prometheus_client.samples import Exemplar

from .. import health
from ..telemetry import MetricData
from .prometheus_names import prometheus_name
from .sinks import write_json_whole

_log = logging.getLogger("otel_torchdist")

def _le(bound: float) -> str:
    return "+Inf" if bound == float("inf") else repr(float(bound))


def families(metrics: list[MetricData]):
    """prometheus_client metric families for exporter-neutral ``metrics``."""
    for md in metrics:
        m = md.metric
        name = prometheus_name(m)
        if not md.points:
            continue
        label_names = list(md.points[0].attributes)
        if m.instrument == "histogram":
            fam = HistogramMetricFamily(name, m.description, labels=label_names)
            for pt in md.points:
                cumulative = 0
                buckets = []
                exemplars = {}
                for value, t_ns, trace_id, span_id in pt.exemplars:
                    exemplars[_bucket_index(pt.bounds, value)] = Exemplar(
                        {"trace_id": f"{trace_id:032x}", "span_id": f"{span_id:016x}"}, value, t_ns / 1e9
                    )
                for i, count in enumerate(pt.bucket_counts):
                    cumulative += count
                    le = _le(pt.bounds[i]) if i < len(pt.bounds) else "+Inf"
                    ex = exemplars.get(i)
                    buckets.append((le, cumulative, ex) if ex is not None else (le, cumulative))
                fam.add_metric([str(pt.attributes[k]) for k in label_names], buckets, pt.sum)
        elif m.instrument == "counter":
            fam = CounterMetricFamily(name[: -len("_total")], m.description, labels=label_names)
            for pt in md.points:
                fam.add_metric([str(pt.attributes[k]) for k in label_names], pt.value)
        else:
            fam = GaugeMetricFamily(name, m.description, labels=label_names)
            for pt in md.points:
                fam.add_metric([str(pt.attributes[k]) for k in label_names], pt.value)
        yield fam


def _bucket_index(bounds: tuple[float, ...], value: float) -> int:
    import bisect

    return bisect.bisect_left(bounds, value)


class _Collector:
    def __init__(self, source: Callable[[], list[MetricData]]) -> None:
        self._source = source

    def collect(self):
        try:
            metrics = self._source()
        except Exception as exc:
            health.error("prometheus", "could not build /metrics", exc)
            return
        yield from families(metrics)


class PrometheusEndpoint:
    def __init__(self, source: Callable[[], list[MetricData]]) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(_Collector(source))
        self.server: Any = None
        self.thread: Any = None
        self.host = ""
        self.port = 0

    def start(self, host: str, port: int) -> None:
        try:
            self.server, self.thread = start_http_server(port, addr=host, registry=self.registry)
        except OSError as exc:
            if port == 0:
                raise
            self.server, self.thread = start_http_server(0, addr=host, registry=self.registry)
            _log.warning(
                "otel-torchdist: Prometheus port %s:%d is taken (%s); serving /metrics on port %d instead",
                host,
                port,
                exc.strerror or exc,
                self.server.server_port,
            )
        self.host = host
        self.port = self.server.server_port

    @property
    def url(self) -> str:
        return f"http://{self.scrape_host()}:{self.port}/metrics"

    def scrape_host(self) -> str:
        """The host part of this server's address, as URLs and Prometheus targets write it."""
        if self.host in ("", "0.0.0.0", "::"):
            return socket.gethostname()
        return f"[{self.host}]" if ":" in self.host else self.host  # an IPv6 address: bracketed

    def write_target(self, path: str, labels: dict[str, str]) -> None:
        """A file-SD target file Prometheus can read: ``file_sd_configs: [{files: [".../prometheus-targets.*.json"]}]``."""
        write_json_whole(path, [{"targets": [f"{self.scrape_host()}:{self.port}"], "labels": labels}])

    def stop(self) -> None:
        if self.server is not None:
            try:
                self.server.shutdown()
                self.server.server_close()
            except Exception:
                pass
            self.server = None
