"""Keep a lease alive while its work runs, so the lease TTL can be short.

A daemon thread renews the lease (the store's fenced ``check``) every ``interval`` seconds
until the block exits. A worker that dies stops renewing, and its sessions are free again
within one TTL rather than after a long one. If a renewal finds the lease lost (it lapsed
during a stall, or Redis lost it), the thread stops and says so; the work itself is guarded
by the ``check`` it makes before every action, so it acts no further.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

from controller import logs
from controller.errors import Fenced, Transient
from controller.store.base import Lease, SessionStore

log = logs.get(__name__)


class Heartbeat:
    def __init__(self, store: SessionStore, lease: Lease, interval: float) -> None:
        self._store = store
        self._lease = lease
        self._interval = interval
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self.lost = False
        self._context = logs.bound()
        self._thread = threading.Thread(target=self._run, name=f"lease-{lease.session_id}", daemon=True)

    def __enter__(self) -> Heartbeat:
        if self._interval > 0:  # 0: renewal off (unit tests on a fake clock)
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
        if self._thread.is_alive():
            self._thread.join(timeout=self._interval + 5)

    def stop(self) -> None:
        self._stop.set()

    @contextmanager
    def paused(self) -> Iterator[None]:
        """Hold off renewals while the lease is completed or released (call ``stop`` inside
        once it is gone, so that no renewal reports a lease this worker gave up itself)."""
        with self._lock:
            yield

    def _run(self) -> None:
        with logs.bind(**self._context):
            while not self._stop.wait(self._interval):
                with self._lock:
                    if self._stop.is_set():
                        return
                    try:
                        self._store.check(self._lease)
                    except Fenced as exc:
                        self.lost = True
                        log.warning("lease lost while working; acting no further", extra={"reason": str(exc)})
                        return
                    except Transient as exc:
                        log.warning("lease renewal failed; trying again", extra={"reason": str(exc)})
