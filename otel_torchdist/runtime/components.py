"""Components: what runs beside the capture once a rank's identity is known (the system sampler), registered
by their modules as factories."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .. import health

if TYPE_CHECKING:
    from . import Runtime


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


def make_components(cfg: Any) -> list[Component]:
    _load_builtin_components()
    out = []
    for factory in COMPONENTS:
        try:
            comp = factory(cfg)
        except Exception as exc:
            health.error("component", f"{getattr(factory, '__name__', factory)} could not be created", exc)
            continue
        if comp is not None:
            out.append(comp)
    return out
