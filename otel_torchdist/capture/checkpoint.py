"""``torch.distributed.checkpoint`` save, async_save and load: a span each, with bytes and duration.

The span covers the call (for ``async_save``: until its future completes), its collectives (planning,
metadata exchange) are its children with phase ``checkpoint``, and the checkpoint histogram and byte
counter are updated. Bytes are this rank's tensor bytes found in the state dict (DTensor and sharded
tensors count their local shards); objects that produce their state only when asked (``Stateful``) are
not asked, so their tensors are not counted.
"""

from __future__ import annotations

import os
import threading
from time import perf_counter_ns
from typing import Any

import torch

from .. import health
from .. import names as n
from ..patching import Patch
from . import context, framework_spans
from . import record as R
from .dtensor import _binding_patches


_ASYNC_THREAD = "AsyncCheckpointExecutor"  # thread name prefix of DCP's async executor


def _tensor_bytes(obj: Any) -> tuple[int, int]:
    total = count = 0
    stack = [obj]
    seen: set[int] = set()  # containers met already: a state dict may hold a reference cycle
    while stack:
        x = stack.pop()
        if isinstance(x, (dict, list, tuple)):
            if id(x) in seen:
                continue
            seen.add(id(x))
        if isinstance(x, torch.Tensor):
            local = getattr(x, "_local_tensor", None)
            if local is not None:
                x = local
            elif hasattr(x, "local_shards"):
                for shard in x.local_shards():
                    stack.append(shard.tensor)
                continue
            total += x.nbytes
            count += 1
        elif isinstance(x, dict):
            stack.extend(x.values())
        elif isinstance(x, (list, tuple)):
            stack.extend(x)
    return total, count


def _failure(future: Any) -> BaseException | None:
    """What a save's future ended with: its exception, or its cancellation (which ``exception()`` raises)."""
    try:
        return future.exception()
    except BaseException as exc:  # CancelledError: the span still ends, with it
        return exc


def _checkpoint_id(kwargs: dict) -> str | None:
    cid = kwargs.get("checkpoint_id")
    if cid is None:
        storage = kwargs.get("storage_writer") or kwargs.get("storage_reader")
        cid = getattr(storage, "path", None) or getattr(storage, "checkpoint_id", None)
    return os.fspath(cid) if cid is not None else None


def _wrap(op: str, span_name: str, is_async: bool):
    def make(orig):
        def wrapper(*args, **kwargs):
            if R.TLS.outer is not None:
                return orig(*args, **kwargs)
            if threading.current_thread().name.startswith(_ASYNC_THREAD):
                # async_save's own background save: its span is the async_save's, already open (and its
                # context, the parent of its collectives, came with it: _wrap_execute_save).
                token = context.push(phase="checkpoint")
                try:
                    return orig(*args, **kwargs)
                finally:
                    context.pop(token)
            try:
                state_dict = args[0] if args else kwargs.get("state_dict")
                nbytes, tensors = _tensor_bytes(state_dict)
                attrs: list[tuple[str, Any]] = [(n.CKPT_BYTES, nbytes), (n.CKPT_TENSORS, tensors), (n.CKPT_ASYNC, is_async)]
                cid = _checkpoint_id(kwargs)
                if cid:
                    attrs.append((n.CKPT_ID, cid))
                snap = framework_spans.snapshot()
                opened = framework_spans.open_span(snap)
                token = context.push(phase="checkpoint", parent=(opened[0], opened[1]))
            except Exception as exc:
                health.error("checkpoint", f"could not describe a checkpoint {op}", exc)
                return orig(*args, **kwargs)
            t_start = perf_counter_ns()

            def finish(error: BaseException | None = None) -> None:
                t_end = perf_counter_ns()
                seconds = (t_end - t_start) / 1e9

                metrics = ((R.OBSERVE, n.CHECKPOINT_DURATION, (op,), seconds), (R.ADD, n.CHECKPOINT_BYTES, (op,), nbytes))
                err = None
                if error is not None:
                    etype, message = R.error_info(error)
                    err = f"{etype.rsplit('.', 1)[-1]}: {message}"
                framework_spans.span_later(span_name, t_start, t_end, attrs, snap, opened, error=err, then=metrics)

            try:
                result = orig(*args, **kwargs)
            except BaseException as exc:
                context.pop(token)
                finish(exc)
                raise
            context.pop(token)
            if is_async:
                # A Future, or an AsyncSaveResponse whose upload completion is the end of the save.
                future = result if hasattr(result, "add_done_callback") else getattr(result, "upload_completion", None)
                if hasattr(future, "add_done_callback"):
                    future.add_done_callback(lambda f: finish(_failure(f)))
                    return result
            finish()
            return result

        wrapper.__wrapped__ = orig
        for attr in ("__name__", "__qualname__", "__doc__", "__module__"):
            setattr(wrapper, attr, getattr(orig, attr, None))
        return wrapper

    return make


def _wrap_execute_save(orig):
    """The thread-based async executor's ``execute_save`` (on the caller's thread, inside ``async_save``):
    the save it submits runs on the executor's own thread, which gets the caller's context, so its
    collectives are children of the async_save's span, as a synchronous save's are of its own."""

    def execute_save(self, *args, **kwargs):
        ctx = R.TLS.ctx
        pool = getattr(self, "_executor", None)
        if ctx is None or not callable(getattr(pool, "submit", None)):
            return orig(self, *args, **kwargs)
        submit = pool.submit

        def submit_in_context(fn, /, *a, **k):
            def run(*fa, **fk):
                token = R.TLS.ctx
                R.TLS.ctx = ctx
                try:
                    return fn(*fa, **fk)
                finally:
                    R.TLS.ctx = token

            return submit(run, *a, **k)

        pool.submit = submit_in_context  # this call's pool only (a pool of one thread, made for this save)
        try:
            return orig(self, *args, **kwargs)
        finally:
            try:
                del pool.submit
            except AttributeError:
                pass

    execute_save.__wrapped__ = orig
    return execute_save


def patches() -> list[Patch]:
    try:
        from torch.distributed.checkpoint import state_dict_loader, state_dict_saver
    except ImportError:
        return []
    out: list[Patch] = []
    try:
        from torch.distributed.checkpoint._async_thread_executor import _ThreadBasedAsyncCheckpointExecutor

        out.append(Patch(_ThreadBasedAsyncCheckpointExecutor, "execute_save", _wrap_execute_save))
    except ImportError:
        pass
    out += _binding_patches(state_dict_saver.save, "save", _wrap("save", n.SPAN_CHECKPOINT_SAVE, False))
    out += _binding_patches(state_dict_loader.load, "load", _wrap("load", n.SPAN_CHECKPOINT_LOAD, False))
    if hasattr(state_dict_saver, "async_save"):
        out += _binding_patches(
            state_dict_saver.async_save, "async_save", _wrap("save", n.SPAN_CHECKPOINT_SAVE, True)
        )
    return out
