"""Leases: how a worker holds a piece of work while it runs it (a document, an eval run, a generated eval set, an
agent run, a workflow run), whatever app the work belongs to.

The row says who holds it (`lease_owner`) and until when (`lease_until`). The holder renews the lease from a thread
every third of the lease, so that one long call (a big parse, an index write, a slow model) never outlasts it; when
the holder dies the renewals stop, the lease runs out, and beat hands the work to another worker. Owners are unique
per process and per task: the Celery hostname alone is shared by every process of a worker's pool, so two of them
could take the same row at once.
"""

import logging
import os
import threading
import time
from contextlib import contextmanager
from datetime import timedelta

from django.db import DatabaseError, connection
from django.utils import timezone

logger = logging.getLogger(__name__)


def owner_name(hostname: str, task_id: str | None) -> str:
    """`worker@node/pid/task`: this process's name for the leases it takes in this task."""
    return f"{hostname or 'worker'}/{os.getpid()}/{task_id or 'inline'}"[:128]


def lease_until(seconds: float):
    return timezone.now() + timedelta(seconds=seconds)


class LeaseKeeper:
    """Renews, every third of its lease, each set of rows this process holds (`kept`), however long one call takes.
    One thread per process, not per piece of work: starting and joining a thread for every agent run cost more than
    a whole step on a busy machine. Only rows still filtered to their holder are renewed, so a row another worker
    took meanwhile is left alone."""

    def __init__(self):
        self._held: dict[object, tuple] = {}
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None

    @contextmanager
    def kept(self, rows, *, lease_s: float):
        """Meanwhile, `rows` (a queryset already filtered to this holder's rows) have their leases renewed."""
        token = object()
        with self._lock:
            self._held[token] = (rows, lease_s, [time.monotonic() + lease_s / 3])
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._renew_forever, name="lease-keeper", daemon=True)
                self._thread.start()
        self._wake.set()
        try:
            yield
        finally:
            with self._lock:
                self._held.pop(token, None)

    def _renew_forever(self) -> None:
        while True:
            with self._lock:
                due = min((next_at[0] for _rows, _lease_s, next_at in self._held.values()), default=None)
            self._wake.wait(None if due is None else max(0.0, due - time.monotonic()))
            self._wake.clear()
            now = time.monotonic()
            with self._lock:
                ready = [entry for entry in self._held.values() if entry[2][0] <= now]
            for rows, lease_s, next_at in ready:
                next_at[0] = now + lease_s / 3
                try:
                    rows.update(lease_until=lease_until(lease_s))
                except DatabaseError as exc:  # a busy database: the next renewal comes well before the lease ends
                    logger.warning("Could not renew leases: %s", exc)
            if ready:
                connection.close()  # this thread's own connection, not held open between renewals


kept = LeaseKeeper().kept
