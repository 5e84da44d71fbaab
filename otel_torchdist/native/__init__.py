"""otel-torchdist's native part: a C++ process group that records DDP's reducer without Python, the c10d
wrapper's common case in C++ (``hot_path.cpp``, see ``capture/native_hot.py``), and on the drain thread the
span encoders (``encode.cpp``, see ``otlp.use_native``) and the fold of unsampled records into the metrics
(``fold.cpp``, see ``Pipeline.use_native``).

DDP's reducer issues the gradient all-reduces from C++. Capturing them from Python takes a comm hook, and
any comm hook costs DDP a pass over each bucket (without one the reducer scales gradients while copying
them into the bucket), or a Python process group called from C++ per bucket: each about 1.5 % of a small
model's step on CPU. ``timed_group.cpp`` records them in C++ instead, handed to the reducer in place of the
model's group, at a cost of about 0.3 % (docs/performance.md).

It is compiled against the installed torch with torch's own extension builder (a C++ compiler and ninja
needed), once per torch version, with ``otel-torchdist build-native``, into a cache folder
(``OTEL_TORCHDIST_NATIVE_DIR``, default ``~/.cache/otel-torchdist/native``). ``instrument()`` never
compiles unless told to (``native="build"``): by default it loads a build that is there and otherwise
captures DDP through its comm hook.
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import logging
import os
import sys
import threading
from pathlib import Path
from types import ModuleType

_log = logging.getLogger("otel_torchdist")

SOURCES = tuple(Path(__file__).with_name(f) for f in ("timed_group.cpp", "hot_path.cpp", "encode.cpp", "fold.cpp"))
HEADERS = (Path(__file__).with_name("common.h"),)
NAME = "otel_torchdist_native"
VERSION = 12  # the C++ module's kVersion this Python side speaks

_lock = threading.Lock()
_loaded: ModuleType | None = None


class NativeBuildError(RuntimeError):
    """The native part could not be compiled here (the message says what is missing)."""


def cache_root() -> Path:
    explicit = os.environ.get("OTEL_TORCHDIST_NATIVE_DIR")
    if explicit:
        return Path(explicit).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "otel-torchdist" / "native"


def build_dir() -> Path:
    """The folder of the build for this torch, this Python and this source: a different one for each, so a
    torch upgrade never loads a build made against another ABI."""
    import torch

    digest = source_digest()
    abi = int(getattr(torch._C, "_GLIBCXX_USE_CXX11_ABI", 1))
    tag = f"torch{torch.__version__}-{sys.implementation.cache_tag}-abi{abi}-{digest}"
    return cache_root() / tag.replace("+", "_")


def source_digest() -> str:
    """What names a build: the sources' SHA-256, so a changed source never loads an older build."""
    h = hashlib.sha256()
    for source in SOURCES + HEADERS:
        h.update(source.read_bytes())
    return h.hexdigest()[:12]


def library_path() -> Path:
    return build_dir() / f"{NAME}.so"


def is_built() -> bool:
    return library_path().is_file()


def load(build: bool = False) -> ModuleType | None:
    """The native module: loaded from its build, compiled first when ``build`` and there is none. None when
    it is not built (and ``build`` is false). Raises NativeBuildError when a build or a load fails."""
    global _loaded
    if _loaded is not None:
        return _loaded
    with _lock:
        if _loaded is not None:
            return _loaded
        if not is_built():
            if not build:
                return None
            module = _compile(verbose=False)
        else:
            module = _import(library_path())
        found = getattr(module, "VERSION", None)
        if found != VERSION:
            raise NativeBuildError(f"{library_path()} is version {found}, this otel-torchdist needs {VERSION}")
        _loaded = module
        return module


def _import(path: Path) -> ModuleType:
    import torch.distributed  # noqa: F401  (the module derives from torch's ProcessGroup type)

    try:
        loader = importlib.machinery.ExtensionFileLoader(NAME, str(path))
        spec = importlib.util.spec_from_file_location(NAME, str(path), loader=loader)
        module = importlib.util.module_from_spec(spec)
        loader.exec_module(module)
        return module
    except Exception as exc:
        raise NativeBuildError(f"could not load {path}: {exc}") from exc


def build(verbose: bool = False) -> Path:
    """Compile the native part for the installed torch (about a minute on 2 cores); returns its path."""
    global _loaded
    with _lock:
        module = _compile(verbose)
        if getattr(module, "VERSION", None) == VERSION:
            _loaded = module
    return library_path()


def _compile(verbose: bool) -> ModuleType:
    import shutil

    from torch.utils import cpp_extension

    missing = ["ninja"] if shutil.which("ninja") is None else []
    compiler = os.environ.get("CXX", "c++")
    if shutil.which(compiler) is None:
        missing.append(f"a C++ compiler ({compiler}; set CXX to use another)")
    if missing:
        raise NativeBuildError(
            "cannot build otel-torchdist's native part: missing " + ", ".join(missing)
            + " (pip install ninja; apt-get install g++)"
        )
    folder = build_dir()
    folder.mkdir(parents=True, exist_ok=True)
    try:
        return cpp_extension.load(
            name=NAME, sources=[str(s) for s in SOURCES], build_directory=str(folder), extra_cflags=["-O2"], verbose=verbose
        )
    except Exception as exc:
        raise NativeBuildError(f"building otel-torchdist's native part in {folder} failed: {exc}") from exc


__all__ = ["NativeBuildError", "build", "build_dir", "cache_root", "is_built", "library_path", "load"]
