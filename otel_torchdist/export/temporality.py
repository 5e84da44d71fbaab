"""The library's cumulative totals as deltas, for an OTLP backend that asks for them
(``OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE=delta`` or ``lowmemory``: the library's counters and
histograms are all synchronous instruments, delta under both). Gauges stay as they are. Each export reports what
happened since the one before (the first, since the start); a delta the backend did not get is not sent again,
as with the SDK's delta readers.
"""

from __future__ import annotations

from ..telemetry import TEMPORALITY_DELTA, HistogramPoint, MetricData, NumberPoint


class Delta:
    def __init__(self) -> None:
        self._last: dict[tuple, object] = {}
        self._since: int | None = None

    def __call__(self, data: list[MetricData], start_ns: int, now_ns: int) -> list[MetricData]:
        out = []
        since = self._since
        for md in data:
            if md.metric.instrument == "gauge":
                out.append(md)
                continue
            points = []
            for p in md.points:
                key = (md.metric.name, tuple(sorted(p.attributes.items())))
                last = self._last.get(key)
                self._last[key] = p
                if last is None:  # everything since the start is the first delta (min and max hold for it)
                    points.append(p)
                elif isinstance(p, HistogramPoint):
                    points.append(
                        HistogramPoint(
                            p.attributes, p.count - last.count, p.sum - last.sum,
                            [a - b for a, b in zip(p.bucket_counts, last.bucket_counts)], p.bounds,
                            exemplars=[e for e in p.exemplars if since is None or e[1] > since],
                        )  # fmt: skip
                    )
                else:
                    points.append(NumberPoint(p.attributes, p.value - last.value))
            out.append(MetricData(md.metric, points, md.start_ns if since is None else since, TEMPORALITY_DELTA))
        self._since = now_ns
        return out
