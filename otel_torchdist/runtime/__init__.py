"""One instrumented process: the patches, the pipeline, where telemetry goes (outlets.py), the threads that
talk to the other ranks (ranks.py), what the rank reports (report.py), and their start and end.

Start: patches go in at once (``instrument()`` may come before or after ``init_process_group``). The
exporters need to know who this rank is and which run it belongs to, so they start when the process
group exists: right away if it does, otherwise from the patched ``init_process_group``. Until then records
wait in the (bounded) queue.

End: ``uninstrument()``, ``destroy_process_group()`` and normal process exit (``atexit``, and
multiprocessing's exit finalizers for ``torch.multiprocessing.spawn`` workers, which skip ``atexit``) all
flush, each bounded by ``flush_timeout``.
"""

from __future__ import annotations

import functools
import logging
import os
import threading
import time
from typing import Any

from .. import health, logs, signals, steps
from .. import names as n
from ..capture import c10d, checkpoint, completion, context, ddp, ddp_native, dtensor, fsdp, funcol, functions, groups, later, native_hot, nccl, optim, record
from ..capture import dataloader as dataloader_capture
from ..config import Config
from ..drain.pipeline import Pipeline
from ..export import caller_context, otlp
from ..identity import Identity, resolve
from ..patching import Patcher
from . import report
from .components import COMPONENTS, Component, make_components
from .outlets import Outlets
from .process import current, install, remove
from .ranks import RankThreads

__all__ = ["COMPONENTS", "Component", "Runtime", "current", "install", "remove"]

_log = logging.getLogger("otel_torchdist")


def _framework_captures():
    """(name, capture module, the module whose import it waits for: None = install at once)."""
    return (
        ("ddp", ddp, None),
        ("fsdp", fsdp, "torch.distributed.fsdp"),
        ("funcol", funcol, None),
        ("functions", functions, None),
        ("dtensor", dtensor, "torch.distributed.tensor"),
        ("checkpoint", checkpoint, "torch.distributed.checkpoint"),
        ("backward", steps, None),
        ("dataloader", dataloader_capture, None),
        ("dataloader", _AccelerateLoaders, "accelerate.data_loader"),
    )


class _AccelerateLoaders:
    patches = staticmethod(dataloader_capture.accelerate_patches)


class Runtime:
    def __init__(self, cfg: Config, tracer_provider: Any = None, meter_provider: Any = None) -> None:
        self.cfg = cfg
        self.patcher = Patcher()
        self.pipeline = Pipeline(cfg)
        self.identity: Identity | None = None
        self.components: list[Component] = []
        self.steps = steps.StepTracker(cfg)
        self.outlets = Outlets(cfg, self.pipeline, (tracer_provider, meter_provider))
        self.ranks = RankThreads(cfg, self.pipeline, self.steps)
        self._started = False
        self._run_dir_ok = True
        self._lock = threading.RLock()
        self._closed = False
        self._closer: int | None = None  # the thread running close()
        self._close_done = threading.Event()
        self._started_at = time.monotonic()
        self._end_by: float | None = None  # when the process's end may no longer wait for telemetry (end_budget)
        self.pid = os.getpid()  # a fork inherits this runtime: the fork is not the process that runs it

    # ------------------------------------------------------------------------------------------ start
    def start(self) -> None:
        logs.configure(self.cfg.log_level)
        self._check_run_dir()
        self._started = True
        caller_context.install()  # the caller's OpenTelemetry context, for the captures to take
        record.set_limit(self.cfg.max_queued_records)
        # Dynamo's table of collectives it rewrites into functional ones is keyed by the c10d functions
        # found when funcol is first imported: import it before patching, so the keys are the originals
        # (which a compiled call through our wrappers reaches), whatever instrument() cycles follow.
        import torch.distributed._functional_collectives  # noqa: F401

        groups.forget_destroyed()
        native_hook = self.cfg.nccl_hook == "native"
        if native_hook and self.cfg.native == "off":
            health.warn_once("nccl-hook-native-off", "nccl_hook=native needs the native part, which native=off leaves out: the NCCL completion hook runs in Python")
        nccl.enable("nccl_completion" not in self.cfg.disabled_captures, native_hook and self.cfg.native != "off", self.cfg.native == "build")
        self.patcher.apply(c10d.patches())
        # Framework captures after c10d's, so torch modules they import bind c10d's wrappers by name.
        # Each one alone: a torch without FSDP1, say, costs that capture, not the rest.
        # FSDP, DTensor and checkpoint cost a second of imports: installed when the program imports them.
        for name, module, trigger in _framework_captures():
            if name in self.cfg.disabled_captures:
                continue
            add = functools.partial(self._install_capture, name, module)
            if trigger is None:
                add()
            else:
                later.when_imported(trigger, add)
        try:
            optim.install()
        except Exception as exc:
            health.error("capture", "the optimizer capture could not be installed", exc)
        steps.TRACKER[0] = self.steps
        optim.closer[0] = self.steps.on_optimizer_step
        signals.install(lambda: self.close(restore=False), self.flush, self.on_uncaught, self.closing_here)
        c10d._on_init.append(self.on_process_group)
        c10d._on_destroy.append(self.on_destroy)
        groups.ON_NEW_GROUP.append(self.on_group)
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
        disabled = self.cfg.disabled_captures
        try:
            if "ddp" not in disabled:
                ddp.adopt_existing()
        except Exception as exc:
            health.error("ddp", "could not adopt DDP models built before instrument()", exc)
        try:
            if "dtensor" not in disabled:
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
        if self.pid != os.getpid():
            _rank_of_a_fork(self)
            return
        with self._lock:
            self._end_by = None  # a process group after destroy_process_group(): that was not the end
            if self._closed:
                return
            if self.identity is None:
                self._set_identity(resolve(self.cfg.run_id))
                return
            ident = self.identity
        if self.ranks.left:
            import torch.distributed as dist

            self.ranks.rejoin(ident, dist.get_rank(), dist.get_world_size())

    def on_group(self) -> None:
        """A group is met: the process group exists, though this runtime may not have seen it made (the
        program bound init_process_group before instrument(); init_device_mesh binds its own): all its
        telemetry waited in the queue, and was lost at exit."""
        if not self._closed and self._group_unknown():
            self.on_process_group()

    def _group_unknown(self) -> bool:
        """A process group exists that this runtime has not learnt of."""
        if self.identity is not None:
            return False
        import torch.distributed as dist

        return dist.is_available() and dist.is_initialized()

    def _unseen(self) -> None:
        """A process group exists, and not one collective went through the instrumentation: say so once, and
        the likely cause, rather than end with no run folder and no summary."""
        if self._group_unknown():
            health.warn_once(
                "unseen", "a process group exists but no collective went through otel-torchdist. A collective "
                "function the program imported by name before instrument() (from torch.distributed import "
                "all_reduce) is torch's own: call it as dist.all_reduce, or import it after instrument()",
            )  # fmt: skip

    def _set_identity(self, ident: Identity) -> None:
        self.identity = ident
        self.components = make_components(self.cfg)
        extra = dict(self.cfg.resource_attributes)
        for comp in self.components:
            try:
                extra.update(comp.resource_attributes())
            except Exception as exc:
                health.error("component", f"{comp.name} could not describe the run", exc)
        self.outlets.open(ident, self._run_dir_ok, extra)
        for comp in self.components:
            try:
                comp.start(self)
                self.pipeline.metric_sources.append(comp.metric_data)
            except Exception as exc:
                health.error("component", f"{comp.name} could not start", exc)
        logs.set_rank(ident.rank)
        self.ranks.start(ident, self)
        report.announce(self.cfg, ident, self.outlets.destinations)

    # the parts other code reads
    @property
    def folder(self) -> str | None:
        """The run folder, once opened."""
        return self.outlets.folder

    @property
    def prometheus(self) -> Any:
        return self.outlets.prometheus

    @property
    def watchdog(self) -> Any:
        return self.ranks.watchdog

    @property
    def exchange(self) -> Any:
        return self.ranks.exchange

    # -------------------------------------------------------------------------------------------- end
    def on_uncaught(self, exc: BaseException) -> None:
        self.steps.fail(type(exc).__name__, str(exc)[:1024])

    def on_destroy(self, group: Any) -> None:
        from torch.distributed import distributed_c10d as cd

        if group is None or group is cd._world.default_pg:
            self._unseen()
            self.ranks.leave_store(self.end_budget())  # its threads talk to the store being destroyed
            self.flush(self.end_budget())

    def end_budget(self) -> float:
        """Seconds the process's end may still wait for telemetry. Its end flushes (destroy_process_group()'s,
        uninstrument()'s, exit's) share one ``flush_timeout``, started by the first: a backend that never
        answers costs the end of the job one flush_timeout, however many of them it passes."""
        with self._lock:
            if self._end_by is None:
                self._end_by = time.monotonic() + self.cfg.flush_timeout
            return max(0.0, self._end_by - time.monotonic())

    def flush(self, timeout: float | None = None) -> bool:
        if timeout is None:
            timeout = self.cfg.flush_timeout
            with self._lock:  # reentrant: end_budget() takes it too
                if self._end_by is not None:  # the process is ending: a flush of yours is one more of its flushes
                    timeout = min(timeout, self.end_budget())
        return self.pipeline.flush(timeout)

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

    def abandon(self) -> None:
        """In a fork of the process that made this runtime: its patches and hooks out of the process, nothing
        flushed or reported (what it holds is the parent's, which the parent exports)."""
        with self._lock:
            self._closed = True
        self._restore()
        self._unhook()
        native_hot.deactivate()
        otlp.use_native(None)
        ddp_native.deactivate(True)

    def _restore(self) -> None:
        later.cancel()
        self.patcher.restore()
        optim.remove()
        context.TRACKER.remove()
        signals.uninstall()

    def _unhook(self) -> None:
        for hooks, fn in ((c10d._on_init, self.on_process_group), (c10d._on_destroy, self.on_destroy), (groups.ON_NEW_GROUP, self.on_group)):
            if fn in hooks:
                hooks.remove(fn)
        if optim.closer[0] == self.steps.on_optimizer_step:
            optim.closer[0] = None
        dataloader_capture.FETCH[0] = None
        if steps.TRACKER[0] is self.steps:
            steps.TRACKER[0] = None

    def _close(self, restore: bool) -> None:
        if restore:
            self._restore()
        if not self._started:
            return  # refused at start: nothing ran, nothing to flush or report
        funcol.flush_unfinished()
        self._unhook()
        self.steps.close()
        steps.TRACKER[0] = None
        dog = self.ranks.watchdog
        if dog is not None:
            dog.stop()
        self.ranks.leave_store(self.end_budget())
        if dog is not None:
            # A rank told to stop while stuck in a collective: say which one, as unfinished.
            for rec in dog.blocking_in_flight():
                stuck = list(rec)
                record.complete(stuck, n.END_UNFINISHED)
        completion.flush_unfinished()
        # the completion hook's last reports first: DDP's native entries on NCCL wait for theirs too
        nccl.flush_pending(min(1.0, self.end_budget()))
        for rec in ddp_native.abandon(self.steps):
            record.complete(rec, n.END_UNFINISHED)
        self._unseen()
        # No process group ever: nothing was captured (collectives need one). A helper process of the job (a
        # launcher's, multiprocessing's resource tracker, a spawned DataLoader worker, all instrumented by
        # opentelemetry-instrument's sitecustomize) writes no run folder and prints no summary.
        for comp in self.components:
            try:
                comp.stop()
            except Exception as exc:
                health.error("component", f"{comp.name} could not stop", exc)
        self.outlets.finish_node(self.end_budget())
        self.pipeline.stop(self.end_budget())
        self.outlets.close_meter()
        native_hot.deactivate()
        otlp.use_native(None)
        otlp.name_spans_for_rank(None)
        ddp_native.deactivate(restore)
        if self.identity is not None:
            report.summarize(self.cfg, self.identity, self.pipeline, self.steps, self.outlets, self._started_at)
        self.outlets.stop_prometheus()


def _rank_of_a_fork(inherited: Runtime) -> None:
    """A fork of an instrumented process made a process group: it is a rank (notebook and fork launchers:
    Lightning's ddp_fork and ddp_notebook, accelerate's notebook_launcher, ``start_method="fork"``), and
    gets its own instrumentation, with the options of the one it inherited, whose patches and queue were the
    parent's and whose threads did not survive the fork."""
    inherited.abandon()
    rt = Runtime(inherited.cfg, *inherited.outlets.given)
    try:
        rt.start()
    except Exception as exc:
        rt.close(restore=True)
        health.error("identity", "could not instrument the rank this fork became", exc)
        return
    install(rt)
