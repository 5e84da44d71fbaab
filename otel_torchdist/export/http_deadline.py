"""A deadline for a whole HTTP request through ``requests``.

requests' (and urllib3's) timeout bounds each socket operation, not the request: a collector that sends its
answer a byte at a time, never silent for as long as the timeout, holds a post for as long as it likes, and
with it the export thread and the end of the job. This adapter keeps the connections it opens, and
:meth:`DeadlineAdapter.cut` shuts down their sockets, which ends a read in progress on another thread at
once (the request then fails with a connection error). A sink posts one request at a time, so cutting all
of its adapter's connections cuts that request; an idle one cut is reconnected when next used. One watcher
thread per adapter, started with its first request, waits for the deadlines (a timer thread per request
cost about 150 us of CPU a post).
SOCKS proxies keep urllib3's own connections (no deadline beyond the per-read timeout there).
"""

from __future__ import annotations

import socket
import threading
import time
import weakref
from typing import Any

import requests
from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool


class DeadlineAdapter(requests.adapters.HTTPAdapter):
    def __init__(self) -> None:
        live: weakref.WeakSet = weakref.WeakSet()
        self._live = live

        class Connection(HTTPConnection):
            def connect(self) -> None:
                super().connect()
                live.add(self)

        class TLSConnection(HTTPSConnection):
            def connect(self) -> None:
                super().connect()
                live.add(self)

        self._pools = {
            "http": type("DeadlinePool", (HTTPConnectionPool,), {"ConnectionCls": Connection}),
            "https": type("DeadlineTLSPool", (HTTPSConnectionPool,), {"ConnectionCls": TLSConnection}),
        }
        self._cond = threading.Condition()
        self._due: float | None = None  # when the request in flight must be over (monotonic)
        self._expired = False
        self._closed = False
        self._watcher: threading.Thread | None = None
        super().__init__()

    def init_poolmanager(self, *args: Any, **kwargs: Any) -> None:
        super().init_poolmanager(*args, **kwargs)
        self.poolmanager.pool_classes_by_scheme = self._pools

    def proxy_manager_for(self, proxy: str, **kwargs: Any) -> Any:
        manager = super().proxy_manager_for(proxy, **kwargs)
        if not proxy.lower().startswith("socks"):
            manager.pool_classes_by_scheme = self._pools
        return manager

    def watch(self, seconds: float) -> None:
        """A request starts: cut it if it is not over in ``seconds``."""
        with self._cond:
            self._due = time.monotonic() + seconds
            self._expired = False
            if self._watcher is None:
                self._watcher = threading.Thread(target=self._watch, name="otel-torchdist-http-deadline", daemon=True)
                self._watcher.start()
            self._cond.notify()

    def unwatch(self) -> bool:
        """The request is over; returns whether its deadline cut it."""
        with self._cond:
            self._due = None
            return self._expired

    def _watch(self) -> None:
        with self._cond:
            while not self._closed:
                due = self._due
                if due is None:
                    self._cond.wait()
                    continue
                left = due - time.monotonic()
                if left > 0:
                    self._cond.wait(left)
                    continue
                self._due = None
                self._expired = True
                self.cut()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify()
        super().close()

    def cut(self) -> None:
        """Shut down every connection this adapter opened (see the module docstring)."""
        for conn in list(self._live):
            sock = getattr(conn, "sock", None)
            if sock is None:
                continue
            try:
                # socket.socket's own shutdown, also for a TLS socket: SSLSocket.shutdown would first drop its
                # SSL object, which the reading thread is using.
                socket.socket.shutdown(sock, socket.SHUT_RDWR)
            except OSError:
                pass
