"""How a worker holds an agent run or a workflow run while it runs it (the leases of cluster/leases.py): it claims the
run (a lease only this process and task holds), renews the lease while it works, and a run whose worker died is
claimed again elsewhere once its lease runs out (each kind's `resume_stalled_*` task), at most the runner's
MAX_ATTEMPTS times."""

import socket
from contextlib import contextmanager

from django.conf import settings
from django.db.models import F, Q
from django.utils import timezone

from agent_studio import events
from agent_studio.runs.fields import RunStatus
from cluster import leases


def owner_id(task_id: str | None) -> str:
    """Unique per process and per task: two pool processes of one worker never share a lease."""
    return leases.owner_name(socket.gethostname(), task_id)


def claim(model, run_pk: int, owner: str, *, related: tuple[str, ...] = ()):
    """The run (a row of `model`, with `related` loaded), now `owner`'s and running, or None when another worker
    holds it or it has finished."""
    now = timezone.now()
    claimed = model.objects.filter(pk=run_pk, status__in=[RunStatus.QUEUED, RunStatus.RUNNING]).filter(
        Q(lease_until__isnull=True) | Q(lease_until__lt=now) | Q(lease_owner=owner)).update(
        status=RunStatus.RUNNING, lease_owner=owner, lease_until=leases.lease_until(settings.RUN_LEASE_S),
        attempts=F("attempts") + 1)
    if not claimed:
        return None
    run = model.objects.select_related(*related).get(pk=run_pk)
    events.publish(run.public_id, "status", {"status": RunStatus.RUNNING, "attempt": run.attempts})
    return run


@contextmanager
def kept(model, run_pk: int, owner: str):
    """Meanwhile the run's lease is renewed (cluster/leases.py), however long one model or tool call takes."""
    rows = model.objects.filter(pk=run_pk, lease_owner=owner, status=RunStatus.RUNNING)
    with leases.kept(rows, lease_s=settings.RUN_LEASE_S):
        yield
