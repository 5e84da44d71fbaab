"""What we know about each process group, computed once per group and looked up by the hot path."""

from __future__ import annotations

import atexit
import collections
import itertools
import logging
import threading
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

from .. import names as n

_log = logging.getLogger(__name__)

SMALL_GROUP = 16  # member ranks are listed on spans for groups up to this size
P2P_MARKS = 4096  # point-to-point calls a group remembers the numbers of (GroupInfo.collective_number)
MAX_SERIES_GROUPS = 256
"""Groups whose collectives get metric series of their own (30 a pair of op and group, kept for the run, as
counters must be); the collectives of later groups, a program that makes a group per step or per
evaluation, share the series of group ``names.GROUP_OVERFLOW``, the label their spans carry too (with their
own group's name and description)."""

# How completion of an async collective can be observed on a backend.
COMPLETION_FUTURE = "future"  # Work.get_future() completes when the collective does (gloo, mpi, ucc, fake)
COMPLETION_NCCL_HOOK = "nccl_hook"  # ProcessGroupNCCL's on-completion hook with CUDA-event timing
COMPLETION_ENQUEUE = "enqueue"  # GPU backends without completion timing: only the launch is observable


class GroupInfo:
    __slots__ = (
        "gid",
        "pg",
        "name",
        "desc",
        "label",
        "series",
        "size",
        "rank",
        "backend",
        "ranks",
        "global_ranks",
        "seq_supported",
        "own_seq",
        "completion",
        "pending",
        "early",
        "lock",
        "span_attrs",
        "last_completed",
        "cpu_backend",
        "cpu_seq",
        "p2p_moved",
        "p2p_marks",
    )

    def __init__(self, pg: Any) -> None:
        self.gid = -1  # index into BY_ID, set when registered
        self.pg = pg
        self.name = _safe(lambda: pg.group_name, "?")
        self.desc = _safe(lambda: pg.group_desc, "")
        self.size = _safe(lambda: pg.size(), 0)
        self.rank = _safe(lambda: pg.rank(), -1)
        self.backend = backend_name(pg)
        # Several backends ("cpu:gloo,cuda:nccl"): NCCL's hook and sequence number are the group's, and a
        # call on CPU tensors runs on the CPU one, told apart by that backend's own number (c10d._finish).
        # The device map is torch's own record of the group: a group made without a backend on a GPU
        # machine is such a group too, though it names itself after its default backend only.
        self.cpu_backend: Any = None  # such a group's CPU backend (None: one backend)
        self.cpu_seq = 0  # its last number seen
        config = _safe(lambda: str(c10d._world.pg_backend_config[pg]), self.backend)
        if "nccl" in config and len({pair.rsplit(":", 1)[-1] for pair in config.split(",")}) > 1:
            try:
                cpu = pg._get_backend(torch.device("cpu"))
                self.cpu_seq = int(cpu._get_sequence_number_for_group())
                self.cpu_backend = cpu
            except Exception:
                pass  # no CPU backend that counts: every call is taken as NCCL's
        self.global_ranks: tuple[int, ...] = tuple(_safe(lambda: dist.get_process_group_ranks(pg), ()))
        self.ranks = self.global_ranks if self.size <= SMALL_GROUP else None
        self.label = ""
        self.series = ""  # the metrics' group label: the label, or names.GROUP_OVERFLOW
        try:
            pg._get_sequence_number_for_group()
            self.seq_supported = True
        except Exception:
            self.seq_supported = False  # e.g. the fake backend; we count ourselves
        self.own_seq = itertools.count(1)
        self.completion = COMPLETION_ENQUEUE if _is_gpu_backend(self.backend) else COMPLETION_FUTURE
        # for completion hooks joined on sequence number (capture/nccl.py): seq -> (Record, when it was filed,
        # the records of a coalescing block sharing its number)
        self.pending: dict[int, tuple[list, int, tuple]] = {}
        self.early: dict[int, list] = {}  # seq -> completions reported before its record was filed
        self.lock = threading.Lock()
        self.span_attrs: tuple = ()  # the group's own span attributes, shared by all its spans
        self.last_completed = 0  # highest sequence number seen complete (the drain thread updates it)
        # gloo numbers a send or a receive on the two ranks that take part only: the numbers its calls moved,
        # so every rank can count the group's collectives alike (collective_number, the hang board)
        self.p2p_moved = 0
        self.p2p_marks: collections.deque[tuple[int, int]] = collections.deque(maxlen=P2P_MARKS)  # (seq after, moved)

    def next_seq(self) -> int | None:
        """The sequence number of the collective just issued on this group."""
        if self.seq_supported:
            try:
                return self.pg._get_sequence_number_for_group()
            except Exception:
                self.seq_supported = False
        return next(self.own_seq)

    def last_started(self) -> int:
        """Sequence number of the last collective issued on this group (0: none)."""
        if self.seq_supported and self.pg is not None:
            try:
                return int(self.pg._get_sequence_number_for_group())
            except Exception:
                pass
        return int(repr(self.own_seq)[len("count(") : -1]) - 1  # itertools.count shows its next value

    def p2p_called(self, before: int, after: int) -> None:
        """A point-to-point call (or a batch of them) took the group's sequence number from ``before`` to
        ``after``: on backends that number them with the collectives (gloo); NCCL counts them apart."""
        if after > before:
            self.p2p_moved += after - before
            self.p2p_marks.append((after, self.p2p_moved))

    def collective_number(self, seq: int) -> int | None:
        """How many calls every rank of the group makes (collectives, not point-to-point) this rank had
        started with the call numbered ``seq``; None when its point-to-point history is no longer kept."""
        marks = list(self.p2p_marks)  # one copy: the training thread appends meanwhile
        for after, moved in reversed(marks):
            if after < seq:
                return seq - moved
        return None if len(marks) == P2P_MARKS else seq

    def collectives_started(self) -> int:
        """How many calls every rank of the group makes this rank has started (collective_number's count)."""
        return self.last_started() - self.p2p_moved

    def global_rank(self, group_rank: int | None) -> int | None:
        if group_rank is None:
            return None
        if 0 <= group_rank < len(self.global_ranks):
            return self.global_ranks[group_rank]
        return group_rank


def backend_name(pg: Any = None) -> str:
    """The group's backend as torch names it, or, for a group made without one (``init_process_group()``:
    torch says "undefined" and picks the machine's accelerator's backend), the backend it picked."""
    name = _safe(lambda: str(dist.get_backend(pg)), "unknown")
    if name == "undefined":
        picked = pg if pg is not None else _safe(lambda: c10d._get_default_group(), None)
        name = _safe(lambda: str(picked._get_backend_name()), name)
    return name


def _is_gpu_backend(backend: str) -> bool:
    return any(b in backend for b in ("nccl", "xccl", "hccl", "rccl"))


def _safe(fn, default):
    try:
        return fn()
    except Exception:
        return default


_groups: dict[Any, GroupInfo] = {}
BY_ID: list[GroupInfo] = []  # records name their group by index: an int keeps them GC-untracked
_labels: set[str] = set()
_lock = threading.Lock()


def info(pg: Any) -> GroupInfo | None:
    """GroupInfo for ``pg`` (the default group when None); cheap after the first call.

    None when there is no such group (not initialized, or this rank is not a member): the call will then
    fail or do nothing on its own, and there is nothing to record.
    """
    if pg is None:
        pg = c10d._world.default_pg
        if pg is None:
            return None
    gi = _groups.get(pg)
    if gi is not None:
        return gi
    if pg is c10d.GroupMember.NON_GROUP_MEMBER or not isinstance(pg, c10d.ProcessGroup):
        return None
    # destroying the default group restarts torch's numbering: a destroyed namesake the library did not see
    # destroyed (destroy_process_group imported before instrument()) gives the new group its label
    name = _safe(lambda: pg.group_name, None)
    if name is not None:
        forget_destroyed(name)
    with _lock:
        gi = _groups.get(pg)
        made = gi is None
        if made:
            gi = GroupInfo(pg)
            gi.label = _unique_label(gi)
            gi.series = _series_label(gi.label)
            # numbered first: the C++ completion hook is registered with the group's id (an unnumbered
            # group's hook drops every report, as an uninstrumented one does)
            gi.gid = len(BY_ID)
            BY_ID.append(gi)
            _attach_completion(gi)
            _groups[pg] = gi
    if made:
        for fn in list(ON_NEW_GROUP):
            fn()
    return gi


ON_NEW_GROUP: list[Any] = []
"""Called when a group is first met (outside the lock): the runtime learns the process group exists where
init_process_group ran unpatched (``from torch.distributed import init_process_group`` before
instrument(), init_device_mesh's own binding)."""


_unresolved: list[GroupInfo] = []


def unresolved() -> GroupInfo:
    """Stands for a group that could not be resolved (no process group, or it was destroyed): the call
    will raise, and its record says so."""
    with _lock:
        if not _unresolved:
            gi = GroupInfo(None)
            gi.name, gi.desc, gi.label, gi.size, gi.rank, gi.backend = "none", "uninitialized", "uninitialized", 0, -1, "none"
            gi.series = gi.label
            gi.seq_supported = False
            gi.gid = len(BY_ID)
            BY_ID.append(gi)
            _unresolved.append(gi)
    return _unresolved[0]


def _unique_label(gi: GroupInfo) -> str:
    base = gi.desc if gi.desc and gi.desc != "undefined" else f"pg{gi.name}"
    label = base if base not in _labels else f"{base}:{gi.name}"
    _labels.add(label)
    return label


_series_labels: set[str] = set()  # the groups with series of their own, destroyed ones too
_overflow_said = [False]


def _series_label(label: str) -> str:
    if label in _series_labels or len(_series_labels) < MAX_SERIES_GROUPS:
        _series_labels.add(label)
        return label
    if not _overflow_said[0]:
        _overflow_said[0] = True
        _log.warning(
            "otel-torchdist: more than %d process groups made: the collectives of group %s and of every later "
            "one are counted under group=%r in the metrics (each group's series last the run); their spans carry "
            "their own group's name and description",
            MAX_SERIES_GROUPS, label, n.GROUP_OVERFLOW,
        )  # fmt: skip
    return n.GROUP_OVERFLOW


def reserve_label(desc: Any) -> None:
    """A group made without this rank (new_group returned NON_GROUP_MEMBER): its description is taken here
    too, as on its members, so a later group of the same description gets the same label on every rank (the
    hang board and the metrics compare groups across ranks by label)."""
    if isinstance(desc, str) and desc and desc != "undefined":
        with _lock:
            _labels.add(desc)


def forget(pg: Any) -> None:
    """A destroyed group: stop finding it by object (ids are reused) and let the object go.

    Its GroupInfo stays in BY_ID for records still queued that name it.
    """
    with _lock:
        gi = _groups.pop(pg, None)
        if gi is not None:
            _labels.discard(gi.label)
            gi.seq_supported = False  # first: a call in flight reads it before it reads pg
            gi.pg = None
    _forgotten()


def forget_all() -> None:
    with _lock:
        for gi in _groups.values():
            gi.seq_supported = False
            gi.pg = None
        _groups.clear()
        _labels.clear()
        _series_labels.clear()
        _overflow_said[0] = False
    _forgotten()


_on_forget: list[Any] = []  # the captures' own caches of groups (funcol's), emptied when a group is forgotten


def on_forget(fn) -> None:
    _on_forget.append(fn)


def _forgotten() -> None:
    for fn in _on_forget:
        fn()


def forget_destroyed(name: str | None = None) -> None:
    """Forget the groups destroyed while the library was not looking (after ``uninstrument()``, or through a
    ``destroy_process_group`` imported before ``instrument()``), or only those named ``name``: they must not
    be reported, nor kept alive, nor keep their labels from the groups made after them."""
    live = c10d._world.pg_map
    for pg, gi in list(_groups.items()):
        if pg not in live and (name is None or gi.name == name):
            forget(pg)


def _at_exit() -> None:
    # A group destroyed after uninstrument() is still held here: let it go while the interpreter is whole.
    # Left to the interpreter's teardown, a gloo group's destructor joins worker threads that may need the
    # GIL, and the process dies of SIGABRT ("terminate called without an active exception").
    try:
        forget_destroyed()
    except Exception:
        pass


atexit.register(_at_exit)


def all_groups() -> list[GroupInfo]:
    return list(_groups.values())


_completion_attachers: list[Any] = []


def register_completion_attacher(fn) -> None:
    """``fn(GroupInfo)`` may switch a group to a better completion strategy (the NCCL hook)."""
    _completion_attachers.append(fn)


def _attach_completion(gi: GroupInfo) -> None:
    for fn in _completion_attachers:
        try:
            fn(gi)
        except Exception:
            _log.debug("completion attacher failed for group %s", gi.name, exc_info=True)
