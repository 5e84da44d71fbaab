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
    """``option`` (passed in), ``global`` (the application's) or ``own``."""
    meter_origin: str = "own"


def _placeholder(provider: Any) -> bool:
    """The API's stand-in until an application sets a provider (the proxy ``get_*_provider()`` returns then).
    An explicit NoOp provider is the application's choice, and honoured."""
    if isinstance(provider, (trace_api.NoOpTracerProvider, metrics_api.NoOpMeterProvider)):
        return False
    # The proxies are classes of the API package itself; only the trace one is public, so both are told apart
    # by where they are defined rather than by importing the metrics API's private proxy class.
    return isinstance(provider, trace_api.ProxyTracerProvider) or type(provider).__module__.startswith("opentelemetry.metrics")


def choose(tracer_provider: Any = None, meter_provider: Any = None) -> Providers:
    """The providers to use now (call it once the process knows it will export: at its first process group)."""
    tracer_origin = meter_origin = "option"
    if tracer_provider is None:
        tracer_provider, tracer_origin = trace_api.get_tracer_provider(), "global"
        if _placeholder(tracer_provider):
            tracer_provider, tracer_origin = None, "own"
    if meter_provider is None:
        meter_provider, meter_origin = metrics_api.get_meter_provider(), "global"
        if _placeholder(meter_provider):
            meter_provider, meter_origin = None, "own"
    return Providers(tracer_provider, meter_provider, tracer_origin, meter_origin)


def check(name: str, value: Any, api_class: type) -> None:
    """Refuse at ``instrument()`` what is not a provider: a mistake there would otherwise surface as lost
    telemetry minutes later, on another thread."""
    if value is not None and not isinstance(value, api_class) and not callable(getattr(value, _GETTER[name], None)):
        raise TypeError(f"{name} must be an OpenTelemetry {api_class.__name__}, got {type(value).__name__}")


_GETTER = {"tracer_provider": "get_tracer", "meter_provider": "get_meter"}


def force_flush(provider: Any, timeout: float) -> bool:
    """The provider's ``force_flush`` (SDK providers have one), waited for ``timeout`` seconds at most: its
    exporters are the application's, and one stuck on a dead backend must not hold the process's exit longer
    than the library's own flush may take. False when it failed or is still running."""
    flush = getattr(provider, "force_flush", None)
    if not callable(flush) or timeout <= 0:
        return not callable(flush)
    result: list[bool] = []

    def run() -> None:
        try:
            result.append(bool(flush(max(1, int(timeout * 1000)))))
        except Exception:
            result.append(False)

    thread = threading.Thread(target=run, name="otel-torchdist-provider-flush", daemon=True)
    thread.start()
    thread.join(timeout)
    return bool(result and result[0])


def describe(provider: Any, origin: str) -> str:
    kind = type(provider).__module__.split(".")[0] + "." + type(provider).__qualname__
    return f"the {'global' if origin == 'global' else 'given'} {kind}"
