"""``TorchDistributedInstrumentor``: the opentelemetry-instrumentation entry point.

Registered in the ``opentelemetry_instrumentor`` entry-point group, so ``opentelemetry-instrument`` finds
it; ``otel_torchdist.instrument()`` is the same thing as a function. Idempotent: a second ``instrument()``
warns and changes nothing; ``uninstrument()`` restores every patched attribute to the identical original
object and flushes telemetry.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from opentelemetry.instrumentation.instrumentor import BaseInstrumentor
from opentelemetry.metrics import MeterProvider
from opentelemetry.trace import TracerProvider

from . import config as _config
from . import runtime as _runtime
from .export import providers as _providers
from .package import _instruments


class TorchDistributedInstrumentor(BaseInstrumentor):
    def instrumentation_dependencies(self) -> Collection[str]:
        return _instruments

    def _instrument(self, **kwargs: Any) -> None:
        tracer_provider = kwargs.pop("tracer_provider", None)
        meter_provider = kwargs.pop("meter_provider", None)
        _providers.check("tracer_provider", tracer_provider, TracerProvider)
        _providers.check("meter_provider", meter_provider, MeterProvider)
        cfg = _config.load(kwargs)
        if cfg.disabled:
            return
        rt = _runtime.Runtime(cfg, tracer_provider, meter_provider)
        try:
            rt.start()
        except BaseException:
            rt.close(restore=True)
            raise
        _runtime.install(rt)

    def _uninstrument(self, **kwargs: Any) -> None:
        rt = _runtime.remove()
        if rt is not None:
            rt.close(restore=True)
