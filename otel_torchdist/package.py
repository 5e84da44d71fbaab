"""The library range this instrumentation supports (read by opentelemetry-instrumentation)."""

_instruments = ("torch >= 2.6.0a0",)  # NVIDIA's containers: 2.6.0a0+<commit>, before 2.6
