"""Spans through an OpenTelemetry TracerProvider (the application's, or one passed to ``instrument()``).

The drain describes each span once it is over (a collective's, a step's, a phase's: :class:`SpanData`);
this sink starts and ends it through the provider's tracer with the times it had, so the provider's
Resource, sampler, span limits, processors and exporters all apply to it as to the application's own spans.

Span ids. All ranks' spans of one training step share one trace, and a rank's spans name their step's span as
parent before that span exists (it is described when the step closes). Both need ids chosen ahead of the
span, so this tracer's ``id_generator`` (a public attribute of the SDK's ``Tracer``; this tracer is the
library's own, the provider caches one per instrumentation scope) hands out the ids the drain chose, and the
provider's own generator's for everything else. A provider that is not the SDK's makes its own ids: spans
then keep their attributes and times, not their parents.
"""

from __future__ import annotations

import time
from typing import Any

from opentelemetry import context as context_api
from opentelemetry import trace as trace_api
from opentelemetry.context import Context
from opentelemetry.trace import Link, NonRecordingSpan, SpanContext, SpanKind, Status, StatusCode, TraceFlags

from .. import health
from .. import names as n
from .._version import __version__
from ..telemetry import SpanData
from .sinks import Sink

_SAMPLED = TraceFlags(TraceFlags.SAMPLED)
_UNSAMPLED = TraceFlags(TraceFlags.DEFAULT)
_ROOT = Context()


class ChosenIds:
    """The tracer's id generator: the ids set in ``trace_id`` / ``span_id`` once, else the provider's own."""

    def __init__(self, own: Any) -> None:
        self.own = own
        self.trace_id = 0
        self.span_id = 0

    def generate_trace_id(self) -> int:
        chosen, self.trace_id = self.trace_id, 0
        return chosen or self.own.generate_trace_id()

    def generate_span_id(self) -> int:
        chosen, self.span_id = self.span_id, 0
        return chosen or self.own.generate_span_id()

    def is_trace_id_random(self) -> bool:
        # Step trace ids are SHAKE-128 output (steps.step_ids): as uniform as the provider's random ones.
        return self.own.is_trace_id_random()


def parent_context(trace_id: int, span_id: int, sampled: bool, remote: bool, base: Context = _ROOT) -> Context:
    """``base`` (an empty context by default) with the (not necessarily existing yet) span
    ``trace_id``/``span_id`` as its current span."""
    ctx = SpanContext(trace_id, span_id, is_remote=remote, trace_flags=_SAMPLED if sampled else _UNSAMPLED)
    return trace_api.set_span_in_context(NonRecordingSpan(ctx), base)


def current_span_ids() -> tuple[int, int, bool] | None:
    """(trace id, span id, sampled) of the caller's current span, if it has a valid one."""
    ctx = trace_api.get_current_span().get_span_context()
    return (ctx.trace_id, ctx.span_id, bool(ctx.trace_flags.sampled)) if ctx.is_valid else None


def attach_span(trace_id: int, span_id: int, sampled: bool) -> object:
    """Make span ``trace_id``/``span_id`` the current span (the rank's step span, made when the step closes,
    around the caller's code of the step); returns the token for :func:`detach`."""
    return context_api.attach(parent_context(trace_id, span_id, sampled, False, context_api.get_current()))


def detach(token: object) -> None:
    context_api.detach(token)


def _is_sdk_sampler(sampler: Any) -> bool:
    """The SDK's samplers that keep every span of a step once its root is kept: the static ones, the trace id
    ratio (every span of a trace gets the root's answer), and ParentBased with its default answer for a
    sampled parent, local or remote (a rank's step under rank 0's root), read from its description."""
    from opentelemetry.sdk.trace import sampling

    if isinstance(sampler, sampling.ParentBased):
        description = sampler.get_description()
        return all(f"{kind}ParentSampled:AlwaysOnSampler" in description for kind in ("remote", "local"))
    return type(sampler) in (sampling.StaticSampler, sampling.TraceIdRatioBased)


class ProviderSampler:
    """The drain's sampling when spans go through a provider: a step is traced when the library picks it and
    the provider's sampler keeps the step's root (asked once per step, as the root of the step's shared trace
    is asked on rank 0: every rank gets the same answer from a sampler that decides from the trace id, as the
    SDK's do). Its spans are then started under a parent marked sampled, so that a parent-based sampler (the
    SDK's default) keeps the step whole; spans under the caller's own span follow that span's flag."""

    narrows = True  # the library's step choice, narrowed by the provider's sampler (steps.StepTracker.sampled)
    bound = 1  # not known to keep no root (Pipeline's native fold asks)

    def __init__(self, tracer_provider: Any) -> None:
        sampler = getattr(tracer_provider, "sampler", None)
        self._sampler = sampler if callable(getattr(sampler, "should_sample", None)) else None
        # Metrics point at a span (exemplars) only where its export is known: the SDK's own samplers keep every
        # span of a kept step (it starts under a sampled parent, or is decided by the step's trace id); one
        # of the application's may decide span by span, after the metric was recorded.
        self.exemplars = self._sampler is not None and _is_sdk_sampler(self._sampler)

    def root(self, trace_id: int) -> bool:
        if self._sampler is None:
            return True  # a provider without the SDK's sampler attribute: it decides when the span starts
        try:
            result = self._sampler.should_sample(_ROOT, trace_id, n.SPAN_STEP, SpanKind.INTERNAL, None, None)
            return result.decision.is_sampled()
        except Exception:
            return True

    def decide(self, trace_id: int, parent_sampled: bool | None) -> bool:
        return self.root(trace_id) if parent_sampled is None else parent_sampled


class TracerSink(Sink):
    """A span sink over an OpenTelemetry tracer: :class:`SpanData` in, provider's spans out."""

    name = "tracer"
    span_format = "data"  # the pipeline queues SpanData for it as they are (otlp.SPAN_ENCODERS)
    hands_over = True  # the provider's processors batch

    def __init__(self, tracer_provider: Any, origin: str, scope_attributes: dict[str, Any], owned: bool = False) -> None:
        self.provider = tracer_provider
        self.origin = origin
        self.owned = owned  # made by the library (for an installed exporter): shut down with it
        self.tracer = tracer_provider.get_tracer(n.SCOPE_NAME, __version__, attributes=scope_attributes)
        # Which rank and run a span is from, on every span: the Resource is the application's.
        self.identity = tuple((k, scope_attributes[k]) for k in (n.RANK, n.RUN_ID) if k in scope_attributes)
        self.rank = scope_attributes.get(n.RANK)
        self._names: dict[str, str] = {}
        own = getattr(self.tracer, "id_generator", None)
        self.ids: ChosenIds | None = None
        if own is not None and callable(getattr(own, "generate_span_id", None)):
            if isinstance(own, ChosenIds):  # a previous instrument() of this process: the same cached tracer
                own = own.own
            self.ids = self.tracer.id_generator = ChosenIds(own)

    def export_span_fragments(self, resource: dict[str, Any], fragments: list, timeout: float | None = None) -> bool:
        # A span ends on this thread, and a processor of the application's may export it right there
        # (SimpleSpanProcessor): the flush's time bounds the batch, the rest is counted.
        deadline = None if timeout is None else time.monotonic() + timeout
        failed = 0
        for i, span in enumerate(fragments):
            if deadline is not None and time.monotonic() > deadline:
                left = len(fragments) - i
                health.dropped("span", left)
                health.warn_once(
                    "tracer_sink_slow", "the TracerProvider's span processors took longer than the flush allows "
                    "(a synchronous exporter?); %d spans left out and counted", left,
                )  # fmt: skip
                return True  # counted here, as a span the provider refused is (the outbox would count them all)
            try:
                self.emit(span)
            except Exception as exc:  # a processor or exporter of the application's that raised
                failed += 1
                health.error("export", f"the TracerProvider refused a span ({span.name})", exc)
        if failed:
            health.dropped("span", failed)
        return True

    def emit(self, s: SpanData) -> None:
        attributes = dict(self.identity)
        attributes.update(s.all_attributes())
        if s.parent_span_id:
            ctx = parent_context(s.trace_id, s.parent_span_id, s.sampled, s.remote_parent)
        else:
            ctx = _ROOT
        ids = self.ids
        if ids is not None:
            ids.trace_id = 0 if s.parent_span_id else s.trace_id
            ids.span_id = s.span_id
        links = [Link(SpanContext(t, sp, is_remote=True, trace_flags=_SAMPLED), dict(a)) for t, sp, a in s.links]
        name = self._names.get(s.name)
        if name is None:
            name = self._names[s.name] = n.exported_span_name(s.name, self.rank)
        span = self.tracer.start_span(
            name, ctx, SpanKind.INTERNAL, attributes, links, start_time=s.start_ns, record_exception=False
        )
        if ids is not None:
            ids.trace_id = ids.span_id = 0  # a tracer that made no span (not recording) took neither
        if not span.is_recording():
            return
        for name, t, attrs in s.events:
            span.add_event(name, dict(attrs), t)
        if s.error is not None:
            span.set_status(Status(StatusCode.ERROR, s.error))
        span.end(end_time=s.end_ns)

    def flush(self, timeout: float) -> bool:
        """Ask the provider to export what it holds, waiting ``timeout`` seconds at most."""
        from .providers import force_flush

        return force_flush(self.provider, timeout)

    def shutdown(self) -> None:
        # An application's provider is shut down by the application (and the SDK, at exit); our tracer goes
        # back to the provider's own id generator.
        if self.ids is not None and getattr(self.tracer, "id_generator", None) is self.ids:
            self.tracer.id_generator = self.ids.own
        if self.owned:
            from .providers import shutdown

            shutdown(self.provider)

    def describe(self) -> str:
        return self.origin
