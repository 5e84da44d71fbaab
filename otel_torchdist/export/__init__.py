"""Where telemetry goes: OTLP over the network, the run folder, Prometheus, the console."""
