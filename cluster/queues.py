"""The platform's Celery queues by kind, and where a queued item stands in its line.

Queues (factory/celery.py routes each task; scripts/proc.sh starts their workers):
- `interactive`: short work a person waits for (eval runs and generated eval sets, retrieval tuning, model-group
  calibration, agent evaluations), served by a worker process of its own, so it never waits behind ingestion.
  Celery's priorities on Redis were no answer: they only order messages for a free worker, and bulk ingestion keeps
  every ingestion process busy for minutes, so a short job needs capacity reserved for it.
- `ingest`: bulk ingestion, fed a few messages at a time in fair order (rag_studio/pipeline/line.py).
- `node.<name>`: one machine's jobs (replica starts, training) and heartbeats; `default`: beat's sweeps.

A message carries its workspace in a header of its own, so the line of a queue is read off the broker (its Redis
list, oldest last) without knowing what the tasks are, and a place never names another workspace's work. How long a
task of each name takes is kept as a moving average in Redis (from Celery's signals), which gives the estimates.
"""

import ast
import json
import time
from dataclasses import asdict, dataclass
from functools import cache

import redis
from celery import current_app
from celery.signals import task_postrun, task_prerun
from django.conf import settings
from django.utils.translation import gettext as _

from accounts import redis_connections
from accounts.errors import RateLimited

INGEST, INTERACTIVE, DEFAULT = "ingest", "interactive", "default"
WORKSPACE_HEADER = "workspace"
DURATIONS = "queues:durations"
STARTED = "queues:started"
# The weight of the newest run in a task's moving average.
AVERAGE_WEIGHT = 0.3
# The most messages read to find an item's place: past this, a line is long, and its end is estimated.
READ_AT_MOST = 2000


@dataclass(frozen=True)
class Place:
    """Where a queued item stands: `position` 1 is next; counts only, never another workspace's names."""

    position: int
    ahead_in_your_workspace: int
    estimated_start_s: float | None
    reason: str

    def as_dict(self) -> dict:
        return asdict(self)


@cache
def broker() -> redis.Redis:
    return redis.Redis.from_url(settings.CELERY_BROKER_URL, socket_timeout=5, **redis_connections.options())


def send(task: str, args: list, *, queue: str, workspace_id: int | None):
    """Send a task message that says whose it is (for the line), to `queue`; Celery's AsyncResult."""
    return current_app.send_task(task, args=args, queue=queue, headers={WORKSPACE_HEADER: workspace_id})


@dataclass(frozen=True)
class Waiting:
    task: str
    args: tuple
    workspace_id: int | None


def _read(body: bytes) -> Waiting | None:
    """A raw broker message as task, arguments and workspace; None for a message that is not a task of ours."""
    try:
        headers = json.loads(body).get("headers") or {}
        arguments = ast.literal_eval(headers.get("argsrepr") or "()")
    except (ValueError, SyntaxError, TypeError, AttributeError):
        return None
    return Waiting(str(headers.get("task", "")), tuple(arguments or ()), headers.get(WORKSPACE_HEADER))


def waiting(queue: str) -> list[Waiting]:
    """The messages waiting in `queue`, next first (kombu pushes on the left and workers pop on the right). A message
    that is not a task of ours stands in line all the same, but is nobody's and is not listed."""
    raw = broker().lrange(queue, -READ_AT_MOST, -1)
    return [message for body in reversed(raw) if (message := _read(body)) is not None]


def withdraw(queue: str, task: str, args: list) -> int:
    """Take a cancelled item's waiting message out of `queue`, so that it leaves the line at once rather than when a
    worker takes it and finds nothing to do; how many were taken out (0 when a worker took it meanwhile)."""
    removed = 0
    for body in broker().lrange(queue, -READ_AT_MOST, -1):
        message = _read(body)
        if message is not None and message.task == task and message.args == tuple(args):
            removed += int(broker().lrem(queue, 1, body))
    return removed


def length(queue: str) -> int:
    return int(broker().llen(queue))


def is_waiting(queue: str, task: str, args: list) -> bool:
    return any(message.task == task and message.args == tuple(args) for message in waiting(queue))


def typical_seconds(task: str, default: float) -> float:
    value = broker().hget(DURATIONS, task)
    return float(value) if value is not None else default


class Line:
    """A queue's line as it stands now, read once however many items' places are asked of it (a list page)."""

    def __init__(self, queue: str, *, workers: int):
        self.messages = waiting(queue)
        self.workers = max(workers, 1)
        self._typical: dict[str, float] = {}

    def _seconds(self, task: str, default_s: float) -> float:
        if task not in self._typical:
            self._typical[task] = typical_seconds(task, default_s)
        return self._typical[task]

    def place(self, task: str, args: list, *, workspace_id: int | None, default_s: float,
              reason: str) -> Place | None:
        """The item's place, or None when its message is not in line (taken, or lost: the sweeps send a lost one
        again). The estimate counts each message ahead at its task's typical time, over the queue's workers."""
        for index, message in enumerate(self.messages):
            if message.task == task and message.args == tuple(args):
                ahead = self.messages[:index]
                seconds = sum(self._seconds(other.task, default_s) for other in ahead) / self.workers
                mine = sum(1 for other in ahead if workspace_id is not None and other.workspace_id == workspace_id)
                return Place(position=index + 1, ahead_in_your_workspace=mine,
                             estimated_start_s=round(seconds, 1), reason=reason)
        return None


def interactive_line() -> Line:
    return Line(INTERACTIVE, workers=settings.INTERACTIVE_SLOTS)


# How many interactive jobs a workspace has queued or running, one counter per app that starts them (registered
# from each app's ready(): a lower floor cannot import the studios).
_workloads: list = []


def count_workload(counter):
    """Register `counter(workspace_id) -> int`, the app's interactive jobs of the workspace queued or running."""
    _workloads.append(counter)
    return counter


def check_job_limit(workspace_id: int | None) -> None:
    """RateLimited (429) when the workspace already has FACTORY_WORKSPACE_MAX_JOBS interactive jobs queued or
    running (0: no limit)."""
    limit = settings.WORKSPACE_MAX_JOBS
    if not limit or workspace_id is None:
        return
    if sum(counter(workspace_id) for counter in _workloads) >= limit:
        raise RateLimited(_("Your workspace's limit of %(limit)s evaluations, tunings and calibrations queued or "
                            "running at once is reached; wait for one to finish, or cancel one.") % {"limit": limit},
                          retry_after=30)


@task_prerun.connect
def _started(task_id=None, task=None, **_kwargs) -> None:
    try:
        broker().hset(STARTED, task_id, json.dumps([task.name, _now()]))
    except redis.RedisError:
        pass  # the averages are a courtesy: no task waits for them


@task_postrun.connect
def _finished(task_id=None, task=None, **_kwargs) -> None:
    try:
        started = broker().hget(STARTED, task_id)
        broker().hdel(STARTED, task_id)
        if started is None:
            return
        name, at = json.loads(started)
        record_duration(name, _now() - at)
    except (redis.RedisError, ValueError):
        pass


def record_duration(task: str, seconds: float) -> None:
    previous = broker().hget(DURATIONS, task)
    average = seconds if previous is None else (1 - AVERAGE_WEIGHT) * float(previous) + AVERAGE_WEIGHT * seconds
    broker().hset(DURATIONS, task, f"{average:.3f}")


def _now() -> float:
    return time.time()
