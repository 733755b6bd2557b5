"""A run cancelled while it runs stops within a second or so, whatever it is waiting on: agent runs and workflow runs
alike.

Cancelling a run sets its row's `cancel_requested` (agent_studio.services and agent_studio.workflows.services,
`cancel_run`). Each process running runs has one thread that reads those flags for the runs it holds, every
CHECK_S, and cancels the Cancellation (accounts.cancellation) of each run found flagged: the run's code sandbox is
killed and its HTTP calls (to the gateway, to tools) are shut, so the run's thread wakes with an error, which the
runner records as the run cancelled. The runners' own checks between steps read the same flag and cancel the same
Cancellation, so a run also stops before its next step. A database poll rather than a message: the flag is the
truth either way, and a poll cannot be missed (a Redis restart loses messages)."""

import logging
import threading
import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager

from django.db import connection

from accounts.cancellation import Cancellation, scope

logger = logging.getLogger(__name__)
CHECK_S = 0.5


class CancelWatcher:
    """The Cancellations of the runs this process is running, by (model, pk); one thread per process."""

    def __init__(self):
        self._runs: dict[tuple[type, int], Cancellation] = {}
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    @contextmanager
    def watched(self, model, run_pk: int) -> Iterator[Cancellation]:
        """The run's Cancellation, current meanwhile (see accounts.cancellation.scope)."""
        cancellation = Cancellation()
        with self._lock:
            self._runs[(model, run_pk)] = cancellation
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._watch_forever, name="run-cancels", daemon=True)
                self._thread.start()
        try:
            with scope(cancellation):
                yield cancellation
        finally:
            with self._lock:
                self._runs.pop((model, run_pk), None)

    def _watch_forever(self) -> None:
        while True:
            time.sleep(CHECK_S)
            try:
                self._cancel_flagged()
            except Exception:  # the database away for a moment: the next round reads again
                logger.exception("Could not read the cancel flags of the runs in progress")
                connection.close()

    def _cancel_flagged(self) -> None:
        with self._lock:
            held = dict(self._runs)
        if not held:
            connection.close()  # no run here: no connection held open for nothing
            return
        by_model = defaultdict(list)
        for model, run_pk in held:
            by_model[model].append(run_pk)
        for model, run_pks in by_model.items():
            for run_pk in model.objects.filter(pk__in=run_pks, cancel_requested=True).values_list("pk", flat=True):
                held[(model, run_pk)].cancel()


_watcher = CancelWatcher()
watched = _watcher.watched
