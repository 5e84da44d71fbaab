"""The folders show the design (docs/architecture.md): data flows one way, training thread (capture/) ->
drain (drain/) -> emit (export/), and only export/ knows OpenTelemetry. Read from the imports themselves."""

from __future__ import annotations

import ast
import pathlib

PKG = pathlib.Path(__file__).resolve().parent.parent / "otel_torchdist"

# Known exceptions, each named in docs/architecture.md "Where it stands" (none now: the caller's OpenTelemetry
# context is read through functions export/caller_context.py installs in capture/caller.py).
EXCEPTIONS: set[tuple[str, str]] = set()


def _imports(path: pathlib.Path) -> set[str]:
    """Absolute names of the modules ``path`` imports (relative imports resolved)."""
    rel = path.relative_to(PKG.parent).with_suffix("")
    package = list(rel.parts[:-1])  # a module's package; for an __init__, the package itself
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module
            names.add(mod)
            names.update(f"{mod}.{a.name}" for a in node.names)  # a submodule, or a name: either way seen
    return names


def _violations(folder: str, forbidden: tuple[str, ...]) -> list[str]:
    found = []
    for path in sorted((PKG / folder).rglob("*.py")):
        where = str(path.relative_to(PKG))
        for name in _imports(path):
            for bad in forbidden:
                allowed = any(where == w and (name == x or name.startswith(x + ".")) for w, x in EXCEPTIONS)
                if (name == bad or name.startswith(bad + ".")) and not allowed:
                    found.append(f"{where} imports {name}")
    return found


def test_capture_knows_neither_the_drain_nor_the_export_nor_opentelemetry():
    assert _violations("capture", ("otel_torchdist.drain", "otel_torchdist.export", "opentelemetry")) == []


def test_the_drain_knows_neither_the_export_nor_opentelemetry():
    assert _violations("drain", ("otel_torchdist.export", "opentelemetry")) == []


def test_the_checker_sees_relative_imports():
    """The rules above would pass on a reader that saw nothing: it must see relative imports at any depth."""
    assert "opentelemetry.trace" in _imports(PKG / "export" / "caller_context.py")
    assert "otel_torchdist.capture.step_context" in _imports(PKG / "export" / "caller_context.py")
    assert "otel_torchdist.capture.record" in _imports(PKG / "drain" / "pipeline.py")
    assert "otel_torchdist.ids" in _imports(PKG / "capture" / "framework_spans.py")
    assert _violations("export", ("opentelemetry",)) != []  # a real import is seen


def _drain_work_in(folder: str) -> list[str]:
    """Functions under ``folder`` that take the pipeline: drain work (metric updates, span building)."""
    found = []
    for path in sorted((PKG / folder).rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                args = node.args
                if any(a.arg == "pipeline" for a in args.posonlyargs + args.args + args.kwonlyargs):
                    found.append(f"{path.relative_to(PKG)}:{node.lineno}")
    return found


def test_capture_holds_no_drain_work():
    """The training thread hands the drain data (records, deferred entries, metric updates), never
    functions of the drain's state: those live in drain/ and are found there by a reserved name."""
    assert _drain_work_in("capture") == []
    assert _drain_work_in("drain") != []  # the reader sees drain work where it is


def test_the_callers_context_functions_are_read_at_the_call():
    """capture/caller.py's get_current and span_context are installed by the export side when instrumentation
    starts: a module that bound them at import would keep the placeholder and record no caller's span."""
    found = []
    for folder in ("capture", "drain"):
        for path in sorted((PKG / folder).rglob("*.py")):
            tree = ast.parse(path.read_text())
            for node in ast.walk(tree):
                if isinstance(node, ast.ImportFrom) and (node.module or "").endswith("caller"):
                    found += [f"{path.name}: from {node.module} import {a.name}" for a in node.names if a.name in ("get_current", "span_context")]
            for node in tree.body:  # module level
                if isinstance(node, ast.Assign) and isinstance(node.value, ast.Attribute):
                    if ast.unparse(node.value) in ("caller.get_current", "caller.span_context"):
                        found.append(f"{path.name}: {ast.unparse(node)}")
    assert found == []
