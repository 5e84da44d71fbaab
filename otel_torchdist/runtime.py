"""One instrumented process: the patches, the pipeline, the exporters, and their start and end.

Start: patches go in at once (``instrument()`` may come before or after ``init_process_group``). The
exporters need to know who this rank is and which run it belongs to, so they start when the process
group exists: right away if it does, otherwise from the patched ``init_process_group``. Until then records
wait in the (bounded) queue.

End: ``uninstrument()``, ``destroy_process_group()`` and normal process exit (``atexit``, and
multiprocessing's exit finalizers for ``torch.multiprocessing.spawn`` workers, which skip ``atexit``) all
flush, each bounded by ``flush_timeout``.
"""

from __future__ import annotations

import atexit
import functools
import logging
import multiprocessing.util
import os
import sys
import tempfile
import threading
import time
from typing import Any

from . import health, logs, signals, steps
from .drain import hang_board, step_roots, stragglers, watchdog
from . import names as n
from . import summary as _summary
from .capture import c10d, checkpoint, completion, context, ddp, ddp_native, dtensor, fsdp, funcol, functions, later, native_hot, nccl, optim, record
from .capture import dataloader as dataloader_capture
from .config import Config
from .export import node as _node
from .export import otlp
from .export import providers as _providers
from .export.otel_metrics import MeterBridge
from .export.otel_spans import ProviderSampler, TracerSink
from .export import sinks as _sinks
from .export.prometheus import PrometheusEndpoint
from .identity import Identity, resolve, resource_attributes, sanitize
from .patching import Patcher
from .drain.pipeline import Pipeline

_log = logging.getLogger("otel_torchdist")


def _framework_captures():
    """(name, capture module, the module whose import it waits for: None = install at once)."""
    return (
        ("DDP", ddp, None),
        ("FSDP", fsdp, "torch.distributed.fsdp"),
        ("functional collectives", funcol, None),
        ("autograd functions", functions, None),
        ("DTensor", dtensor, "torch.distributed.tensor"),
        ("distributed checkpoint", checkpoint, "torch.distributed.checkpoint"),
        ("steps", steps, None),
        ("DataLoader", dataloader_capture, None),
    )


class Component:
    """Something that runs beside the capture once the rank's identity is known (the system sampler...).

    A module registers a factory in :data:`COMPONENTS`; each Runtime calls it with the Config and keeps
    what it returns (None: not wanted). Every method must be cheap and must not raise.
    """

    name = "component"

    def resource_attributes(self) -> dict[str, Any]:
        """Attributes for this rank's resource (asked for once, before export starts)."""
        return {}

    def start(self, rt: Runtime) -> None:
        """Exporters exist: ``rt.identity``, ``rt.pipeline`` (``base_labels``, ``emit_span``) are usable."""

    def metric_data(self) -> list:
        """Current points (``otlp.MetricData``), asked for at every metric export and scrape."""
        return []

    def stop(self) -> None:
        """Stop threads; called before the final flush. Must return promptly."""


COMPONENTS: list[Any] = []  # factories: Config -> Component | None
_BUILTIN_COMPONENT_MODULES = ("otel_torchdist.system",)


def _load_builtin_components() -> None:
    import importlib

    for module in _BUILTIN_COMPONENT_MODULES:
        try:
            importlib.import_module(module)  # registers its factory in COMPONENTS
        except ModuleNotFoundError as exc:
            if exc.name != module:
                health.error("component", f"cannot load {module}", exc)
        except Exception as exc:
            health.error("component", f"cannot load {module}", exc)


class Runtime:
    def __init__(self, cfg: Config, tracer_provider: Any = None, meter_provider: Any = None) -> None:
        self.cfg = cfg
        self.given = (tracer_provider, meter_provider)  # instrument(tracer_provider=, meter_provider=)
        self.providers: _providers.Providers | None = None
        self.meter: MeterBridge | None = None
        self.patcher = Patcher()
        self.pipeline = Pipeline(cfg)
        self.identity: Identity | None = None
        self.folder: str | None = None
        self.prometheus: PrometheusEndpoint | None = None
        self.destinations: list[str] = []
        self.components: list[Component] = []
        self.steps = steps.StepTracker(cfg)
        self.exchange: stragglers.Exchange | None = None
        self.roots: step_roots.StepRoots | None = None
        self._started = False
        self._run_dir_ok = True
        self.watchdog: watchdog.Watchdog | None = None
        self.board: hang_board.HangBoard | None = None
        self.node_reader: _node.NodeReader | None = None
        self.hand_over: _node.HandOver | None = None
        self._lock = threading.RLock()
        self._closed = False
        self._closer: int | None = None  # the thread running close()
        self._close_done = threading.Event()
        self._started_at = time.monotonic()
        self._end_by: float | None = None  # when the process's end may no longer wait for telemetry (end_budget)

    # ------------------------------------------------------------------------------------------ start
    def start(self) -> None:
        logs.configure(self.cfg.log_level)
        self._check_run_dir()
        self._started = True
        record.set_limit(self.cfg.max_queued_records)
        # Dynamo's table of collectives it rewrites into functional ones is keyed by the c10d functions
        # found when funcol is first imported: import it before patching, so the keys are the originals
        # (which a compiled call through our wrappers reaches), whatever instrument() cycles follow.
        import torch.distributed._functional_collectives  # noqa: F401

        self.patcher.apply(c10d.patches())
        # Framework captures after c10d's, so torch modules they import bind c10d's wrappers by name.
        # Each one alone: a torch without FSDP1, say, costs that capture, not the rest.
        # FSDP, DTensor and checkpoint cost a second of imports: installed when the program imports them.
        for name, module, trigger in _framework_captures():
            install = functools.partial(self._install_capture, name, module)
            if trigger is None:
                install()
            else:
                later.when_imported(trigger, install)
        try:
            optim.install()
        except Exception as exc:
            health.error("capture", "the optimizer capture could not be installed", exc)
        steps.TRACKER[0] = self.steps
        optim.closer[0] = self.steps.on_optimizer_step
        signals.install(lambda: self.close(restore=False), self.flush, self.on_uncaught, self.closing_here)
        c10d._on_init.append(self.on_process_group)
        c10d._on_destroy.append(self.on_destroy)
        self.pipeline.start()
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            c10d.meet(None)
            self.on_process_group()
        ddp_native.activate(self.cfg.native, self.cfg.max_queued_records)
        native_hot.activate(ddp_native.module())
        try:
            otlp.use_native(ddp_native.module())
        except Exception as exc:
            health.error("native", "the native span encoders could not be set up; spans are encoded in Python", exc)
        if ddp_native.module() is not None:
            try:
                self.pipeline.use_native(ddp_native.module())
            except Exception as exc:
                health.error("native", "the native metric fold could not be set up; records are folded in Python", exc)
        try:
            ddp.adopt_existing()
        except Exception as exc:
            health.error("ddp", "could not adopt DDP models built before instrument()", exc)
        try:
            dtensor.adopt_existing()
        except Exception as exc:
            health.error("sharding", "could not adopt models parallelized before instrument()", exc)

    def _install_capture(self, name: str, module: Any) -> None:
        if self._closed:
            return
        try:
            self.patcher.apply(module.patches())
        except Exception as exc:
            health.error("capture", f"the {name} capture could not be installed", exc)

    def _check_run_dir(self) -> None:
        """Refuse at once a run folder the file exporters could not write; otherwise only warn."""
        cfg = self.cfg
        try:
            os.makedirs(cfg.run_dir, exist_ok=True)
            probe = os.path.join(cfg.run_dir, f".otel-torchdist-probe-{os.getpid()}")
            with open(probe, "w") as f:
                f.write("")
            os.remove(probe)
        except OSError as exc:
            message = f"run_dir / OTEL_TORCHDIST_RUN_DIR {cfg.run_dir!r} is not writable ({exc.strerror or exc})"
            uses_files = "file" in cfg.resolved_traces_exporter() or "file" in cfg.resolved_metrics_exporters()
            if uses_files:
                raise ValueError(message + "; the file exporters need it. Point it elsewhere or export over OTLP") from None
            _log.warning("otel-torchdist: %s; the run's resource, summary and target files are not written", message)
            self._run_dir_ok = False

    def on_process_group(self) -> None:
        """The process group exists: learn who we are and start exporting."""
        with self._lock:
            self._end_by = None  # a process group after destroy_process_group(): that was not the end
            if self.identity is not None or self._closed:
                return
            self._set_identity(resolve(self.cfg.run_id))

    def _set_identity(self, ident: Identity) -> None:
        cfg = self.cfg
        self.identity = ident
        folder = os.path.join(cfg.run_dir, ident.run_id)
        if self._run_dir_ok:
            try:
                os.makedirs(folder, exist_ok=True)
                self.folder = folder
            except OSError as exc:
                health.error("run_folder", f"cannot create the run folder {folder}", exc)
        self.components = self._make_components()
        extra = dict(cfg.resource_attributes)
        for comp in self.components:
            try:
                extra.update(comp.resource_attributes())
            except Exception as exc:
                health.error("component", f"{comp.name} could not describe the run", exc)
        resource = _providers.own_resource(resource_attributes(ident, cfg.service_name, extra))
        by_node = cfg.metrics_aggregation == "node" and bool(cfg.resolved_metrics_exporters())
        labels = {n.M_RUN: ident.run_id}
        if cfg.metrics_rank_label and not by_node:
            labels[n.M_RANK] = str(ident.rank)
        providers = self.providers = _providers.choose(*self.given, global_meter=cfg.global_meter_provider)
        span_sinks, metric_sinks = _sinks.build(
            cfg, folder, ident.rank, traces=providers.tracer_provider is None, metrics=providers.meter_provider is None,
            copy=self.folder is not None,
        )
        # Exporters installed for the SDK that OTEL_*_EXPORTER names (a vendor's): through SDK providers of
        # the library's own, with this rank's resource.
        providers = self.providers = _providers.with_installed_exporters(cfg, providers, resource)
        if providers.tracer_provider is not None:
            scope = {n.RANK: ident.rank, n.RUN_ID: ident.run_id, n.WORLD_SIZE: ident.world_size}
            span_sinks.append(TracerSink(providers.tracer_provider, providers.tracer_origin, scope, providers.owned[0]))
            self.pipeline.sampler = ProviderSampler(providers.tracer_provider)
        exporting = True
        if by_node:
            exporting, metric_sinks = self._join_node(ident, metric_sinks)
        traced = cfg.traces_rank(ident.rank)
        if not traced:
            self.pipeline.stop_tracing()
        self.destinations = [f"traces: {s.describe()}" + ("" if traced else " (warnings only: not in trace_ranks)") for s in span_sinks]
        self.destinations += [f"metrics: {s.describe()}" for s in metric_sinks]
        if providers.meter_provider is not None:
            self.meter = MeterBridge(providers.meter_provider, providers.meter_origin, self.pipeline.bounds, labels, providers.owned[1])
            self.destinations.append(f"metrics: {self.meter.describe()}")
        if exporting and "prometheus" in cfg.resolved_metrics_exporters():
            self._start_prometheus(ident, labels)
        self._write_json(f"resource.rank{ident.rank}.json", resource)
        otlp.name_spans_for_rank(ident.rank)
        self.pipeline.set_destination(resource, labels, span_sinks, metric_sinks, otlp.SPAN_ENCODERS)
        if self.meter is not None:
            self.pipeline.bridge_metrics(self.meter)
        for comp in self.components:
            try:
                comp.start(self)
                self.pipeline.metric_sources.append(comp.metric_data)
            except Exception as exc:
                health.error("component", f"{comp.name} could not start", exc)
        logs.set_rank(ident.rank)
        self._start_steps(ident)
        self._announce(ident)

    def _join_node(self, ident: Identity, metric_sinks: list) -> tuple[bool, list]:
        """metrics_aggregation="node": local rank 0 exports the node's metrics, read from the hand-over
        files the others write instead of exporting. Returns (exports, this rank's metric sinks)."""
        node_name = self.cfg.node_name or sanitize(ident.host)
        base = self.folder or os.path.join(tempfile.gettempdir(), f"otel-torchdist-{ident.run_id}")
        where = _node.directory(base, node_name)
        if ident.local_rank == 0:
            self.node_reader = _node.NodeReader(where, ident.rank, node_name)
            self.pipeline.node_merge = self.node_reader.merge_with
            return True, metric_sinks
        self.hand_over = _node.HandOver(where, ident.rank)
        self.pipeline.outbox.metric_interval = self.cfg.node_metrics_interval
        return False, [self.hand_over]

    def _start_steps(self, ident: Identity) -> None:
        cfg = self.cfg
        every = cfg.straggler_exchange_steps
        if every and ident.distributed and 1 < ident.world_size <= stragglers.MAX_WORLD:
            self.exchange = stragglers.Exchange(self.pipeline, ident.trace_key, ident.rank, ident.world_size, every)
            self.steps.exchange = self.exchange
            self.exchange.start()
        if ident.distributed and ident.world_size > 1 and cfg.traces_rank(ident.rank) and stragglers.default_tcp_store() is not None:
            traced = [r for r in range(ident.world_size) if cfg.traces_rank(r)]
            self.roots = step_roots.StepRoots(self.pipeline, ident.trace_key, ident.rank, traced)
            self.steps.roots = self.roots
            self.roots.start()
        self.steps.attach(self.pipeline, ident.trace_key, ident.rank, ident.world_size)
        dataloader_capture.FETCH[0] = self.steps.on_fetch
        self.watchdog = watchdog.Watchdog(self, cfg.hang_threshold)
        self.pipeline.metric_sources.append(self.watchdog.metric_data)
        if ident.distributed and ident.world_size > 1 and stragglers.default_tcp_store() is not None:
            self.board = hang_board.HangBoard(ident.trace_key, ident.rank, ident.world_size, self.watchdog.interval)
            self.watchdog.board = self.board
            self.board.start()
        self.watchdog.start()

    def _make_components(self) -> list[Component]:
        _load_builtin_components()
        out = []
        for factory in COMPONENTS:
            try:
                comp = factory(self.cfg)
            except Exception as exc:
                health.error("component", f"{getattr(factory, '__name__', factory)} could not be created", exc)
                continue
            if comp is not None:
                out.append(comp)
        return out

    def _start_prometheus(self, ident: Identity, labels: dict[str, str]) -> None:
        endpoint = PrometheusEndpoint(self.pipeline.metric_data)
        port = self.cfg.prometheus_port + ident.local_rank if self.cfg.prometheus_port else 0
        try:
            endpoint.start(self.cfg.prometheus_host, port if port <= 65535 else 0)
        except Exception as exc:
            health.error("prometheus", f"cannot serve /metrics on {self.cfg.prometheus_host} (prometheus_host, OTEL_EXPORTER_PROMETHEUS_HOST)", exc)
            return
        self.prometheus = endpoint
        self.destinations.append(f"metrics: Prometheus {endpoint.url}")
        if self.folder:
            try:
                endpoint.write_target(
                    os.path.join(self.folder, f"prometheus-targets.rank{ident.rank}.json"),
                    # A node's metrics carry no rank: the target must not add one.
                    {"run": ident.run_id} if self.node_reader else {"run": ident.run_id, "rank": str(ident.rank)},
                )
            except OSError as exc:
                health.error("run_folder", "cannot write the Prometheus target file", exc)

    def _write_json(self, name: str, doc: Any) -> None:
        if not self.folder:
            return
        try:
            _sinks.write_json_whole(os.path.join(self.folder, name), doc, indent=1)
        except OSError as exc:
            health.error("run_folder", f"cannot write {name} in the run folder", exc)

    def _speaks(self, ident: Identity) -> bool:
        return self.cfg.summary == "all" or (self.cfg.summary == "rank0" and ident.rank == 0)

    def _announce(self, ident: Identity) -> None:
        msg = (
            f"otel-torchdist: run {ident.run_id}, rank {ident.rank}/{ident.world_size} ({ident.backend}); "
            + "; ".join(self.destinations)
        )
        if self._speaks(ident):
            _say(msg)
        else:
            _log.info(msg)

    # -------------------------------------------------------------------------------------------- end
    def on_uncaught(self, exc: BaseException) -> None:
        self.steps.fail(type(exc).__name__, str(exc)[:1024])

    def on_destroy(self, group: Any) -> None:
        from torch.distributed import distributed_c10d as cd

        if group is None or group is cd._world.default_pg:
            self._leave_store()  # its threads talk to the store being destroyed
            self.flush(self.end_budget())

    def _leave_store(self) -> None:
        """End the threads with a connection of their own to the process group's store (the straggler
        exchange, the step roots) before the store can go away: a client blocked in a store that is destroyed
        aborts the process. The last steps' times reach rank 0 first (and their roots go out); a root closed
        later is emitted as rank 0 saw it."""
        if self.exchange is not None:
            self.exchange.stop()
        if self.board is not None:
            self.board.stop()
        if self.roots is not None:
            self.pipeline.drain()
            self.roots.stop(min(1.0, self.end_budget()))

    def end_budget(self) -> float:
        """Seconds the process's end may still wait for telemetry. Its end flushes (destroy_process_group()'s,
        uninstrument()'s, exit's) share one ``flush_timeout``, started by the first: a backend that never
        answers costs the end of the job one flush_timeout, however many of them it passes."""
        with self._lock:
            if self._end_by is None:
                self._end_by = time.monotonic() + self.cfg.flush_timeout
            return max(0.0, self._end_by - time.monotonic())

    def flush(self, timeout: float | None = None) -> bool:
        return self.pipeline.flush(self.cfg.flush_timeout if timeout is None else timeout)

    def closing_here(self) -> bool:
        """Whether the calling thread is inside :meth:`close` (a SIGTERM handler interrupting it)."""
        return self._closer == threading.get_ident() and not self._close_done.is_set()

    def close(self, restore: bool = True) -> None:
        """Flush everything, print the summary, stop threads and servers; with ``restore``, unpatch.

        A second call, from another thread, returns once the first has finished (bounded): the SIGTERM
        watcher that ends the process after its flush must not end it in the middle of the exit handler's.
        """
        with self._lock:
            closed, self._closed = self._closed, True
            if not closed:
                self._closer = threading.get_ident()
        if closed:
            if self._closer != threading.get_ident():
                self._close_done.wait(2 * self.cfg.flush_timeout + 5.0)
            return
        try:
            self._close(restore)
        finally:
            self._close_done.set()
            signals.deliver_pending()

    def _close(self, restore: bool) -> None:
        if restore:
            later.cancel()
            self.patcher.restore()
            optim.remove()
            context.TRACKER.remove()
            signals.uninstall()
        if not self._started:
            return  # refused at start: nothing ran, nothing to flush or report
        funcol.flush_unfinished()
        for hooks, fn in ((c10d._on_init, self.on_process_group), (c10d._on_destroy, self.on_destroy)):
            if fn in hooks:
                hooks.remove(fn)
        if optim.closer[0] == self.steps.on_optimizer_step:
            optim.closer[0] = None
        dataloader_capture.FETCH[0] = None
        self.steps.close()
        steps.TRACKER[0] = None
        if self.watchdog is not None:
            self.watchdog.stop()
        self._leave_store()
        if self.watchdog is not None:
            # A rank told to stop while stuck in a collective: say which one, as unfinished.
            for rec in self.watchdog.blocking_in_flight():
                stuck = list(rec)
                record.complete(stuck, n.END_UNFINISHED)
        completion.flush_unfinished()
        for rec in ddp_native.abandon(self.steps):
            record.complete(rec, n.END_UNFINISHED)
        nccl.flush_pending(min(1.0, self.end_budget()))
        # No process group ever: nothing was captured (collectives need one). A helper process of the job (a
        # launcher's, multiprocessing's resource tracker, a spawned DataLoader worker, all instrumented by
        # opentelemetry-instrument's sitecustomize) writes no run folder and prints no summary.
        for comp in self.components:
            try:
                comp.stop()
            except Exception as exc:
                health.error("component", f"{comp.name} could not stop", exc)
        self._finish_node()
        self.pipeline.stop(self.end_budget())
        if self.meter is not None:
            self.meter.close(self.pipeline.metric_data())
        native_hot.deactivate()
        otlp.use_native(None)
        otlp.name_spans_for_rank(None)
        ddp_native.deactivate(restore)
        self._finish_summary()
        if self.prometheus is not None:
            self.prometheus.stop()

    def _finish_node(self) -> None:
        """The node's last figures: the ranks hand over their final points before their own flush (which
        may wait on a slow span backend), and the exporting rank waits for them, bounded, before its own."""
        try:
            if self.hand_over is not None:
                self.pipeline.drain()
                self.hand_over.finish(self.pipeline.metric_data())
            elif self.node_reader is not None:
                self.node_reader.wait_final(self.end_budget() / 2)
        except Exception as exc:
            health.error("node_metrics", "could not finish the node's metrics", exc)

    def _finish_summary(self) -> None:
        ident = self.identity
        if ident is None:
            return
        table = _summary.rows(self.pipeline.store.snapshot())
        drops = health.drops()
        errors = health.errors()
        step_stats = _summary.steps(self.pipeline.framework, self.steps)
        self._write_json(
            f"summary.rank{ident.rank}.json",
            {
                "run": ident.run_id,
                "rank": ident.rank,
                "collectives": table,
                "steps": step_stats,
                "dropped": drops,
                "errors": errors,
            },
        )
        lost = {k: v for k, v in (drops or {}).items() if v and k not in n.POLICY_DROPS}
        if lost:
            _log.warning(
                "otel-torchdist: telemetry dropped on this rank to protect training: %s",
                ", ".join(f"{v} {k}" for k, v in sorted(lost.items())),
            )
        if not self._speaks(ident):
            return
        footer = _summary.step_lines(step_stats) + [
            f"telemetry dropped: {sum(drops.values())} ({', '.join(f'{k} {v}' for k, v in drops.items()) or 'none'}); "
            f"internal errors: {sum(errors.values())}"
        ]
        footer += self.destinations
        if self.folder:
            footer.append(f"run folder: {os.path.abspath(self.folder)}")
        header = (
            f"otel-torchdist summary: run {ident.run_id}, rank {ident.rank} of {ident.world_size} "
            f"({ident.backend}), {time.monotonic() - self._started_at:.1f} s instrumented"
        )
        try:
            _say(_summary.render(header, table, footer))
        except Exception:
            pass


# ---------------------------------------------------------------------------------------- process exit
_current: list[Runtime] = []
_exit_hooked = [False]


def current() -> Runtime | None:
    return _current[0] if _current else None


def install(rt: Runtime) -> None:
    _current[:] = [rt]
    if not _exit_hooked[0]:
        _exit_hooked[0] = True
        atexit.register(_at_exit)
        multiprocessing.util.Finalize(None, _at_exit, exitpriority=100)
        os.register_at_fork(after_in_child=_forked_child)


def _forked_child() -> None:
    """A fork of an instrumented process (a DataLoader worker, a multiprocessing child) is not a rank: it
    inherits the runtime but none of its threads, and must neither flush nor summarize at its exit (it
    would race the parent for the run folder's files) nor take SIGTERM for the parent."""
    _current.clear()
    signals.forget_in_child()


def remove() -> Runtime | None:
    rt = current()
    _current.clear()
    return rt


def _at_exit() -> None:
    rt = current()
    if rt is None:
        return
    try:
        rt.close(restore=False)
    except Exception as exc:
        health.error("flush", "could not flush telemetry at exit", exc)


def _say(text: str) -> None:
    """One write per message: print() writes the text and its newline separately, and a warning the
    export thread logs in between lands in the middle of the line."""
    sys.stderr.write(text + "\n")
    sys.stderr.flush()
