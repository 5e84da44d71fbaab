"""Per-node metrics (``metrics_aggregation="node"``): the ranks of a node hand their metric points to the
node's local rank 0, which exports them combined, labelled ``host`` instead of ``rank``.

The hand-over is one JSON file per rank in ``<run folder>/node-metrics/<node>/``, replaced atomically
every ``node_metrics_interval`` and once more, marked final, when the rank ends; the exporting rank reads
the files at each scrape and export. Files rather than a socket: nothing ever waits on another process,
and a rank that dies leaves its last counts in place, so the node's counters do not go back. A rank whose
process changes (an elastic restart counts from zero again) has its last counts kept and added.
"""

from __future__ import annotations

import bisect
import json
import logging
import os
import time
from collections.abc import Iterable
from typing import Any

from .. import health
from .. import names as n
from ..telemetry import HistogramPoint, MetricData, NumberPoint
from .sinks import Sink

# How a node's ranks combine into one point under metrics_aggregation="node", for points whose labels
# (rank dropped, host added) coincide. Counters and histograms not listed are summed: exact, since every
# rank uses the same bounds. Every gauge is listed (a test checks): "max" where the ranks measure one thing
# (the model, a GPU, the host) or where the worst rank is the news; "min" where the laggard is.
NODE_MERGE: dict[str, str] = {
    n.MODEL_PARAMETERS.name: "max",
    n.MODEL_PARAMETER_BYTES.name: "max",
    n.DDP_FORWARD_COMPUTE.name: "max",
    n.DDP_BACKWARD_COMPUTE.name: "max",
    n.DDP_BACKWARD_COMM.name: "max",
    n.DDP_BACKWARD_OVERLAP.name: "max",
    n.DDP_BUCKETS.name: "max",
    n.STEP_CURRENT.name: "min",
    n.STRAGGLER_SCORE.name: "max",
    n.STRAGGLER_SLOWEST.name: "max",
    n.COLLECTIVE_INFLIGHT_AGE.name: "max",
    n.COLLECTIVE_HANG_MISSING.name: "max",  # per missing rank: the highest hung sequence number any rank waits in
    n.GROUP_SEQ_STARTED.name: "max",
    n.GROUP_SEQ_COMPLETED.name: "min",
    n.TRAIN_LOSS.name: "mean",
    n.TRAIN_LR.name: "mean",
    n.TRAIN_SAMPLE_RATE.name: "sum",
    n.TRAIN_TOKEN_RATE.name: "sum",
    n.TRAIN_ETA.name: "max",
    n.GPU_UTILIZATION.name: "max",
    n.GPU_MEMORY_USED.name: "max",
    n.GPU_MEMORY_TOTAL.name: "max",
    n.GPU_POWER.name: "max",
    n.GPU_TEMPERATURE.name: "max",
    n.GPU_SM_CLOCK.name: "max",
    n.GPU_PCIE_THROUGHPUT.name: "max",
    n.GPU_NVLINK_IO.name: "max",
    n.GPU_THROTTLED.name: "max",
    n.GPU_ECC_ERRORS.name: "max",
    n.CUDA_ALLOCATED.name: "sum",
    n.CUDA_RESERVED.name: "sum",
    n.CUDA_PEAK.name: "sum",
    n.PROCESS_CPU_UTILIZATION.name: "sum",
    n.PROCESS_RSS.name: "sum",
    n.PROCESS_OPEN_FDS.name: "sum",
    n.HOST_NETWORK_IO.name: "max",
    n.AMP_GRAD_SCALE.name: "min",
}
NODE_MERGE_RULES = ("sum", "max", "min", "mean")


def node_merge(metric: n.Metric) -> str:
    return NODE_MERGE.get(metric.name, "sum")


_log = logging.getLogger("otel_torchdist")

_METRICS = {m.name: m for m in n.METRICS}
_PREFIX, _SUFFIX = "rank", ".json"
LEADER = "exporter.json"  # written by the node's exporting rank: the others check that someone reads them


def directory(folder: str, node: str) -> str:
    return os.path.join(folder, "node-metrics", node)


# ------------------------------------------------------------------------------------------ encoding
def encode(rank: int, final: bool, metrics: list[MetricData]) -> str:
    out = []
    for md in metrics:
        points: list[list[Any]] = []
        for p in md.points:
            if isinstance(p, HistogramPoint):
                points.append([p.attributes, p.count, p.sum, p.bucket_counts, list(p.bounds), p.min, p.max, p.exemplars])
            else:
                points.append([p.attributes, p.value])
        out.append({"name": md.metric.name, "points": points})
    return json.dumps({"rank": rank, "pid": os.getpid(), "final": final, "time": time.time(), "metrics": out})


def decode(doc: dict[str, Any]) -> list[MetricData]:
    """Points of one hand-over file; metrics this version does not know (another version) are skipped."""
    data = []
    for item in doc["metrics"]:
        metric = _METRICS.get(item["name"])
        if metric is None:
            continue
        if metric.instrument == "histogram":
            points: list[Any] = [
                HistogramPoint(a, c, s, list(b), tuple(bounds), lo, hi, [tuple(e) for e in ex])
                for a, c, s, b, bounds, lo, hi, ex in item["points"]
            ]
        else:
            points = [NumberPoint(a, v) for a, v in item["points"]]
        data.append(MetricData(metric, points))
    return data


# --------------------------------------------------------------------------------------------- merge
def merge(batches: Iterable[list[MetricData]], node: str) -> list[MetricData]:
    """One node's points from its ranks' points: ``rank`` dropped, ``host`` added, then every set of points
    with the same labels combined by the metric's rule (``node_merge``)."""
    found: dict[str, tuple[n.Metric, dict[tuple, list[Any]]]] = {}
    for data in batches:
        for md in data:
            slot = found.get(md.metric.name)
            if slot is None:
                slot = found[md.metric.name] = (md.metric, {})
            rule = node_merge(md.metric)
            acc = slot[1]
            for p in md.points:
                labels = {k: v for k, v in p.attributes.items() if k != n.M_RANK}
                labels[n.M_HOST] = node  # also over a GPU's or the host's own: one name for the node
                key = tuple(sorted(labels.items()))
                cur = acc.get(key)
                if isinstance(p, HistogramPoint):
                    if cur is None:
                        acc[key] = [HistogramPoint(labels, 0, 0.0, [0] * len(p.bucket_counts), tuple(p.bounds))]
                        cur = acc[key]
                    _add_histogram(cur[0], p, md.metric)
                elif cur is None:
                    acc[key] = [labels, p.value, 1]
                else:
                    _add_number(cur, p.value, rule)
    out = []
    for metric, acc in found.values():
        if metric.instrument == "histogram":
            points: list[Any] = [cur[0] for cur in acc.values()]
        else:
            mean = node_merge(metric) == "mean"
            points = [NumberPoint(labels, value / count if mean else value) for labels, value, count in acc.values()]
        out.append(MetricData(metric, points))
    return out


def _add_number(cur: list[Any], value: float, rule: str) -> None:
    if rule == "max":
        cur[1] = max(cur[1], value)
    elif rule == "min":
        cur[1] = min(cur[1], value)
    else:  # sum, and mean (divided by the count at the end)
        cur[1] += value
    cur[2] += 1


def _add_histogram(into: HistogramPoint, p: HistogramPoint, metric: n.Metric) -> None:
    if tuple(p.bounds) != into.bounds:
        # Only a rank running another version of the library could differ; its point cannot be summed.
        health.error("node_metrics", f"{metric.name}: a rank's bucket bounds differ from the node's; its point is left out")
        return
    into.count += p.count
    into.sum += p.sum
    into.bucket_counts = [a + b for a, b in zip(into.bucket_counts, p.bucket_counts)]
    if p.min is not None and (into.min is None or p.min < into.min):
        into.min = p.min
    if p.max is not None and (into.max is None or p.max > into.max):
        into.max = p.max
    if p.exemplars:
        latest = {bisect.bisect_left(into.bounds, e[0]): e for e in into.exemplars}
        for e in p.exemplars:
            i = bisect.bisect_left(into.bounds, e[0])
            if i not in latest or e[1] > latest[i][1]:
                latest[i] = e
        into.exemplars = [latest[i] for i in sorted(latest)]


def _cumulative_only(data: list[MetricData]) -> list[MetricData]:
    """The summed counters and histograms of a snapshot: what a rank's earlier process leaves to keep."""
    return [md for md in data if md.metric.instrument != "gauge" and node_merge(md.metric) == "sum"]


# ----------------------------------------------------------------------------------------- the ranks
class HandOver(Sink):
    """A metric sink for the ranks that do not export: writes their points for the node's exporting rank."""

    name = "node"
    grace = 60.0  # seconds without an exporting rank on the node before saying so

    def __init__(self, folder: str, rank: int) -> None:
        self.dir = folder
        self.rank = rank
        self.path = os.path.join(folder, f"{_PREFIX}{rank}{_SUFFIX}")
        self._last: list[MetricData] = []
        self._final = False
        self._since = time.monotonic()
        self._reader_seen = False

    def export_metrics(self, resource, metrics, start_ns, now_ns, timeout=None) -> bool:
        self._last = metrics
        return self._write()

    def finish(self, metrics: list[MetricData]) -> None:
        """The last hand-over: the exporting rank stops waiting for this rank once it reads it."""
        self._last = metrics
        self._final = True
        self._write()

    def shutdown(self) -> None:
        if not self._final:  # finish() did not run (it failed): still mark the last hand-over final
            self._final = True
            self._write()

    def _write(self) -> bool:
        final = self._final
        try:
            os.makedirs(self.dir, exist_ok=True)
            tmp = f"{self.path}.{os.getpid()}.tmp"
            with open(tmp, "w", encoding="utf-8") as f:
                f.write(encode(self.rank, final, self._last))
            os.replace(tmp, self.path)
        except Exception as exc:
            health.error("node_metrics", f"cannot hand this rank's metrics over in {self.dir}", exc)
            return False
        self._check_reader()
        return True

    def _check_reader(self) -> None:
        """Say once if no rank of this node exports (no LOCAL_RANK 0 here): these metrics reach no one."""
        if self._reader_seen:
            return
        self._reader_seen = os.path.exists(os.path.join(self.dir, LEADER))
        if not self._reader_seen and time.monotonic() - self._since > self.grace:
            self._reader_seen = True  # said once
            health.error("node_metrics", "no exporting rank on this node", quiet=True)
            _log.warning(
                "otel-torchdist: metrics_aggregation=node, but no rank with LOCAL_RANK 0 reads %s after %.0f s: "
                "this rank's metrics are written there and not exported. Set LOCAL_RANK (torchrun does) or "
                "node_name so that each node has one local rank 0",
                self.dir,
                self.grace,
            )

    def describe(self) -> str:
        return f"handed to the node's local rank 0 through {self.dir}"


class NodeReader:
    """On the node's exporting rank: the other ranks' latest points, re-read only when a file changed."""

    def __init__(self, folder: str, own_rank: int, node: str) -> None:
        self.dir = folder
        self.own = own_rank
        self.node = node
        self._files: dict[str, tuple[tuple[int, int], int, bool, list[MetricData]]] = {}  # path -> (stat, pid, final, data)
        self._retired: list[MetricData] = []  # summed counts of ranks' earlier processes
        try:
            os.makedirs(folder, exist_ok=True)
            with open(os.path.join(folder, LEADER), "w", encoding="utf-8") as f:
                json.dump({"rank": own_rank, "pid": os.getpid()}, f)
        except OSError as exc:
            health.error("node_metrics", f"cannot write {LEADER} in {folder}", exc)

    def merge_with(self, own: list[MetricData]) -> list[MetricData]:
        """The node's points: this rank's ``own`` and every other rank's latest hand-over."""
        peers = self.read()
        batches = [own, self._retired] + [data for _, _, _, data in peers.values()]
        return merge(batches, self.node)

    def read(self) -> dict[str, tuple[tuple[int, int], int, bool, list[MetricData]]]:
        try:
            entries = [e for e in os.scandir(self.dir) if e.name.startswith(_PREFIX) and e.name.endswith(_SUFFIX)]
        except FileNotFoundError:
            return self._files
        for entry in entries:
            if entry.name == f"{_PREFIX}{self.own}{_SUFFIX}":
                continue
            try:
                st = entry.stat()
                stamp = (st.st_mtime_ns, st.st_size)
                known = self._files.get(entry.path)
                if known is not None and known[0] == stamp:
                    continue
                with open(entry.path, encoding="utf-8") as f:
                    doc = json.load(f)
                data = decode(doc)
            except Exception as exc:
                health.error("node_metrics", f"cannot read the hand-over file {entry.path}", exc)
                continue
            if known is not None and known[1] != doc["pid"]:
                # Another process of that rank (an elastic restart) counts from zero: keep what the last one
                # counted, so the node's counters do not go back.
                self._retired = merge([self._retired, _cumulative_only(known[3])], self.node)
            self._files[entry.path] = (stamp, doc["pid"], bool(doc.get("final")), data)
        return self._files

    def wait_final(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for every other rank's final hand-over (each node's ranks end
        together, but this one may get there first). True when all are in."""
        deadline = time.monotonic() + timeout
        while True:
            files = self.read()
            if all(final for _, _, final, _ in files.values()):
                return True
            if time.monotonic() >= deadline:
                waiting = sorted(os.path.basename(p) for p, (_, _, final, _) in files.items() if not final)
                _log.warning(
                    "otel-torchdist: node %s exported without the last hand-over of %s (not in after %.1f s)",
                    self.node,
                    ", ".join(waiting),
                    timeout,
                )
                return False
            time.sleep(0.05)
