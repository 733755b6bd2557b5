"""Writes no request waits for: rows a request leaves behind (the gateway's request records, a key's last use) are
handed to one thread per process, which writes them in batches on its own database connection once the answer has
gone out (issue 49). A request never waits for SQLite's write lock, which a worker may hold for seconds, nor for
asgiref's one sync thread, where a write waiting on that lock held up every other thread-sensitive call of the
process. Postgres takes the same path.

- Batches: the thread takes what has queued up, waiting at most LINGER_S after the first row for others to join it,
  and inserts each model's rows with one bulk_create, in one transaction.
- Nothing lost to a busy database: a batch the database cannot take now (SQLite's lock held past its busy timeout,
  Postgres restarting) is tried again with backoff, as long as it takes; rows keep queueing meanwhile, up to
  MAX_QUEUED, past which new ones are dropped with an error in the log. A row the database refuses (its deployment
  deleted meanwhile) is dropped alone, logged, and the rest of its batch written.
- `flush()` waits until everything queued before the call is written: tests that read a row right after a request,
  and the process's exit (atexit: uvicorn runs without lifespan events).
"""

import atexit
import logging
import os
import threading
import time

from django.db import (
    DatabaseError,
    InterfaceError,
    OperationalError,
    close_old_connections,
    connection,
    models,
    transaction,
)

logger = logging.getLogger(__name__)
LINGER_S = 0.1
BATCH_ROWS = 500
MAX_QUEUED = 100_000
# A writer with nothing to write for this long closes its connection.
IDLE_S = 1.0
RETRY_FIRST_S = 0.5
RETRY_MAX_S = 30.0
# At exit, how long the last rows may take: within the 20 s `make stop` gives a process before killing it.
EXIT_WAIT_S = 15.0


class _Update:
    """Set `fields` on the row `pk` of `model`."""

    __slots__ = ("model", "pk", "fields")

    def __init__(self, model: type[models.Model], pk, fields: dict):
        self.model, self.pk, self.fields = model, pk, fields

    def save(self) -> None:
        self.model._base_manager.filter(pk=self.pk).update(**self.fields)


class DeferredWriter:
    def __init__(self, *, linger_s: float = LINGER_S, batch_rows: int = BATCH_ROWS, max_queued: int = MAX_QUEUED):
        self.linger_s, self.batch_rows, self.max_queued = linger_s, batch_rows, max_queued
        self._reset()
        os.register_at_fork(after_in_child=self._reset)  # a forked child starts with no thread and its own lock
        atexit.register(self._at_exit)

    def _reset(self) -> None:
        self._changed = threading.Condition()
        self._pending: list[models.Model | _Update] = []
        self._queued = self._settled = 0
        self._hurry = self._overflowing = False
        self._thread: threading.Thread | None = None

    def insert(self, row: models.Model) -> None:
        """Insert `row` (an unsaved model instance) soon, after the caller has moved on."""
        self._put(row)

    def update(self, model: type[models.Model], pk, **fields) -> None:
        """Set `fields` on the row `pk` of `model` soon."""
        self._put(_Update(model, pk, fields))

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until everything queued before this call is written (or given up on); False if `timeout` passed
        first."""
        with self._changed:
            target = self._queued
            if self._settled < target:
                self._hurry = True  # the batch being gathered goes now, without lingering
                self._changed.notify_all()
            return self._changed.wait_for(lambda: self._settled >= target, timeout)

    def _put(self, item: models.Model | _Update) -> None:
        with self._changed:
            if len(self._pending) >= self.max_queued:
                if not self._overflowing:
                    self._overflowing = True
                    logger.error("Deferred writes: %d rows are waiting for the database, the most this process "
                                 "holds; new rows (request records, keys' last use) are dropped until it takes "
                                 "writes again.", len(self._pending))
                return
            self._pending.append(item)
            self._queued += 1
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._write_forever, name="deferred-writes", daemon=True)
                self._thread.start()
            if len(self._pending) in (1, self.batch_rows):  # only when the writer waits for a first row or a full batch
                self._changed.notify_all()

    def _take(self) -> list:
        with self._changed:
            idle = not self._changed.wait_for(lambda: self._pending, IDLE_S)
        if idle:
            connection.close()  # not held open while nothing comes (Postgres would keep a backend for it)
        with self._changed:
            self._changed.wait_for(lambda: self._pending)
            deadline = time.monotonic() + self.linger_s
            while len(self._pending) < self.batch_rows and not self._hurry and time.monotonic() < deadline:
                self._changed.wait(deadline - time.monotonic())
            batch, self._pending = self._pending[:self.batch_rows], self._pending[self.batch_rows:]
            if self._overflowing and len(self._pending) < self.max_queued // 2:
                self._overflowing = False
                logger.warning("Deferred writes: the database takes writes again; rows are queued as before.")
            return batch

    def _write_forever(self) -> None:
        while True:
            batch = self._take()
            try:
                self._write(batch)
            except Exception:  # never let one bad batch stop the thread, and with it every later write
                logger.exception("Deferred writes: %d rows could not be written and were dropped", len(batch))
            finally:
                close_old_connections()  # as after a request: SQLite's is closed, Postgres's kept CONN_MAX_AGE
            with self._changed:
                self._settled += len(batch)
                if self._settled >= self._queued:
                    self._hurry = False
                self._changed.notify_all()

    def _write(self, batch: list) -> None:
        delay = RETRY_FIRST_S
        while True:
            try:
                close_old_connections()
                with transaction.atomic():
                    _save(batch)
                return
            except (OperationalError, InterfaceError) as exc:
                logger.warning("Deferred writes: the database could not take %d rows (%s); trying again in %.1f s",
                               len(batch), exc, delay)
                time.sleep(delay)
                delay = min(delay * 2, RETRY_MAX_S)
            except DatabaseError:
                return _save_one_by_one(batch)

    def _at_exit(self) -> None:
        if not self.flush(EXIT_WAIT_S):
            with self._changed:
                unwritten = self._queued - self._settled
            logger.error("Deferred writes: %d rows were still unwritten at exit and are lost.", unwritten)


def _save(batch: list) -> None:
    """Each model's rows in one bulk insert (models in the order they first appear), then the updates."""
    rows: dict[type[models.Model], list[models.Model]] = {}
    for item in batch:
        if not isinstance(item, _Update):
            rows.setdefault(type(item), []).append(item)
    for model, instances in rows.items():
        model._base_manager.bulk_create(instances)
    for item in batch:
        if isinstance(item, _Update):
            item.save()


def _save_one_by_one(batch: list) -> None:
    for item in batch:
        try:
            with transaction.atomic():
                _save([item])
        except DatabaseError as exc:
            model = item.model if isinstance(item, _Update) else type(item)
            logger.error("Deferred writes: dropped a %s the database refused: %s", model.__name__, exc)


writer = DeferredWriter()
insert, update, flush = writer.insert, writer.update, writer.flush
