"""Where a rank's telemetry goes, opened once its identity is known: the run folder, the providers (given,
global or the library's own), the span and metric sinks, the meter bridge, the node's hand-over and the
Prometheus endpoint; and their end."""

from __future__ import annotations

import os
import tempfile
from typing import Any

from .. import health
from .. import names as n
from ..config import Config
from ..drain.pipeline import Pipeline
from ..export import node as _node
from ..export import otlp
from ..export import providers as _providers
from ..export import sinks as _sinks
from ..export.otel_metrics import MeterBridge
from ..export.otel_spans import ProviderSampler, TracerSink
from ..export.prometheus import PrometheusEndpoint
from ..identity import Identity, resource_attributes, sanitize
from . import process


def write_json(folder: str | None, name: str, doc: Any) -> None:
    """A whole JSON file in the run folder (none: nothing), or a counted error."""
    if not folder:
        return
    try:
        _sinks.write_json_whole(os.path.join(folder, name), doc, indent=1)
    except OSError as exc:
        health.error("run_folder", f"cannot write {name} in the run folder", exc)


class Outlets:
    def __init__(self, cfg: Config, pipeline: Pipeline, given: tuple[Any, Any]) -> None:
        self.cfg = cfg
        self.pipeline = pipeline
        self.given = given  # instrument(tracer_provider=, meter_provider=)
        self.folder: str | None = None
        self.providers: _providers.Providers | None = None
        self.meter: MeterBridge | None = None
        self.prometheus: PrometheusEndpoint | None = None
        self.node_reader: _node.NodeReader | None = None
        self.hand_over: _node.HandOver | None = None
        self.destinations: list[str] = []  # one line each, for the announcement and the summary

    def open(self, ident: Identity, run_dir_ok: bool, extra_resource: dict[str, Any]) -> None:
        cfg, pipeline = self.cfg, self.pipeline
        folder = os.path.join(cfg.run_dir, ident.run_id)
        if run_dir_ok:
            try:
                os.makedirs(folder, exist_ok=True)
                self.folder = folder
            except OSError as exc:
                health.error("run_folder", f"cannot create the run folder {folder}", exc)
        resource = _providers.own_resource(resource_attributes(ident, cfg.service_name, extra_resource))
        by_node = cfg.metrics_aggregation == "node" and bool(cfg.resolved_metrics_exporters())
        labels = {n.M_RUN: ident.run_id}
        if cfg.metrics_rank_label and not by_node:
            labels[n.M_RANK] = str(ident.rank)
        providers = self.providers = _providers.choose(*self.given, global_meter=cfg.global_meter_provider)
        span_sinks, metric_sinks = _sinks.build(
            cfg, folder, ident.rank, traces=providers.tracer_provider is None, metrics=providers.meter_provider is None,
            copy=self.folder is not None,
        )
        # Exporters installed for the SDK that OTEL_*_EXPORTER names (a vendor's): through SDK providers of
        # the library's own, with this rank's resource.
        providers = self.providers = _providers.with_installed_exporters(cfg, providers, resource)
        if providers.tracer_provider is not None or providers.meter_provider is not None:
            process.exit_before_providers()
        if providers.tracer_provider is not None:
            scope = {n.RANK: ident.rank, n.RUN_ID: ident.run_id, n.WORLD_SIZE: ident.world_size}
            span_sinks.append(TracerSink(providers.tracer_provider, providers.tracer_origin, scope, providers.owned[0]))
            pipeline.sampler = ProviderSampler(providers.tracer_provider)
        exporting = True
        if by_node:
            exporting, metric_sinks = self._join_node(ident, metric_sinks)
        traced = cfg.traces_rank(ident.rank)
        if not traced:
            pipeline.stop_tracing()
        self.destinations = [f"traces: {s.describe()}" + ("" if traced else " (warnings only: not in trace_ranks)") for s in span_sinks]
        self.destinations += [f"metrics: {s.describe()}" for s in metric_sinks]
        if providers.meter_provider is not None:
            self.meter = MeterBridge(providers.meter_provider, providers.meter_origin, pipeline.bounds, labels, providers.owned[1])
            self.destinations.append(f"metrics: {self.meter.describe()}")
        if exporting and "prometheus" in cfg.resolved_metrics_exporters():
            self._start_prometheus(ident)
        write_json(self.folder, f"resource.rank{ident.rank}.json", resource)
        otlp.name_spans_for_rank(ident.rank)
        pipeline.set_destination(resource, labels, span_sinks, metric_sinks, otlp.SPAN_ENCODERS)
        if self.meter is not None:
            pipeline.bridge_metrics(self.meter)

    def _join_node(self, ident: Identity, metric_sinks: list) -> tuple[bool, list]:
        """metrics_aggregation="node": local rank 0 exports the node's metrics, read from the hand-over
        files the others write instead of exporting. Returns (exports, this rank's metric sinks)."""
        node_name = self.cfg.node_name or sanitize(ident.host)
        base = self.folder or os.path.join(tempfile.gettempdir(), f"otel-torchdist-{ident.run_id}")
        where = _node.directory(base, node_name)
        if ident.local_rank == 0:
            self.node_reader = _node.NodeReader(where, ident.rank, node_name)
            self.pipeline.node_merge = self.node_reader.merge_with
            return True, metric_sinks
        self.hand_over = _node.HandOver(where, ident.rank)
        self.pipeline.outbox.metric_interval = self.cfg.node_metrics_interval
        return False, [self.hand_over]

    def _start_prometheus(self, ident: Identity) -> None:
        cfg = self.cfg
        endpoint = PrometheusEndpoint(self.pipeline.metric_data)
        port = cfg.prometheus_port + ident.local_rank if cfg.prometheus_port else 0
        try:
            endpoint.start(cfg.prometheus_host, port if port <= 65535 else 0)
        except Exception as exc:
            health.error("prometheus", f"cannot serve /metrics on {cfg.prometheus_host} (prometheus_host, OTEL_EXPORTER_PROMETHEUS_HOST)", exc)
            return
        self.prometheus = endpoint
        self.destinations.append(f"metrics: Prometheus {endpoint.url}")
        if self.folder:
            try:
                endpoint.write_target(
                    os.path.join(self.folder, f"prometheus-targets.rank{ident.rank}.json"),
                    # A node's metrics carry no rank: the target must not add one.
                    {"run": ident.run_id} if self.node_reader else {"run": ident.run_id, "rank": str(ident.rank)},
                )
            except OSError as exc:
                health.error("run_folder", "cannot write the Prometheus target file", exc)

    def finish_node(self, budget: float) -> None:
        """The node's last figures: the ranks hand over their final points before their own flush (which
        may wait on a slow span backend), and the exporting rank waits for them, bounded, before its own."""
        try:
            if self.hand_over is not None:
                self.pipeline.drain()
                self.hand_over.finish(self.pipeline.metric_data())
            elif self.node_reader is not None:
                self.node_reader.wait_final(budget / 2)
        except Exception as exc:
            health.error("node_metrics", "could not finish the node's metrics", exc)

    def close_meter(self) -> None:
        """After the pipeline's last export: the provider's instruments keep the final totals."""
        if self.meter is not None:
            self.meter.close(self.pipeline.metric_data())

    def stop_prometheus(self) -> None:
        if self.prometheus is not None:
            self.prometheus.stop()
