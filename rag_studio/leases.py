"""Leases: how a worker holds a piece of work (a document, an eval run, a generated eval set) while it runs.

The row says who holds it (`lease_owner`) and until when (`lease_until`). The holder renews the lease from a
thread of its own every third of the lease, so that one long call (a big parse, an index write, a slow model)
never outlasts it; when the holder dies the renewals stop, the lease runs out, and beat hands the work to another
worker. Owners are unique per process and per task: the Celery hostname alone is shared by every process of a
worker's pool, so two of them could take the same document at once.
"""

import logging
import os
import threading
from datetime import timedelta

from django.conf import settings
from django.db import DatabaseError, connections
from django.utils import timezone

logger = logging.getLogger(__name__)


def owner_name(hostname: str, task_id: str | None) -> str:
    """`worker@node/pid/task`: this process's name for the lease it takes in this task."""
    return f"{hostname or 'worker'}/{os.getpid()}/{task_id or 'inline'}"[:128]


def lease_until(seconds: float | None = None):
    return timezone.now() + timedelta(seconds=seconds if seconds is not None else settings.RAG_INGEST_LEASE_S)


class LeaseKeeper:
    """Renews the leases `owner` holds on rows of `queryset` (filtered further to the owner) every third of the
    lease, until the block ends. Only an update that names the owner renews anything, so a row another worker took
    meanwhile is left alone."""

    def __init__(self, queryset, owner: str, *, lease_s: float | None = None):
        self._rows = queryset.filter(lease_owner=owner)
        self._lease_s = lease_s if lease_s is not None else settings.RAG_INGEST_LEASE_S
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._renew_until_stopped, name="lease-keeper", daemon=True)

    def __enter__(self) -> "LeaseKeeper":
        self._thread.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self._stop.set()
        self._thread.join()

    def _renew_until_stopped(self) -> None:
        try:
            while not self._stop.wait(self._lease_s / 3):
                try:
                    self._rows.update(lease_until=lease_until(self._lease_s))
                except DatabaseError as exc:  # a busy database: the next renewal comes well before the lease ends
                    logger.warning("Could not renew leases: %s", exc)
        finally:
            connections.close_all()  # this thread's own connections
