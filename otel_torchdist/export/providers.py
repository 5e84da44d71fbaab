"""Which OpenTelemetry providers the library's spans and metrics go through.

In order: the providers passed as ``tracer_provider=`` / ``meter_provider=`` (to ``instrument()`` or the
instrumentor, the convention of every opentelemetry-python-contrib instrumentation); else the application's
global providers, when it set them (its own SDK set-up, ``opentelemetry-instrument``'s distro, a vendor's);
else none, and the library's own pipeline, configured from the standard ``OTEL_*`` variables, exports
(the run folder by default, OTLP when an endpoint is set).

Each signal is chosen on its own: an application that set only a global TracerProvider gets its spans there
and the library's own metric exporters.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

from opentelemetry import metrics as metrics_api
from opentelemetry import trace as trace_api


@dataclass(frozen=True)
class Providers:
    tracer_provider: Any = None
    """The TracerProvider spans go through, or None for the library's own span exporters."""
    meter_provider: Any = None
    """The MeterProvider metrics go through, or None for the library's own metric exporters."""
    tracer_origin: str = "own"
    """Where the TracerProvider comes from, for the start-up line: ``the given ...``, ``the global ...``, or
    the installed exporters it was made for."""
    meter_origin: str = "own"
    owned: tuple[bool, bool] = (False, False)
    """Whether the library made the TracerProvider / the MeterProvider (and shuts it down)."""


def _placeholder(provider: Any) -> bool:
    """The API's stand-in until an application sets a provider (the proxy ``get_*_provider()`` returns then).
    An explicit NoOp provider is the application's choice, and honoured."""
    if isinstance(provider, (trace_api.NoOpTracerProvider, metrics_api.NoOpMeterProvider)):
        return False
    # The proxies are classes of the API package itself; only the trace one is public, so both are told apart
    # by where they are defined rather than by importing the metrics API's private proxy class.
    return isinstance(provider, trace_api.ProxyTracerProvider) or type(provider).__module__.startswith("opentelemetry.metrics")


def choose(tracer_provider: Any = None, meter_provider: Any = None, global_meter: bool = True) -> Providers:
    """The providers to use now (call it once the process knows it will export: at its first process group).
    ``global_meter``: look for the application's global MeterProvider too (``global_meter_provider``)."""
    tracer_origin = meter_origin = "given"
    if tracer_provider is None:
        tracer_provider, tracer_origin = trace_api.get_tracer_provider(), "global"
        if _placeholder(tracer_provider):
            tracer_provider, tracer_origin = None, "own"
    if meter_provider is None:
        meter_provider, meter_origin = metrics_api.get_meter_provider(), "global"
        if not global_meter or _placeholder(meter_provider):
            meter_provider, meter_origin = None, "own"
    return Providers(tracer_provider, meter_provider, _origin(tracer_provider, tracer_origin), _origin(meter_provider, meter_origin))


def _origin(provider: Any, origin: str) -> str:
    if provider is None:
        return origin
    return f"the {origin} {type(provider).__module__.split('.')[0]}.{type(provider).__qualname__}"


def check(name: str, value: Any, api_class: type) -> None:
    """Refuse at ``instrument()`` what is not a provider: a mistake there would otherwise surface as lost
    telemetry minutes later, on another thread."""
    if value is not None and not isinstance(value, api_class) and not callable(getattr(value, _GETTER[name], None)):
        raise TypeError(f"{name} must be an OpenTelemetry {api_class.__name__}, got {type(value).__name__}")


_GETTER = {"tracer_provider": "get_tracer", "meter_provider": "get_meter"}


def own_resource(attributes: dict[str, Any]) -> dict[str, Any]:
    """This rank's resource for the library's own exporters: ``attributes`` over what the SDK's resource
    detectors find (``OTEL_EXPERIMENTAL_RESOURCE_DETECTORS``: host, process, os...). The SDK's own defaults
    (service name, instance id, ``telemetry.sdk.*``) are not taken: the library sets the first two, and the
    spans are not the SDK's."""
    from opentelemetry.sdk.resources import Resource

    try:
        detected = Resource.create().attributes
    except Exception:  # a detector that fails: the SDK logs it; the library's attributes are enough
        detected = {}
    skip = ("service.name", "service.instance.id")
    out = {k: v for k, v in detected.items() if k not in skip and not k.startswith("telemetry.sdk.")}
    out.update(attributes)
    return out


def with_installed_exporters(cfg: Any, providers: Providers, resource: dict[str, Any]) -> Providers:
    """Add SDK providers of the library's own for the OTEL_*_EXPORTER names that are exporters installed for
    the SDK rather than built in (a vendor's, zipkin...), where the signal has no provider yet."""
    from importlib.metadata import entry_points

    from ..config import EXPORTER_GROUPS, METRICS_EXPORTERS, TRACES_EXPORTERS

    def installed(field: str, builtin: tuple[str, ...]) -> list[Any]:
        names = [x for x in (getattr(cfg, field) or ()) if x not in builtin]
        out = []
        for name in names:
            for ep in entry_points(group=EXPORTER_GROUPS[field], name=name):
                out.append((name, ep.load()()))
                break
        return out

    tracer_provider, tracer_origin = providers.tracer_provider, providers.tracer_origin
    meter_provider, meter_origin = providers.meter_provider, providers.meter_origin
    if tracer_provider is None and (span_exporters := installed("traces_exporter", TRACES_EXPORTERS)):
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor

        tracer_provider = TracerProvider(resource=Resource(resource), shutdown_on_exit=False)
        tracer_origin = f"{', '.join(name for name, _ in span_exporters)} (installed for the OpenTelemetry SDK)"
        for _, exporter in span_exporters:
            tracer_provider.add_span_processor(
                BatchSpanProcessor(exporter, max_queue_size=cfg.span_queue_size, schedule_delay_millis=cfg.span_schedule_delay * 1000,
                                   max_export_batch_size=min(cfg.span_batch_size, cfg.span_queue_size))
            )  # fmt: skip
    if meter_provider is None and (metric_exporters := installed("metrics_exporter", METRICS_EXPORTERS)):
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
        from opentelemetry.sdk.resources import Resource

        readers = [PeriodicExportingMetricReader(e, export_interval_millis=cfg.metric_export_interval * 1000) for _, e in metric_exporters]
        meter_provider = MeterProvider(readers, resource=Resource(resource), shutdown_on_exit=False)
        meter_origin = f"{', '.join(name for name, _ in metric_exporters)} (installed for the OpenTelemetry SDK)"
    owned = (tracer_provider is not providers.tracer_provider, meter_provider is not providers.meter_provider)
    return Providers(tracer_provider, meter_provider, tracer_origin, meter_origin, owned)


def shutdown(provider: Any, timeout: float = 5.0) -> None:
    """Shut down a provider the library made, waiting ``timeout`` seconds at most (its exporter may be stuck)."""
    _bounded(provider.shutdown, timeout)


def force_flush(provider: Any, timeout: float) -> bool:
    """The provider's ``force_flush`` (SDK providers have one), waited for ``timeout`` seconds at most: its
    exporters are the application's, and one stuck on a dead backend must not hold the process's exit longer
    than the library's own flush may take. False when it failed or is still running."""
    flush = getattr(provider, "force_flush", None)
    if not callable(flush) or timeout <= 0:
        return not callable(flush)
    return bool(_bounded(lambda: flush(max(1, int(timeout * 1000))), timeout))


def _bounded(fn: Any, timeout: float) -> Any:
    """``fn()``'s result, or None when it failed or has not returned within ``timeout`` seconds (it goes on, on
    a daemon thread that the process's exit does not wait for)."""
    result: list[Any] = []

    def run() -> None:
        try:
            result.append(fn())
        except Exception:
            result.append(None)

    thread = threading.Thread(target=run, name="otel-torchdist-provider-call", daemon=True)
    thread.start()
    thread.join(max(timeout, 0.0))
    return result[0] if result else None
