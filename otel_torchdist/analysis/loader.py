"""Streaming reader of run folders and trace files into typed records (``records.py``).

What it reads:

* a run folder, ``<run_dir>/<run id>/``: every rank's ``traces.rank<R>.jsonl`` and ``metrics.rank<R>.jsonl``
  (and their rotated copies ``traces.rank<R>.1.jsonl``, read first)
  (OTLP/JSON, one ``Export*ServiceRequest`` per line) and ``resource.rank<R>.json``;
* an OTLP/JSON trace file, e.g. downloaded from Jaeger: one ``{"resourceSpans": [...]}`` document (possibly
  pretty-printed over many lines) or a ``.jsonl`` of them; Jaeger's own ``{"data": [...]}`` download too.

Nothing is loaded whole (except a single pretty-printed document): files are read line by line, the ranks'
files in turn, one line of each at a time, so records reach the builders in roughly time order and a
matcher of the ranks' records keeps only the few it has not matched yet. Lines that cannot be used (cut
short by a killed process, JSON that is not OTLP) are skipped and reported as :class:`Problem`s; only a
path with nothing readable at all raises :class:`RunNotFound`.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import gc
import glob
import itertools
import json
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from .. import names as n
from .records import (
    Collective,
    Hang,
    Histogram,
    MetricPoint,
    MetricSnapshot,
    Phase,
    Problem,
    RankResource,
    RankStep,
    Record,
    Span,
    WarningRecord,
)

# traces.rank0.1.jsonl: the file sink's rotated copy (export/sinks.py), older than traces.rank0.jsonl
_RANK_FILE = re.compile(r"^(traces|metrics|resource)\.rank(\d+)(?:\.1)?\.(jsonl|json)$")
_ROTATED = re.compile(r"\.1(\.jsonl)$")
_RANK_IN_ID = re.compile(r"rank(\d+)$")
MAX_SINGLE_DOCUMENT = 2 << 30  # a pretty-printed document is parsed whole; refuse absurd sizes


class RunNotFound(ValueError):
    """The path holds nothing this reader can use; the message says what was found and what to pass."""


@dataclass(kw_only=True)
class InputFile:
    path: str
    role: str
    """``traces``, ``metrics``, ``resource`` (a flat JSON of resource attributes) or ``otlp`` (any OTLP/JSON)."""
    rank: int | None = None
    """The rank its name says, if any (the resource inside wins)."""


@dataclass(kw_only=True)
class Source:
    """What was found at the path given on the command line."""

    path: str
    is_folder: bool
    files: list[InputFile] = field(default_factory=list)

    def of(self, *roles: str) -> list[InputFile]:
        return [f for f in self.files if f.role in roles]


def discover(path: str) -> Source:
    """Find the telemetry files at ``path``; raise :class:`RunNotFound` with a useful sentence if none."""
    if not os.path.exists(path):
        raise RunNotFound(f"{path} does not exist: pass a run folder (<run_dir>/<run id>) or an OTLP/JSON trace file")
    if os.path.isfile(path):
        if os.path.getsize(path) == 0:
            raise RunNotFound(f"{path} is empty: no telemetry to read")
        m = _RANK_FILE.match(os.path.basename(path))
        role = m.group(1) if m else "otlp"
        return Source(path=path, is_folder=False, files=[InputFile(path=path, role=role, rank=int(m.group(2)) if m else None)])
    files = []
    for name in sorted(os.listdir(path)):
        full = os.path.join(path, name)
        m = _RANK_FILE.match(name)
        if m and os.path.isfile(full):
            files.append(InputFile(path=full, role=m.group(1), rank=int(m.group(2))))
    if not any(f.role in ("traces", "metrics") for f in files):
        # A folder of other OTLP/JSON files (downloaded traces), or a folder of run folders.
        others = [
            os.path.join(path, x)
            for x in sorted(os.listdir(path))
            if x.endswith((".json", ".jsonl")) and os.path.isfile(os.path.join(path, x)) and not _RANK_FILE.match(x)
            and not x.startswith(("summary.rank", "run-description.rank", "prometheus-targets.rank"))
        ]
        # run folders first: a stray export (a Perfetto trace written beside them) does not make it a folder
        # of downloaded traces
        runs = sorted(
            (d for d in glob.glob(os.path.join(path, "*", "")) if glob.glob(os.path.join(d, "*.rank*.json*"))),
            key=os.path.getmtime,
        )
        if runs:
            listed = ", ".join(os.path.basename(os.path.normpath(d)) for d in runs[-5:])
            raise RunNotFound(
                f"{path} is a folder of {len(runs)} run folder{'s' if len(runs) > 1 else ''}, not a run: pass one of them "
                f"(newest last: {listed})"
                + (f"; or one of its other files ({', '.join(os.path.basename(o) for o in others[:3])})" if others else "")
            )
        if others:
            files.extend(InputFile(path=p, role="otlp") for p in others)
        else:
            present = ", ".join(sorted(os.listdir(path))[:8]) or "nothing"
            raise RunNotFound(
                f"{path} holds no otel-torchdist telemetry (no traces.rank<R>.jsonl or metrics.rank<R>.jsonl; "
                f"found: {present})"
            )
    return Source(path=path, is_folder=True, files=files)


# ------------------------------------------------------------------------------------------ values
_CONVERT = {"stringValue": str, "intValue": int, "doubleValue": float, "boolValue": bool}


def _value(v: dict[str, Any]) -> Any:
    for key, x in v.items():  # an AnyValue has one key
        conv = _CONVERT.get(key)
        if conv is not None:
            return conv(x)
        if key == "arrayValue":
            return [_value(y) for y in (x or {}).get("values", ())]
        return None
    return None


def _attrs(items: Any) -> dict[str, Any]:
    return {kv["key"]: _value(kv.get("value") or {}) for kv in items} if items else {}


def _hex_id(raw: Any, nbytes: int) -> str:
    """OTLP/JSON ids are hex; protobuf's generic JSON mapping writes base64 (never the same length). Accept both."""
    if not raw:
        return ""
    raw = str(raw)
    if len(raw) == 2 * nbytes:
        return raw.lower()
    try:
        return base64.b64decode(raw, validate=True).hex()
    except (binascii.Error, ValueError):
        return raw


_PHASE_SPANS = frozenset({*n.SPAN_PHASES.values(), n.SPAN_PHASE_BEFORE})


def group_label(desc: Any, name: Any, label: Any = None) -> str:
    """The group as the metric labels name it: the span says so itself (``torchdist.group.label``); runs
    recorded before it did get the rule of ``capture/groups.py``: its description, else ``pg<name>``."""
    if label:
        return str(label)
    if desc and desc != "undefined":
        return str(desc)
    return f"pg{name}" if name is not None else "?"


# ----------------------------------------------------------------------------------- span records
def span_record(
    rank: int,
    name: str,
    trace_id: str,
    span_id: str,
    parent_id: str | None,
    start_ns: int,
    end_ns: int,
    a: dict[str, Any],
    error: str | None,
    events: list[tuple[str, int, dict[str, Any]]],
) -> list[Record]:
    """The typed record(s) of one span: the span itself and any warning events on it."""
    out: list[Record] = []
    if name == n.SPAN_HANG:
        out.append(
            Hang(
                rank=rank,
                op=str(a.get(n.COLL_OP, "?")),
                group=group_label(a.get(n.COLL_GROUP_DESC), a.get(n.COLL_GROUP_NAME), a.get(n.COLL_GROUP_LABEL)),
                group_name=str(a.get(n.COLL_GROUP_NAME, "?")),
                seq=a.get(n.COLL_SEQ),
                waited_s=float(a.get(n.HANG_WAITED, (end_ns - start_ns) / 1e9)),
                threshold_s=a.get(n.HANG_THRESHOLD),
                start_ns=start_ns,
                end_ns=end_ns,
                group_ranks=tuple(a[n.COLL_GROUP_RANKS]) if isinstance(a.get(n.COLL_GROUP_RANKS), list) else None,
                missing_ranks=tuple(int(r) for r in a[n.HANG_MISSING_RANKS]) if isinstance(a.get(n.HANG_MISSING_RANKS), list) else None,
            )
        )
    elif name == n.SPAN_RANK_STEP:
        out.append(
            RankStep(
                rank=rank,
                step=int(a.get(n.STEP, -1)),
                trace_id=trace_id,
                span_id=span_id,
                start_ns=start_ns,
                end_ns=end_ns,
                duration_s=float(a.get(n.STEP_DURATION, (end_ns - start_ns) / 1e9)),
                occurrence=int(a.get(n.STEP_OCCURRENCE, 0)),
                setup=a.get(n.STEP_SETUP) is True,
                counted=a.get(n.STEP_UNCOUNTED) is not True,
                compute_s=a.get(n.STEP_COMPUTE),
                wait_s=a.get(n.STEP_COLLECTIVE_WAIT),
                collectives=a.get(n.STEP_COLLECTIVES),
                message_bytes=a.get(n.STEP_BYTES),
                samples=a.get(n.STEP_SAMPLES),
                tokens=a.get(n.STEP_TOKENS),
                loss=a.get(n.STEP_LOSS),
            )
        )
    elif n.PHASE_NAME in a and (name in _PHASE_SPANS):
        out.append(
            Phase(
                rank=rank,
                phase=str(a.get(n.PHASE_NAME, "?")),
                trace_id=trace_id,
                parent_id=parent_id,
                start_ns=start_ns,
                end_ns=end_ns,
            )
        )
    elif name == n.SPAN_WARNING:
        out.append(
            WarningRecord(rank=rank, kind=str(a.get(n.WARNING_KIND, "?")), message=str(a.get(n.WARNING_MESSAGE, "")), time_ns=start_ns)
        )
    elif n.COLL_OP in a:
        ranks = a.get(n.COLL_GROUP_RANKS)
        out.append(
            Collective(
                rank=rank,
                op=str(a[n.COLL_OP]),
                kind=a.get(n.COLL_KIND),
                group=group_label(a.get(n.COLL_GROUP_DESC), a.get(n.COLL_GROUP_NAME), a.get(n.COLL_GROUP_LABEL)),
                group_name=str(a.get(n.COLL_GROUP_NAME, "?")),
                group_size=a.get(n.COLL_GROUP_SIZE),
                group_ranks=tuple(ranks) if isinstance(ranks, list) else None,
                seq=a.get(n.COLL_SEQ),
                message_size=int(a.get(n.COLL_MESSAGE_SIZE) or 0),
                start_ns=start_ns,
                end_ns=end_ns,
                duration_s=float(a.get(n.COLL_DURATION, (end_ns - start_ns) / 1e9)),
                is_async=bool(a.get(n.COLL_ASYNC, False)),
                phase=a.get(n.COLL_PHASE),
                module=a.get(n.COLL_MODULE),
                framework=a.get(n.COLL_FRAMEWORK),
                end_source=a.get(n.COLL_END_SOURCE),
                dtype=a.get(n.COLL_DTYPE),
                trace_id=trace_id,
                span_id=span_id,
                parent_id=parent_id,
                error=error,
            )
        )
    else:
        out.append(
            Span(
                rank=rank,
                name=name,
                trace_id=trace_id,
                span_id=span_id,
                parent_id=parent_id,
                start_ns=start_ns,
                end_ns=end_ns,
                attributes=a,
                error=error,
            )
        )
    for ev_name, t, ev_attrs in events:
        if ev_name == n.WARNING_EVENT and name != n.SPAN_WARNING:
            out.append(
                WarningRecord(
                    rank=rank,
                    kind=str(ev_attrs.get(n.WARNING_KIND, "?")),
                    message=str(ev_attrs.get(n.WARNING_MESSAGE, "")),
                    time_ns=t,
                )
            )
    return out


class _Ranks:
    """Which rank a resource belongs to: its ``torchdist.rank``, else the file's name, else its instance id."""

    def __init__(self, file_rank: int | None, path: str, problems: list[Problem]) -> None:
        self.file_rank = file_rank
        self.path = path
        self.problems = problems
        self.warned = False

    def rank(self, resource: dict[str, Any]) -> int:
        r = resource.get(n.RANK)
        if isinstance(r, int):
            return r
        if self.file_rank is not None:
            return self.file_rank
        m = _RANK_IN_ID.search(str(resource.get(n.SERVICE_INSTANCE_ID, "")))
        if m:
            return int(m.group(1))
        if not self.warned:
            self.warned = True
            self.problems.append(
                Problem(path=self.path, message=f"spans without a {n.RANK} resource attribute: counted as rank 0")
            )
        return 0


def _resource_record(rank: int, res: dict[str, Any]) -> RankResource:
    ws = res.get(n.WORLD_SIZE)
    return RankResource(
        rank=rank,
        world_size=int(ws) if isinstance(ws, int) else None,
        run_id=res.get(n.RUN_ID),
        backend=res.get(n.BACKEND),
        host=res.get(n.HOST_NAME),
    )


def _otlp_spans(doc: dict[str, Any], ranks: _Ranks, spans_wanted: bool) -> list[Record]:
    out: list[Record] = []
    for rs in doc.get("resourceSpans") or ():
        res = _attrs((rs.get("resource") or {}).get("attributes"))
        rank = ranks.rank(res)
        out.append(_resource_record(rank, res))
        if not spans_wanted:
            continue
        for ss in rs.get("scopeSpans") or ():
            for s in ss.get("spans") or ():
                status = s.get("status") or {}
                error = status.get("message", "error") if status.get("code") in (2, "STATUS_CODE_ERROR") else None
                events = [
                    (e.get("name", ""), int(e.get("timeUnixNano", 0)), _attrs(e.get("attributes")))
                    for e in s.get("events") or ()
                ]
                parent = s.get("parentSpanId")
                out.extend(
                    span_record(
                        rank,
                        n.span_base_name(s.get("name", "?")),
                        _hex_id(s.get("traceId"), 16),
                        _hex_id(s.get("spanId"), 8),
                        _hex_id(parent, 8) or None,
                        int(s.get("startTimeUnixNano", 0)),
                        int(s.get("endTimeUnixNano", 0)),
                        _attrs(s.get("attributes")),
                        error,
                        events,
                    )
                )
    return out


def _number(dp: dict[str, Any]) -> float:
    if "asInt" in dp:
        return int(dp["asInt"])
    return float(dp.get("asDouble", 0.0))


def _otlp_metrics(doc: dict[str, Any], ranks: _Ranks) -> list[Record]:
    out: list[Record] = []
    for rm in doc.get("resourceMetrics") or ():
        res = _attrs((rm.get("resource") or {}).get("attributes"))
        rank = ranks.rank(res)
        out.append(_resource_record(rank, res))
        metrics: dict[str, list[MetricPoint]] = {}
        t = 0
        for sm in rm.get("scopeMetrics") or ():
            for m in sm.get("metrics") or ():
                points = metrics.setdefault(m.get("name", "?"), [])
                if "histogram" in m:
                    for dp in m["histogram"].get("dataPoints") or ():
                        t = max(t, int(dp.get("timeUnixNano", 0)))
                        points.append(
                            MetricPoint(
                                attributes=_attrs(dp.get("attributes")),
                                value=Histogram(
                                    count=int(dp.get("count", 0)),
                                    sum=float(dp.get("sum", 0.0)),
                                    bounds=tuple(float(b) for b in dp.get("explicitBounds") or ()),
                                    bucket_counts=tuple(int(c) for c in dp.get("bucketCounts") or ()),
                                    min=float(dp["min"]) if "min" in dp else None,
                                    max=float(dp["max"]) if "max" in dp else None,
                                ),
                            )
                        )
                else:
                    data = m.get("sum") or m.get("gauge") or {}
                    for dp in data.get("dataPoints") or ():
                        t = max(t, int(dp.get("timeUnixNano", 0)))
                        points.append(MetricPoint(attributes=_attrs(dp.get("attributes")), value=_number(dp)))
        out.append(MetricSnapshot(rank=rank, time_ns=t, metrics=metrics, instance=str(res.get(n.SERVICE_INSTANCE_ID, ""))))
    return out


_JAEGER_TYPES = {"int64": int, "float64": float, "bool": bool}


def _jaeger_tag(tag: dict[str, Any]) -> Any:
    v = tag.get("value")
    conv = _JAEGER_TYPES.get(tag.get("type", ""))
    if conv is not None:
        try:
            return conv(v)
        except (TypeError, ValueError):
            return v
    if isinstance(v, str) and v[:1] == "[":  # Jaeger flattens OTLP arrays into JSON strings
        try:
            parsed = json.loads(v)
            return parsed if isinstance(parsed, list) else v
        except ValueError:
            return v
    return v


def _jaeger(doc: dict[str, Any], ranks: _Ranks, spans_wanted: bool) -> list[Record]:
    """Jaeger's own JSON (UI download, ``/api/traces``): ``{"data": [{"spans": [...], "processes": {...}}]}``."""
    out: list[Record] = []
    for trace in doc.get("data") or ():
        procs = {}
        for pid, proc in (trace.get("processes") or {}).items():
            res = {t["key"]: _jaeger_tag(t) for t in proc.get("tags") or ()}
            res.setdefault(n.SERVICE_NAME, proc.get("serviceName"))
            rank = ranks.rank(res)
            procs[pid] = rank
            out.append(_resource_record(rank, res))
        if not spans_wanted:
            continue
        for s in trace.get("spans") or ():
            a = {t["key"]: _jaeger_tag(t) for t in s.get("tags") or ()}
            parent = next((r.get("spanID") for r in s.get("references") or () if r.get("refType") == "CHILD_OF"), None)
            start = int(s.get("startTime", 0)) * 1000
            error = None
            if a.pop("otel.status_code", None) == "ERROR" or a.get("error") is True:
                error = str(a.get("otel.status_description", "error"))
            events = []
            for log in s.get("logs") or ():
                fields = {f["key"]: _jaeger_tag(f) for f in log.get("fields") or ()}
                events.append((str(fields.pop("event", "")), int(log.get("timestamp", 0)) * 1000, fields))
            out.extend(
                span_record(
                    procs.get(s.get("processID"), 0),
                    n.span_base_name(s.get("operationName", "?")),
                    _hex_id(s.get("traceID"), 16),
                    _hex_id(s.get("spanID"), 8),
                    _hex_id(parent, 8) or None,
                    start,
                    start + int(s.get("duration", 0)) * 1000,
                    a,
                    error,
                    events,
                )
            )
    return out


# --------------------------------------------------------------------------------------- reading
@contextlib.contextmanager
def gc_paused():
    """Pause the cyclic garbage collector while reading: parsing creates millions of small dicts, each
    batch of which would trigger a collection scanning everything kept so far (half the time of a large
    run). Records hold no cycles, so reference counting frees them all the same."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


@dataclass(kw_only=True)
class ReadStats:
    lines: int = 0
    skipped_lines: int = 0
    files_read: int = 0
    empty_files: list[str] = field(default_factory=list)


def _records_of_doc(
    doc: Any, path: str, line: int | None, ranks: _Ranks, problems: list[Problem], spans_wanted: bool, metrics_wanted: bool
) -> list[Record] | None:
    if not isinstance(doc, dict):
        problems.append(Problem(path=path, line=line, message="JSON, but not an OTLP export request: skipped"))
        return None
    if "resourceSpans" in doc:
        return _otlp_spans(doc, ranks, spans_wanted)
    if "resourceMetrics" in doc:
        return _otlp_metrics(doc, ranks) if metrics_wanted else []
    if isinstance(doc.get("data"), list):
        return _jaeger(doc, ranks, spans_wanted)
    keys = ", ".join(list(doc)[:4])
    problems.append(
        Problem(
            path=path,
            line=line,
            message=f"JSON, but not an OTLP export request (no resourceSpans or resourceMetrics; keys: {keys}): skipped",
        )
    )
    return None


def _read_file(
    f: InputFile, problems: list[Problem], stats: ReadStats, spans_wanted: bool, metrics_wanted: bool
) -> Iterator[list[Record]]:
    """The records of one file, one list per line (or one for a whole pretty-printed document)."""
    ranks = _Ranks(f.rank, f.path, problems)
    try:
        fh = open(f.path, encoding="utf-8", errors="replace")
    except OSError as exc:
        problems.append(Problem(path=f.path, message=f"cannot be read ({exc.strerror}): skipped"))
        return
    stats.files_read += 1
    with fh:
        if f.role == "resource":
            try:
                res = json.load(fh)
                yield [_resource_record(ranks.rank(res), res)] if isinstance(res, dict) else []
            except ValueError:
                problems.append(Problem(path=f.path, message="not JSON: skipped"))
            return
        first = fh.readline()
        if not first:
            stats.empty_files.append(f.path)
            return
        try:
            doc = json.loads(first)
        except ValueError:
            doc = None
        if doc is None and (f.path.endswith(".json") or (f.role == "otlp" and first.strip() in ("{", "["))):
            # One pretty-printed document (a trace downloaded from a UI): read it whole.
            fh.seek(0)
            if os.path.getsize(f.path) > MAX_SINGLE_DOCUMENT:
                problems.append(Problem(path=f.path, message="a single JSON document over 2 GiB: not read"))
                return
            try:
                whole = json.load(fh)
            except ValueError as exc:
                problems.append(Problem(path=f.path, message=f"not valid JSON ({exc.msg} at line {exc.lineno}): skipped"))
                return
            stats.lines += 1
            recs = _records_of_doc(whole, f.path, None, ranks, problems, spans_wanted, metrics_wanted)
            if recs:
                yield recs
            return
        for lineno, line in enumerate(itertools.chain((first,), fh), 1):
            stats.lines += 1
            if line.isspace():
                continue
            if lineno > 1:
                try:
                    doc = json.loads(line)
                except ValueError:
                    doc = None
            if doc is None:
                stats.skipped_lines += 1
                problems.append(Problem(path=f.path, line=lineno, message=_bad_line(line)))
                continue
            recs = _records_of_doc(doc, f.path, lineno, ranks, problems, spans_wanted, metrics_wanted)
            if recs is None:
                stats.skipped_lines += 1
            elif recs:
                yield recs


def _bad_line(line: str) -> str:
    try:
        json.loads(line)
    except ValueError as exc:
        why = f"{exc.msg}, column {exc.colno}"
    else:
        why = "unreadable"
    if not line.endswith("\n"):
        return f"the last line is cut short ({why}): was the process killed while writing it? Skipped"
    return f"truncated or not JSON ({why}): skipped"


def iter_records(
    source: Source,
    problems: list[Problem],
    stats: ReadStats | None = None,
    *,
    spans: bool = True,
    metrics: bool = True,
) -> Iterator[Record]:
    """Every record at ``source``, the files read in turn one line at a time; problems are appended."""
    stats = stats if stats is not None else ReadStats()
    roles = ["resource", "otlp"]
    if spans:
        roles.append("traces")
    if metrics:
        roles.append("metrics")
    # A rank's rotated copy and its current file are one reader, the older first, so that its records
    # stay in time order (a metric series only takes snapshots later than its last).
    chains: dict[str, list[InputFile]] = {}
    for f in source.files:
        if f.role in roles:
            chains.setdefault(_ROTATED.sub(r"\1", f.path) if f.rank is not None else f.path, []).append(f)
    readers = [
        itertools.chain.from_iterable(
            _read_file(f, problems, stats, spans, metrics) for f in sorted(files, key=lambda f: not _ROTATED.search(f.path))
        )
        for files in chains.values()
    ]
    # Resource files first (they are small), then round-robin over the ranks' files.
    active = list(readers)
    while active:
        still = []
        for reader in active:
            batch = next(reader, None)
            if batch is None:
                continue
            yield from batch
            still.append(reader)
        active = still
