"""Who this process is: rank, world, host, and the run id every rank of one job shares.

The run id comes from, in order: the ``run_id`` option / ``OTEL_TORCHDIST_RUN_ID``; ``TORCHELASTIC_RUN_ID``
(torchrun; ``none`` means unset); ``SLURM_JOB_ID`` (with ``SLURM_STEP_ID`` when set); otherwise rank 0 makes
one and the others read it from the process group's key-value store. The store is used rather than a
collective on purpose: it does not advance any group's sequence number or show up among the user's
collectives.

Under torchelastic the run id stays the same across restarts, and so does the store (the agent's, which
outlives its workers), while step numbering starts again. The ranks of one attempt therefore also agree an
*attempt* value, mixed into the step trace and span ids and the straggler exchange's store keys, so that
a restarted job makes no id or key a previous attempt made. ``TORCHELASTIC_RESTART_COUNT`` cannot serve:
it is counted per node agent, and the agents whose workers did not fail restart them without counting.
"""

from __future__ import annotations

import datetime
import logging
import os
import secrets
import socket
import time
import weakref
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from . import names as n
from ._version import __version__
from .capture import groups

_log = logging.getLogger(__name__)

STORE_KEY = "otel_torchdist/run_id"
ATTEMPT_KEY = "otel_torchdist/attempt"
STORE_TIMEOUT = datetime.timedelta(seconds=60)
_IMPORTED_AT = time.time()
_generations: dict[str, int] = {}  # run id -> identities resolved with it in this process


@dataclass(frozen=True, kw_only=True)
class Identity:
    rank: int
    local_rank: int
    world_size: int
    local_world_size: int | None
    node_rank: int | None
    host: str
    backend: str
    run_id: str
    restart_count: int
    instance_id: str
    distributed: bool
    """False when no process group was ever initialized (a single process)."""
    attempt: str = ""
    """Under torchelastic, a value the ranks of this attempt share and no other attempt has; else empty."""
    generation: int = 0
    """How many instrumentations of this process had this run id before this one (uninstrument() and
    instrument() again): every rank that re-instruments alike counts alike."""

    @property
    def trace_key(self) -> str:
        """What step ids and store keys derive from: the run id, the attempt when there is one, and the
        generation after the first instrumentation (whose steps' ids a second one repeated, step for step,
        and whose store keys it read)."""
        key = f"{self.run_id}/{self.attempt}" if self.attempt else self.run_id
        return f"{key}~{self.generation}" if self.generation else key


def new_run_id() -> str:
    return time.strftime("%Y%m%d-%H%M%S") + "-" + secrets.token_hex(3)


def _env_int(name: str) -> int | None:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return None
    try:
        return int(raw)
    except ValueError:
        return None


def run_id_from_env(configured: str | None) -> str | None:
    if configured:
        return configured
    elastic = os.environ.get("TORCHELASTIC_RUN_ID")
    if elastic and elastic.lower() != "none":
        return sanitize(elastic)
    slurm = os.environ.get("SLURM_JOB_ID")
    if slurm:
        step = os.environ.get("SLURM_STEP_ID")
        return sanitize(f"slurm-{slurm}" + (f".{step}" if step else ""))
    return None


def sanitize(raw: str) -> str:
    return "".join(c if (c.isalnum() or c in "-_.") else "-" for c in raw)[:128]


# What the ranks agreed through the store, by key, with the default group it was agreed on: instrument()
# again on the same group (after uninstrument()) keeps it, since the key stays in the store and a rank
# reading before rank 0 writes again would take the old value while rank 0 made a new one.
_agreed: dict[str, tuple[Any, str]] = {}  # store key -> (weak reference to the default group, value)


def _agreed_before(key: str, pg: Any) -> str | None:
    found = _agreed.get(key)
    return found[1] if found is not None and found[0]() is pg else None


def _remember(key: str, pg: Any, value: str) -> str:
    _agreed[key] = (weakref.ref(pg), value)
    return value


def _agree_run_id(rank: int) -> str:
    """Rank 0 proposes a run id; the others read it from the default store (bounded wait). torchelastic's
    store outlives the workers: rank 0 keeps the id an earlier attempt agreed there, so a restarted job
    stays one run, and ranks reading the key before rank 0 looks at it read the id it keeps."""
    from torch.distributed import distributed_c10d as c10d

    try:
        pg = c10d._get_default_group()
        before = _agreed_before(STORE_KEY, pg)
        if before is not None:
            return before
        store = c10d._get_default_store()
        if rank == 0:
            run_id = store.compare_set(STORE_KEY, "", new_run_id()).decode()
        else:
            store.wait([STORE_KEY], STORE_TIMEOUT)
            run_id = store.get(STORE_KEY).decode()
        return _remember(STORE_KEY, pg, run_id)
    except Exception as exc:
        run_id = new_run_id()
        if dist.get_backend() == "fake":
            return run_id  # a single process pretending to be many: nobody to agree with
        _log.warning(
            "otel-torchdist: rank %d could not read the run id from the store (%s); using %s. Set "
            "OTEL_TORCHDIST_RUN_ID to the same value on every rank to group them.",
            rank,
            exc,
            run_id,
        )
        return run_id


def process_start_time() -> float:
    """When this process started, in seconds since the epoch (Linux /proc, to the clock tick); elsewhere when
    otel_torchdist was imported."""
    try:
        with open("/proc/self/stat") as f:
            ticks = int(f.read().rsplit(")", 1)[1].split()[19])  # field 22, starttime, in ticks since boot
        age = time.clock_gettime(time.CLOCK_BOOTTIME) - ticks / os.sysconf("SC_CLK_TCK")
        return time.time() - age
    except (OSError, ValueError, IndexError, AttributeError):
        return _IMPORTED_AT


# A value older than the reader's own start (less this much clock difference between hosts) was written by a
# previous attempt. Rank 0 writes after its init_process_group, which waits for every rank to have started.
ATTEMPT_CLOCK_SLACK_S = 0.25
ATTEMPT_POLL_S = 0.05
# Shorter than the run id's wait: torchrun gives the run id, so this wait is new to such jobs, and a rank 0
# that instruments late (or never) must not hold the others up long. Ranks resolve within moments of each
# other (right after init_process_group, or at instrument() in the same script).
ATTEMPT_TIMEOUT = datetime.timedelta(seconds=10)


def _agree_attempt(rank: int, restart: int) -> str:
    """Rank 0 writes a fresh value with its write time; the others take the first one written after they
    started (bounded wait). On failure, the restart count: shared by the ranks of a node, at least."""
    from torch.distributed import distributed_c10d as c10d

    try:
        pg = c10d._get_default_group()
        before = _agreed_before(ATTEMPT_KEY, pg)
        if before is not None:
            return before
        store = c10d._get_default_store()
        if rank == 0:
            value = secrets.token_hex(4)
            store.set(ATTEMPT_KEY, f"{time.time():.6f} {value}")
            return _remember(ATTEMPT_KEY, pg, value)
        started = process_start_time() - ATTEMPT_CLOCK_SLACK_S
        deadline = time.monotonic() + ATTEMPT_TIMEOUT.total_seconds()
        while True:
            store.wait([ATTEMPT_KEY], datetime.timedelta(seconds=max(0.001, deadline - time.monotonic())))
            written, value = store.get(ATTEMPT_KEY).decode().split(" ", 1)
            if float(written) >= started:
                return _remember(ATTEMPT_KEY, pg, value)
            if time.monotonic() >= deadline:
                raise TimeoutError(f"only a previous attempt's value (written at {written})")
            time.sleep(ATTEMPT_POLL_S)
    except Exception as exc:
        _log.warning(
            "otel-torchdist: rank %d could not agree this elastic attempt with rank 0 through the store (%s); "
            "its step traces may not join the other nodes' ones.",
            rank,
            exc,
        )
        return f"restart{restart}"


def resolve(configured_run_id: str | None) -> Identity:
    """This process's identity, now. Call after ``init_process_group`` when there is one."""
    restart = _env_int("TORCHELASTIC_RESTART_COUNT") or 0
    host = socket.gethostname()
    if dist.is_available() and dist.is_initialized():
        rank = dist.get_rank()
        world = dist.get_world_size()
        backend = groups.backend_name()
        run_id = run_id_from_env(configured_run_id) or _agree_run_id(rank)
        distributed = True
        elastic = os.environ.get("TORCHELASTIC_RUN_ID") is not None and world > 1 and backend != "fake"
        attempt = _agree_attempt(rank, restart) if elastic else ""
    else:
        rank = _env_int("RANK") or 0
        world = _env_int("WORLD_SIZE") or 1
        backend = "none"
        run_id = run_id_from_env(configured_run_id) or new_run_id()
        distributed = False
        attempt = ""
    local_rank = _env_int("LOCAL_RANK")
    if local_rank is None:
        local_rank = rank  # one host (mp.spawn); torchrun always sets LOCAL_RANK
    node_rank = _env_int("GROUP_RANK")
    if node_rank is None:
        node_rank = _env_int("SLURM_NODEID")
    # Unique per rank and run, and per elastic attempt: a restarted rank is a new instance.
    instance_id = f"{run_id}-rank{rank}" + (f"-attempt{restart}" if restart else "")
    generation = _generations.get(run_id, 0)
    _generations[run_id] = generation + 1
    return Identity(
        rank=rank,
        local_rank=local_rank,
        world_size=world,
        local_world_size=_env_int("LOCAL_WORLD_SIZE"),
        node_rank=node_rank,
        host=host,
        backend=backend,
        run_id=run_id,
        restart_count=restart,
        instance_id=instance_id,
        distributed=distributed,
        attempt=attempt,
        generation=generation,
    )


def resource_attributes(identity: Identity, service_name: str, extra: dict[str, str]) -> dict[str, Any]:
    """This rank's resource: what the library finds of the standard attributes, under the application's own
    (``extra``: ``OTEL_RESOURCE_ATTRIBUTES``, ``resource_attributes``, which win as they win over the SDK's
    detectors: a node name for ``host.name`` on Kubernetes, say), then the library's own ``torchdist.*``."""
    attrs: dict[str, Any] = {
        n.SERVICE_INSTANCE_ID: identity.instance_id,
        n.HOST_NAME: identity.host,
        n.PROCESS_PID: os.getpid(),
    }
    attrs.update(extra)
    attrs.update(
        {
            n.SERVICE_NAME: service_name,
            n.RUN_ID: identity.run_id,
            n.RANK: identity.rank,
            n.LOCAL_RANK: identity.local_rank,
            n.WORLD_SIZE: identity.world_size,
            n.BACKEND: identity.backend,
            n.TORCH_VERSION: torch.__version__,
            n.RESTART_COUNT: identity.restart_count,
            n.LIBRARY_VERSION: __version__,
        }
    )
    if identity.local_world_size is not None:
        attrs[n.LOCAL_WORLD_SIZE] = identity.local_world_size
    if identity.node_rank is not None:
        attrs[n.NODE_RANK] = identity.node_rank
    return attrs
