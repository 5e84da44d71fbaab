"""The library range this instrumentation supports (read by opentelemetry-instrumentation)."""

_instruments = ("torch >= 2.6",)
