"""Span and metric sinks: OTLP over HTTP or gRPC, OTLP/JSON lines in the run folder, the console.

A sink never raises and never blocks longer than its timeout. A failed export drops that batch, counts
it (``torchdist.telemetry.dropped``), and is logged once when the backend starts failing and once when it
recovers, not once per batch: a dead backend costs training nothing but the counted loss.
"""

from __future__ import annotations

import gzip
import json
import logging
import os
import sys
import threading
import time
import urllib.parse
import zlib
from collections.abc import Callable
from typing import Any

from .. import health
from .. import names as n
from . import otlp
from .._version import __version__
from ..config import Config
from ..telemetry import MetricData, SpanData
from . import retry
from .sdk_metrics import metrics_pb
from .temporality import Delta

_log = logging.getLogger("otel_torchdist")


class Sink:
    name = "sink"
    local = False
    """Writes on this machine (the run folder, the console): never stuck on a network."""
    span_format: str | None = None
    """How this sink wants spans encoded (``pb`` or ``json``, see ``otlp.SPAN_ENCODERS``); None: no spans."""
    hands_over = False
    """Spans go on to something that batches them itself (a provider's span processors): the outbox hands
    them over within ``outbox.HAND_OVER_S`` instead of holding them for the span schedule delay."""

    def export_spans(self, resource: dict[str, Any], spans: list[SpanData], timeout: float | None = None) -> bool:
        """Convenience for callers holding SpanData: encode, then :meth:`export_span_fragments`."""
        if self.span_format is None:
            return True
        encode = otlp.SPAN_ENCODERS[self.span_format]
        return self.export_span_fragments(resource, [encode(s) for s in spans], timeout)

    def export_span_fragments(self, resource: dict[str, Any], fragments: list, timeout: float | None = None) -> bool:
        return True

    def export_metrics(
        self,
        resource: dict[str, Any],
        metrics: list[MetricData],
        start_ns: int,
        now_ns: int,
        timeout: float | None = None,
    ) -> bool:
        return True

    def flush(self, timeout: float) -> bool:
        """Push out what this sink buffers itself, within ``timeout`` seconds (the sinks here buffer nothing)."""
        return True

    def shutdown(self) -> None:
        pass

    def describe(self) -> str:
        return self.name


class _FailureLog:
    """Log the first failure and the recovery of one destination, count everything in between."""

    def __init__(self, what: str) -> None:
        self.what = what
        self.failing = False
        self.failures = 0

    def failed(self, reason: str) -> None:
        self.failures += 1
        health.error("export", f"exporting {self.what} failed: {reason}", quiet=True)  # logged just below
        if not self.failing:
            self.failing = True
            _log.warning("otel-torchdist: exporting %s is failing (%s); batches are dropped and counted", self.what, reason)

    def succeeded(self) -> None:
        if self.failing:
            self.failing = False
            _log.warning("otel-torchdist: exporting %s recovered after %d failed export(s)", self.what, self.failures)


# ----------------------------------------------------------------------------------------- run folder
_IOV_MAX = 1024  # pieces per vectored write (Linux's IOV_MAX)


def _append_whole(fd: int, pieces: list[bytes]) -> None:
    """Append one line (the concatenated ``pieces``) or none: a full disk (or a file size limit) stops a
    write part-way, and so does an exception a signal handler raises between two writes (a batch takes
    two vectored writes: KeyboardInterrupt during a flush on the main thread); a torn line would make the
    file unreadable from there on, so the part written is cut off again before raising."""
    start = os.fstat(fd).st_size
    writev = getattr(os, "writev", None)
    if writev is None:  # no vectored writes on this platform (Windows): one joined write
        pieces, writev = [b"".join(pieces)], lambda fd, chunk: os.write(fd, chunk[0])
    try:
        for i in range(0, len(pieces), _IOV_MAX):
            chunk = pieces[i : i + _IOV_MAX]
            written = writev(fd, chunk)
            if written < sum(map(len, chunk)):  # a short write (a signal, a size limit): the rest one by one
                view = memoryview(b"".join(chunk))[written:]
                while view:
                    view = view[os.write(fd, view) :]
    except BaseException:
        try:
            os.ftruncate(fd, start)
        except OSError:
            pass
        raise


def write_json_whole(path: str, doc: Any, indent: int | None = None) -> None:
    """A JSON document in the run folder, whole or not at all: written beside it, then renamed over it (a
    full disk left an empty file in place of the last good one). Raises OSError, leaving no temporary file."""
    tmp = path + ".tmp"
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(doc, f, indent=indent, default=str)
        os.replace(tmp, path)
    except OSError:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def rotated_path(path: str) -> str:
    """Where ``FileSink`` moves a full ``<signal>.rank<R>.jsonl``: ``<signal>.rank<R>.1.jsonl``."""
    stem, ext = os.path.splitext(path)
    return f"{stem}.1{ext}"


_SPAN_MARK = b'"spanId":"'  # once per span in OTLP/JSON traces (a quote inside a string value is escaped)


def count_spans(path: str) -> int:
    """Spans in an OTLP/JSON lines traces file, without parsing it (a 256 MiB file in a fraction of a second)."""
    count, tail = 0, b""
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            buf = tail + chunk
            count += buf.count(_SPAN_MARK)
            tail = buf[1 - len(_SPAN_MARK) :]  # too short to hold a whole mark: none is counted twice
    return count


class FileSink(Sink):
    """OTLP/JSON lines, one ``Export*ServiceRequest`` per line: ``traces.rank<R>.jsonl`` and
    ``metrics.rank<R>.jsonl`` in the run folder. Appends, so an elastic restart adds to the same files.
    A file that would pass ``max_bytes`` is rotated to ``rotated_path`` (one generation kept)."""

    name = "file"
    local = True

    def __init__(self, folder: str, rank: int, traces: bool, metrics: bool, max_bytes: int = 0) -> None:
        self.span_format = "json" if traces else None
        self.folder = folder
        self.max_bytes = max_bytes
        self.traces_path = os.path.join(folder, f"traces.rank{rank}.jsonl") if traces else None
        self.metrics_path = os.path.join(folder, f"metrics.rank{rank}.jsonl") if metrics else None
        # Reentrant: a signal handler's flush on the thread writing one file writes the other (the same file
        # is never written twice at once: its export path's lock, held by this thread, turns the inner one away).
        self._lock = threading.RLock()
        self._files: dict[str, Any] = {}
        self._unrotatable: set[str] = set()
        self._rotated = False
        # One per file: a metrics line written fine said the failing traces file "recovered", every batch.
        self._failures = {path: _FailureLog(f"to {path}") for path in (self.traces_path, self.metrics_path) if path}

    def _write(self, path: str, line: str) -> bool:
        return self._write_pieces(path, [(line + "\n").encode()])

    def _write_pieces(self, path: str, pieces: list[bytes]) -> bool:
        """Append one line made of ``pieces`` (its newline included)."""
        try:
            with self._lock:
                f = self._files.get(path)
                if f is None:
                    f = self._files[path] = open(path, "ab", buffering=0)
                if self.max_bytes and path not in self._unrotatable:
                    size = os.fstat(f.fileno()).st_size
                    if size and size + sum(map(len, pieces)) > self.max_bytes:
                        f = self._rotate(path, f)
                _append_whole(f.fileno(), pieces)
        except Exception as exc:
            self._failures[path].failed(f"{type(exc).__name__}: {exc}")
            return False
        self._failures[path].succeeded()
        return True

    def _rotate(self, path: str, f: Any) -> Any:
        """Move the full file aside, replacing the previous rotated copy (whose spans are counted, whoever
        wrote them: an earlier attempt of the run too), and start an empty one. A file that cannot be
        renamed keeps growing rather than losing the lines to come."""
        aside = rotated_path(path)
        lost = 0
        if path == self.traces_path and os.path.isfile(aside):
            try:
                lost = count_spans(aside)
            except OSError as exc:
                health.error("export", f"could not count the spans of {aside} before replacing it", exc)
        try:
            os.replace(path, aside)  # the open file moves with its name
        except OSError as exc:
            self._unrotatable.add(path)
            health.error("export", f"could not rotate {path}", exc, quiet=True)  # logged just below
            _log.warning("otel-torchdist: could not rotate %s (%s); it grows past file_max_bytes", path, exc)
            return f
        if lost:
            health.dropped(n.DROPPED_FILE_ROTATED, lost)
        if not self._rotated:
            self._rotated = True
            _log.warning(
                "otel-torchdist: %s reached %d bytes (file_max_bytes) and was moved to %s, replacing the copy "
                "there; spans a rotation deletes are counted as dropped (kind=%s)",
                path, self.max_bytes, aside, n.DROPPED_FILE_ROTATED,
            )  # fmt: skip
        f.close()
        del self._files[path]  # reopened by the next write if this open fails
        f = self._files[path] = open(path, "ab", buffering=0)
        return f

    def export_span_fragments(self, resource, fragments, timeout=None):
        if self.traces_path is None:
            return True
        # Written as pieces, one vectored write per thousand: a batch joined first and encoded was four
        # copies of about a megabyte on pages fresh from the kernel each time (two page faults a span).
        pieces = otlp.trace_request_json_pieces(resource, fragments, "\n")
        return self._write_pieces(self.traces_path, pieces)

    def export_metrics(self, resource, metrics, start_ns, now_ns, timeout=None):
        if self.metrics_path is None:
            return True
        return self._write(self.metrics_path, otlp.metrics_to_json(resource, metrics, start_ns, now_ns))

    def shutdown(self) -> None:
        with self._lock:
            for f in self._files.values():
                try:
                    f.close()
                except Exception:
                    pass
            self._files.clear()

    def describe(self) -> str:
        return f"OTLP/JSON lines in {self.folder}"


class ConsoleSink(Sink):
    """OTLP/JSON to stdout, like the SDK's console exporters."""

    name = "console"
    local = True

    def __init__(self, traces: bool, metrics: bool) -> None:
        self.span_format = "json" if traces else None
        self.traces = traces
        self.metrics = metrics
        self._lock = threading.Lock()

    def _print(self, line: str) -> bool:
        try:
            with self._lock:
                sys.stdout.write(line + "\n")
                sys.stdout.flush()
            return True
        except Exception as exc:
            health.error("export", "writing telemetry to stdout failed", exc)
            return False

    def export_span_fragments(self, resource, fragments, timeout=None):
        return self._print(otlp.trace_request_json(resource, fragments)) if self.traces else True

    def export_metrics(self, resource, metrics, start_ns, now_ns, timeout=None):
        return self._print(otlp.metrics_to_json(resource, metrics, start_ns, now_ns)) if self.metrics else True

    def describe(self) -> str:
        return "stdout (OTLP/JSON)"


# ---------------------------------------------------------------------------------------------- OTLP
def _redacted(url: str) -> str:
    """``url`` fit for a log line: a password in its user part (``https://user:token@host``) is masked."""
    parsed = urllib.parse.urlsplit(url)
    if parsed.password is None:
        return url
    netloc = f"{parsed.username}:***@" + parsed.netloc.rpartition("@")[2]
    return urllib.parse.urlunsplit(parsed._replace(netloc=netloc))


# zlib's fastest level (gzip and deflate). gzip.compress's default (9, what opentelemetry-python's exporter uses) took 5.5 ms
# of CPU for a batch of 512 collective spans (530 KB of protobuf) here, 11 us a span: more than building and
# encoding the span. Level 1 took 1.2 ms for a body 17 % larger (28 KB against 24 KB).
GZIP_LEVEL = 1


# What the OTLP exporter spec asks an exporter to send: its name and version.
USER_AGENT = f"otel-torchdist/{__version__}"


def _signal_endpoint(base: str | None, specific: str | None, protocol: str, path: str) -> str:
    """Per the spec: a signal-specific endpoint is used as is; the generic one gets ``/v1/<signal>`` (HTTP)."""
    if specific:
        return specific if "://" in specific else "http://" + specific
    base = base or ("http://localhost:4317" if protocol == "grpc" else "http://localhost:4318")
    if "://" not in base:
        base = "http://" + base
    if protocol == "grpc":
        return base
    return base.rstrip("/") + "/" + path


def _partial_success(signal: str, body: bytes, as_json: bool) -> tuple[int, str]:
    """(items rejected, the collector's message) from an OTLP/HTTP success response's ``partial_success``."""
    if not body:
        return 0, ""
    if as_json:
        partial = json.loads(body).get("partialSuccess") or {}
        count = partial.get("rejectedSpans" if signal == "traces" else "rejectedDataPoints") or 0
        return int(count), str(partial.get("errorMessage") or "")
    from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceResponse
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse

    response = (ExportTraceServiceResponse if signal == "traces" else ExportMetricsServiceResponse).FromString(body)
    return _rejected_in(signal, response)


def _rejected_in(signal: str, response: Any) -> tuple[int, str]:
    partial = response.partial_success
    return (partial.rejected_spans if signal == "traces" else partial.rejected_data_points), partial.error_message


def _count_rejected(signal: str, read: Callable[[], tuple[int, str]], where: str) -> None:
    """What a collector accepted the request but not (OTLP partial success, ``read`` from its answer: never
    sent again, per the spec): counted as dropped, and said once per destination."""
    try:
        count, message = read()
    except Exception as exc:  # an answer that is not an OTLP response: the request was accepted
        health.error("export", f"could not read the collector's response ({where})", exc)
        return
    if count:
        health.dropped("span" if signal == "traces" else "metric_point", count)
    if count or message:
        what = "spans" if signal == "traces" else "data points"
        health.warn_once(f"partial_success:{where}", "%s: the collector rejected %d %s (%s); counted as dropped",
                         where, count, what, message or "no message")  # fmt: skip


class OtlpHttpSink(Sink):
    """OTLP over HTTP through a ``requests.Session``, tried again as the SDK's exporters try again
    (:mod:`.retry`): spans (encoded by the library) or metrics (protobuf by the SDK's encoder, sdk_metrics.py)."""

    name = "otlp-http"

    def __init__(self, cfg: Config, signal: str, protocol: str) -> None:
        import requests

        self.signal = signal
        self.json = protocol == "http/json"
        if signal == "traces":
            self.span_format = "json" if self.json else "pb"
        specific = cfg.traces_endpoint if signal == "traces" else cfg.metrics_endpoint
        self.url = _signal_endpoint(cfg.endpoint, specific, protocol, f"v1/{signal}")
        headers = cfg.for_signal("headers", signal)
        headers["Content-Type"] = "application/json" if self.json else "application/x-protobuf"
        self.compression = cfg.for_signal("compression", signal)
        if self.compression != "none":
            headers["Content-Encoding"] = self.compression
        self.headers = headers
        self._headers = {"User-Agent": USER_AGENT, **headers}
        self.timeout = cfg.for_signal("timeout", signal)
        self.delta = Delta() if signal == "metrics" and cfg.metrics_temporality != "cumulative" else None
        self.session = requests.Session()
        from .http_deadline import DeadlineAdapter

        self.adapter = DeadlineAdapter()  # the timeout bounds the whole request
        for prefix in ("http://", "https://"):
            self.session.mount(prefix, self.adapter)
        # A session that trusts the environment reads it again for every request (proxies, NO_PROXY, the CA
        # bundle variables, ~/.netrc): 0.4 ms of CPU a request here, a third of what a span batch's post
        # costs. Read once, here, as requests would for this URL, and passed with every request. (A redirect
        # to another host keeps these; a collector behind a redirecting proxy is not a case we know of.)
        self.session.trust_env = False
        self.proxies = requests.utils.get_environ_proxies(self.url)
        self.auth = requests.utils.get_netrc_auth(self.url)
        # Passed with every request, not set on the session: requests lets REQUESTS_CA_BUNDLE /
        # CURL_CA_BUNDLE override a session's ``verify`` (psf/requests#3829), which would silently replace
        # OTEL_EXPORTER_OTLP_CERTIFICATE on machines that set those variables. Without a certificate they
        # apply, as requests applies them.
        self.verify: str | bool = (
            cfg.for_signal("certificate", signal)
            or os.environ.get("REQUESTS_CA_BUNDLE")
            or os.environ.get("CURL_CA_BUNDLE")
            or True
        )
        client_cert, client_key = cfg.for_signal("client_certificate", signal), cfg.for_signal("client_key", signal)
        self.cert = (client_cert, client_key) if client_cert and client_key else client_cert or None
        self._stop = threading.Event()
        self._failures = _FailureLog(f"{signal} to {_redacted(self.url)}")
        # No answer: a connection refused or reset, a proxy or TLS failure (ConnectionError covers them), or
        # nothing back in time (the deadline is spent then: no retry either way).
        self._unreachable = (requests.exceptions.ConnectionError, requests.exceptions.Timeout)

    def _post(self, body: bytes, timeout: float | None) -> bool:
        body = compress(body, self.compression)
        deadline = time.monotonic() + (self.timeout if timeout is None else min(timeout, self.timeout))
        outcome = retry.send(lambda left: self._try(body, left), deadline, self._stop)
        if outcome.ok:
            self._failures.succeeded()
            return True
        self._failures.failed(outcome.reason)
        return False

    def _try(self, body: bytes, timeout: float) -> retry.Outcome:
        self.adapter.watch(timeout)
        try:
            resp = self.session.post(
                self.url, data=body, headers=self._headers, timeout=timeout, verify=self.verify, cert=self.cert,
                proxies=self.proxies, auth=self.auth,
            )  # fmt: skip
        except Exception as exc:
            if self.adapter.unwatch():
                return retry.Outcome(False, reason=f"no whole answer within {timeout:.1f} s: the collector kept the request open")
            reason = getattr(exc, "reason", None)  # urllib3's MaxRetryError: what made the one try fail
            if not isinstance(reason, Exception):
                reason = exc
            return retry.Outcome(False, reason=f"{type(reason).__name__}: {reason}", unreachable=isinstance(exc, self._unreachable))
        self.adapter.unwatch()
        status = resp.status_code
        if 200 <= status < 300:
            _count_rejected(self.signal, lambda: _partial_success(self.signal, resp.content, self.json), self.describe())
            return retry.Outcome(True)
        retryable = status in retry.RETRYABLE_HTTP
        delay = retry.retry_after(resp.headers.get("Retry-After")) if retryable else None
        return retry.Outcome(False, retryable, f"HTTP {status} {resp.text[:200]!r}", delay)

    def export_span_fragments(self, resource, fragments, timeout=None):
        if self.signal != "traces":
            return True
        if self.json:
            return self._post(b"".join(otlp.trace_request_json_pieces(resource, fragments)), timeout)
        return self._post(otlp.trace_request_pb(resource, fragments), timeout)

    def export_metrics(self, resource, metrics, start_ns, now_ns, timeout=None):
        if self.signal != "metrics":
            return True
        if self.delta is not None:
            metrics = self.delta(metrics, start_ns, now_ns)
        if self.json:
            return self._post(otlp.metrics_to_json(resource, metrics, start_ns, now_ns).encode(), timeout)
        return self._post(metrics_pb(resource, metrics, start_ns, now_ns), timeout)

    def shutdown(self) -> None:
        self._stop.set()  # a retry waiting out its backoff gives up
        try:
            self.session.close()
        except Exception:
            pass

    def describe(self) -> str:
        return f"OTLP/{'JSON' if self.json else 'protobuf'} over HTTP to {_redacted(self.url)}"


def compress(body: bytes, compression: str) -> bytes:
    """``body`` as an OTLP/HTTP request sends it with Content-Encoding ``compression``."""
    if compression == "gzip":
        return gzip.compress(body, compresslevel=GZIP_LEVEL)
    if compression == "deflate":
        return zlib.compress(body, GZIP_LEVEL)
    return body


class OtlpGrpcSink(Sink):
    """OTLP over gRPC, requests sent as already serialized bytes (spans encoded by the library, metrics by the
    SDK's encoder), tried again as the SDK's exporters try again (:mod:`.retry`)."""

    name = "otlp-grpc"

    def __init__(self, cfg: Config, signal: str) -> None:
        import grpc

        self.signal = signal
        self.span_format = "pb" if signal == "traces" else None
        specific = cfg.traces_endpoint if signal == "traces" else cfg.metrics_endpoint
        url = _signal_endpoint(cfg.endpoint, specific, "grpc", "")
        parsed = urllib.parse.urlparse(url)
        # A user part (user:password@) is no part of a gRPC target; it would only end up in log lines.
        self.target = (parsed.netloc or parsed.path).rpartition("@")[2]
        insecure = grpc_insecure(cfg, signal)
        compression = cfg.for_signal("compression", signal)
        self._compression = {"gzip": grpc.Compression.Gzip, "deflate": grpc.Compression.Deflate}.get(compression, grpc.Compression.NoCompression)
        self._credentials = None
        if not insecure:
            root = _read(cfg.for_signal("certificate", signal))
            key = _read(cfg.for_signal("client_key", signal))
            chain = _read(cfg.for_signal("client_certificate", signal))
            self._credentials = grpc.ssl_channel_credentials(root_certificates=root, private_key=key, certificate_chain=chain)
        self._reconnect = False
        self._shut_down = False
        self._stop = threading.Event()
        self._connect()
        headers = cfg.for_signal("headers", signal)
        self.metadata = tuple((k.lower(), v) for k, v in headers.items())
        self.timeout = cfg.for_signal("timeout", signal)
        self.delta = Delta() if signal == "metrics" and cfg.metrics_temporality != "cumulative" else None
        self.insecure = insecure
        self._failures = _FailureLog(f"{signal} to grpc://{self.target}")

    def _connect(self) -> None:
        import grpc
        from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2
        from opentelemetry.proto.collector.trace.v1 import trace_service_pb2

        # A channel of its own subchannels: a new channel must really reconnect (see _call).
        options = [("grpc.use_local_subchannel_pool", 1)]
        if self._credentials is None:
            self.channel = grpc.insecure_channel(self.target, options=options, compression=self._compression)
        else:
            self.channel = grpc.secure_channel(self.target, self._credentials, options=options, compression=self._compression)
        # Requests arrive already serialized: send the bytes as they are.
        service, response = (
            ("trace.v1.TraceService", trace_service_pb2.ExportTraceServiceResponse)
            if self.signal == "traces"
            else ("metrics.v1.MetricsService", metrics_service_pb2.ExportMetricsServiceResponse)
        )
        self.export_call = self.channel.unary_unary(
            f"/opentelemetry.proto.collector.{service}/Export",
            request_serializer=lambda body: body,
            response_deserializer=response.FromString,
        )

    def _call(self, request, timeout: float | None) -> bool:
        deadline = time.monotonic() + (self.timeout if timeout is None else min(timeout, self.timeout))
        outcome = retry.send(lambda left: self._try(request, left), deadline, self._stop)
        if outcome.ok:
            self._failures.succeeded()
            return True
        reason = outcome.reason
        if self._shut_down:
            reason += " (abandoned: the exporter was shut down while this call was waiting)"
        self._failures.failed(reason)
        return False

    def _try(self, request, timeout: float) -> retry.Outcome:
        try:
            if self._reconnect and not self._shut_down:
                # After UNAVAILABLE the channel waits out gRPC's reconnect backoff (up to 120 s) and fails
                # every call meanwhile, so a collector that came back would lose everything sent in that
                # window. A fresh channel connects at once, as the SDK's exporter reconnects.
                self._reconnect = False
                old = self.channel
                self._connect()
                old.close()
            response = self.export_call(request, metadata=self.metadata, timeout=timeout)
        except Exception as exc:
            code = getattr(exc, "code", None)
            name = code().name if callable(code) else type(exc).__name__
            details = getattr(exc, "details", None)
            reason = f"{name}: {details()}" if callable(details) else name
            delay = _retry_info(exc)
            if name == "UNAVAILABLE" and delay is not None:
                # A server that says when to come back is up (overloaded): tried again after its delay, as
                # the SDK's exporter tries again.
                return retry.Outcome(False, True, reason, delay)
            # Unreachable: reconnect on the next call. Not after a failed TLS handshake: the collector is up,
            # the configuration is wrong, and every new handshake would only add a line to gRPC's own log.
            if name == "UNAVAILABLE" and "handshake" not in reason.lower():
                self._reconnect = True
            return retry.Outcome(False, name in retry.RETRYABLE_GRPC, reason, delay, unreachable=name == "UNAVAILABLE")
        _count_rejected(self.signal, lambda: _rejected_in(self.signal, response), self.describe())
        return retry.Outcome(True)

    def export_span_fragments(self, resource, fragments, timeout=None):
        if self.signal != "traces":
            return True
        return self._call(otlp.trace_request_pb(resource, fragments), timeout)

    def export_metrics(self, resource, metrics, start_ns, now_ns, timeout=None):
        if self.signal != "metrics":
            return True
        if self.delta is not None:
            metrics = self.delta(metrics, start_ns, now_ns)
        return self._call(metrics_pb(resource, metrics, start_ns, now_ns), timeout)


    def shutdown(self) -> None:
        self._shut_down = True
        self._stop.set()  # a retry waiting out its backoff gives up
        try:
            self.channel.close()  # also ends a call still waiting on a backend that never answers
        except Exception:
            pass

    def describe(self) -> str:
        return f"OTLP/gRPC to {'http' if self.insecure else 'https'}://{self.target}"


def grpc_insecure(cfg: Config, signal: str) -> bool:
    """Plaintext gRPC, as the SDK's gRPC exporters decide it: ``https://`` never; ``http://`` unless
    ``OTEL_EXPORTER_OTLP_INSECURE`` says false; an endpoint without a scheme only when it says true (the
    default endpoint is ``http://localhost:4317``)."""
    raw = (cfg.traces_endpoint if signal == "traces" else cfg.metrics_endpoint) or cfg.endpoint or "http://localhost:4317"
    scheme = raw.split("://", 1)[0].lower() if "://" in raw else ""
    insecure = cfg.for_signal("insecure", signal)
    if scheme == "https":
        return False
    if insecure is not None:
        return insecure
    return scheme == "http"


def _retry_info(exc: Exception) -> float | None:
    """The delay a gRPC server asks for before the next try (``google.rpc.RetryInfo``), or None."""
    trailing = getattr(exc, "trailing_metadata", None)
    try:
        raw = dict(trailing() or ()).get("google.rpc.retryinfo-bin") if callable(trailing) else None
        if raw is None:
            return None
        from google.rpc.error_details_pb2 import RetryInfo

        info = RetryInfo.FromString(raw)
        return info.retry_delay.seconds + info.retry_delay.nanos / 1e9
    except Exception:
        return None


def _read(path: str | None) -> bytes | None:
    if not path:
        return None
    with open(path, "rb") as f:
        return f.read()


def build(
    cfg: Config, folder: str, rank: int, traces: bool = True, metrics: bool = True, copy: bool = False
) -> tuple[list[Sink], list[Sink]]:
    """The span sinks and metric sinks ``cfg`` asks for (``traces`` / ``metrics`` False: none for that
    signal, which goes through a provider of the application's instead), and the run folder's copy of both
    (``run_folder_copy``) when ``copy`` (the folder exists)."""
    # The run folder first: a network sink stuck in a request (a collector that never answers) holds the
    # export's lock for its timeout, and the local copy must not wait behind it.
    span_sinks: list[Sink] = []
    metric_sinks: list[Sink] = []
    traces = cfg.resolved_traces_exporter() if traces else ()
    metrics = cfg.resolved_metrics_exporters() if metrics else ()
    if copy:
        traces, metrics = cfg.with_run_folder_copy(traces), cfg.with_run_folder_copy(metrics)
    if "file" in traces or "file" in metrics:
        sink = FileSink(folder, rank, "file" in traces, "file" in metrics, cfg.file_max_bytes)
        if "file" in traces:
            span_sinks.append(sink)
        if "file" in metrics:
            metric_sinks.append(sink)
    if "otlp" in traces:
        proto = cfg.traces_protocol or cfg.protocol
        span_sinks.append(OtlpGrpcSink(cfg, "traces") if proto == "grpc" else OtlpHttpSink(cfg, "traces", proto))
    if "otlp" in metrics:
        proto = cfg.metrics_protocol or cfg.protocol
        metric_sinks.append(OtlpGrpcSink(cfg, "metrics") if proto == "grpc" else OtlpHttpSink(cfg, "metrics", proto))
    if "console" in traces or "console" in metrics:
        sink = ConsoleSink("console" in traces, "console" in metrics)
        if "console" in traces:
            span_sinks.append(sink)
        if "console" in metrics:
            metric_sinks.append(sink)
    return span_sinks, metric_sinks
