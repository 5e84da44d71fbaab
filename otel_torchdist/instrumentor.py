"""``TorchDistributedInstrumentor``: the opentelemetry-instrumentation entry point.

Registered in the ``opentelemetry_instrumentor`` entry-point group, so ``opentelemetry-instrument`` finds
it; ``otel_torchdist.instrument()`` is the same thing as a function. Idempotent: a second ``instrument()``
changes nothing and warns, naming each option it ignored; ``uninstrument()`` restores every patched
attribute to the identical original object and flushes telemetry.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Collection, Sequence
from typing import TYPE_CHECKING, Any

from opentelemetry.instrumentation.instrumentor import BaseInstrumentor
from opentelemetry.metrics import MeterProvider
from opentelemetry.trace import TracerProvider

from . import config as _config
from .export import providers as _providers
from .package import _instruments

if TYPE_CHECKING:
    from .runtime import Runtime


class TorchDistributedInstrumentor(BaseInstrumentor):
    def instrumentation_dependencies(self) -> Collection[str]:
        return _instruments

    def instrument(self, **kwargs: Any) -> Any:
        # The runtime (and torch) only once instrumenting: without torch, BaseInstrumentor's dependency check
        # says so, as contrib's instrumentors do, and the CLI's analysis commands work without torch.
        runtime = sys.modules.get("otel_torchdist.runtime")
        running = runtime.current() if runtime is not None else None
        if self._is_instrumented_by_opentelemetry and running is not None:
            _warn_ignored(running, kwargs)
            return None
        if running is None and runtime is not None and runtime.process.inherited():
            # a fork of an instrumented process (a rank a fork launcher started) instruments itself
            runtime.process.abandon_inherited()
            self._is_instrumented_by_opentelemetry = False
        return super().instrument(**kwargs)

    def _instrument(self, **kwargs: Any) -> None:
        if torch_launcher():
            # opentelemetry-instrument runs every Python process of `torchrun train.py` through its
            # sitecustomize, the launcher too: the workers are what is trained, and each instruments itself.
            logging.getLogger("otel_torchdist").debug("otel-torchdist: %s is torch's launcher, not instrumented", sys.orig_argv)
            return
        tracer_provider = kwargs.pop("tracer_provider", None)
        meter_provider = kwargs.pop("meter_provider", None)
        _providers.check("tracer_provider", tracer_provider, TracerProvider)
        _providers.check("meter_provider", meter_provider, MeterProvider)
        cfg = _config.load(kwargs)
        if cfg.disabled:
            return
        from . import runtime as _runtime

        rt = _runtime.Runtime(cfg, tracer_provider, meter_provider)
        try:
            rt.start()
        except BaseException:
            rt.close(restore=True)
            raise
        _runtime.install(rt)

    def _uninstrument(self, **kwargs: Any) -> None:
        from . import runtime as _runtime

        _runtime.process.abandon_inherited()
        rt = _runtime.remove()
        if rt is not None:
            rt.close(restore=True)


_BASE_OPTIONS = ("skip_dep_check", "raise_exception_on_conflict")


def _warn_ignored(running: Runtime, options: dict[str, Any]) -> None:
    """BaseInstrumentor's own warning names no option: a user who passed service_name= a second time
    needs to know it is not in force, and what is."""
    log = logging.getLogger("otel_torchdist")
    changed = []
    for name, value in sorted(options.items()):
        if name in _BASE_OPTIONS:
            continue  # BaseInstrumentor's own, for its dependency check
        if name in ("tracer_provider", "meter_provider"):
            now = running.outlets.given[0 if name == "tracer_provider" else 1]
            if value is not None and value is not now:
                changed.append(f"{name} (a different provider)")
        elif value is not None and name in _config.OPTION_NAMES and getattr(running.cfg, name) != value:
            changed.append(f"{name}={value!r} (in force: {getattr(running.cfg, name)!r})")
        elif name not in _config.OPTION_NAMES:
            changed.append(f"{name} (not an option)")
    if changed:
        log.warning(
            "otel-torchdist: already instrumented; ignored %s. Call otel_torchdist.uninstrument() first to change options",
            ", ".join(changed),
        )
    else:
        log.warning("otel-torchdist: already instrumented; instrument() again changes nothing")


_LAUNCHERS = ("torch.distributed.run", "torch.distributed.launch")
_ARG_OPTIONS = ("-X", "-W", "--check-hash-based-pycs")  # interpreter options followed by a value


def torch_launcher(argv: Sequence[str] | None = None) -> bool:
    """Whether this process is torch's launcher (``torchrun``, ``python -m torch.distributed.run`` or
    ``.launch``), told from the command line the interpreter was started with (``sys.orig_argv``: at
    sitecustomize time ``__main__`` is still empty and ``sys.argv`` lacks ``-m``'s module)."""
    argv = list(getattr(sys, "orig_argv", sys.argv) if argv is None else argv)
    i = 1
    while i < len(argv):
        arg = argv[i]
        if arg in _ARG_OPTIONS:
            i += 2
            continue
        if arg.startswith("--") or arg == "-":
            i += 1
            continue
        if arg.startswith("-"):
            flags = arg[1:]
            for j, flag in enumerate(flags):
                if flag == "c":
                    return False
                if flag == "m":
                    module = flags[j + 1 :] or (argv[i + 1] if i + 1 < len(argv) else "")
                    return module in _LAUNCHERS
                if flag in "XW":
                    i += 0 if flags[j + 1 :] else 1  # its value follows
                    break
            i += 1
            continue
        script = arg.replace("\\", "/")
        name = os.path.basename(script).removesuffix(".exe").removesuffix("-script.py")
        return name == "torchrun" or script.endswith(("torch/distributed/run.py", "torch/distributed/launch.py"))
    return False
