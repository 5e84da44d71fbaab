"""Install a capture when the program imports what it captures, not before.

FSDP, DTensor and distributed checkpoint pull in sympy and much of torch.distributed: importing them
costs about a second per process. A DDP-only program never imports them, so their captures wait for the
import, through wrapt's post-import hooks (the mechanism opentelemetry-instrumentation's own instrumentors
rely on). Anything that goes wrong in a capture's installation is counted and the import goes on unchanged:
telemetry must never break a user's import. wrapt keeps a hook until its module is imported, so ``cancel``
(``uninstrument()``) turns the hooks of this ``instrument()`` into no-ops, which let go of what they installed.
"""

from __future__ import annotations

from collections.abc import Callable

import wrapt

from .. import health

_waiting: dict[int, Callable[[], None]] = {}  # the hooks of this instrument(), until cancel()
_serial = [0]


def when_imported(module: str, hook: Callable[[], None]) -> None:
    """Run ``hook`` now if ``module`` is imported already, else right after the program imports it."""
    key = _serial[0] = _serial[0] + 1
    _waiting[key] = hook

    def run(_module) -> None:
        # wrapt keeps ``run`` until the import: it holds the key, never the hook (which holds the runtime,
        # its metric store and threads' objects, kept for the process after uninstrument() otherwise)
        hook = _waiting.pop(key, None)
        if hook is None:
            return
        try:
            hook()
        except Exception as exc:
            health.error("capture", f"a capture waiting for {module} could not be installed", exc)

    wrapt.register_post_import_hook(run, module)


def cancel() -> None:
    _waiting.clear()
