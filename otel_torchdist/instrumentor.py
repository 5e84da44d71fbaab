"""``TorchDistributedInstrumentor``: the opentelemetry-instrumentation entry point.

Registered in the ``opentelemetry_instrumentor`` entry-point group, so ``opentelemetry-instrument`` finds
it; ``otel_torchdist.instrument()`` is the same thing as a function. Idempotent: a second ``instrument()``
warns and changes nothing; ``uninstrument()`` restores every patched attribute to the identical original
object and flushes telemetry.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Collection, Sequence
from typing import Any

from opentelemetry.instrumentation.instrumentor import BaseInstrumentor
from opentelemetry.metrics import MeterProvider
from opentelemetry.trace import TracerProvider

from . import config as _config
from . import runtime as _runtime
from .export import providers as _providers
from .package import _instruments


class TorchDistributedInstrumentor(BaseInstrumentor):
    def instrumentation_dependencies(self) -> Collection[str]:
        return _instruments

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
        rt = _runtime.Runtime(cfg, tracer_provider, meter_provider)
        try:
            rt.start()
        except BaseException:
            rt.close(restore=True)
            raise
        _runtime.install(rt)

    def _uninstrument(self, **kwargs: Any) -> None:
        rt = _runtime.remove()
        if rt is not None:
            rt.close(restore=True)


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
