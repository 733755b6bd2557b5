"""The Celery app: configuration from Django's settings (CELERY_*), plus what decides where each task runs, for how
long, and what beat sweeps.

Queues (cluster/queues.py): `node.<name>` carries the jobs of one machine (replica starts and stops, training) and
its heartbeats; `default` carries beat's sweeps; `ingest` carries ingestion, a few messages at a time in fair order
(rag_studio/pipeline/line.py); `interactive` carries the short work a person waits for (eval runs and sets, tuning,
calibration, agent evaluations). `scripts/proc.sh node`, `worker` and `interactive` consume them as separate
processes, so a parse that occupies every ingestion process never delays a replica job, a heartbeat (the node
would turn unhealthy) or someone's tuning job.

Time limits: at the soft limit a task gets SoftTimeLimitExceeded, lets its lease run out and beat resumes it from
its last saved step (counting an attempt: RAG_*_MAX_ATTEMPTS fail it with the reason); at the hard limit, a minute
later, its pool process is killed, and the lease runs out all the same. Both stay under the broker's
visibility_timeout, so Redis never hands a running task to a second worker.
"""

import os

from celery import Celery
from celery.signals import worker_init

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "factory.settings")

from django.conf import settings  # noqa: E402  (after DJANGO_SETTINGS_MODULE)

from cluster import cpu_budget, queues  # noqa: E402

app = Celery("factory")
app.config_from_object("django.conf:settings", namespace="CELERY")
# Each app's tasks module, and those of the subsystems that are packages inside an app (workflows).
app.autodiscover_tasks()
app.autodiscover_tasks(["agent_studio.workflows"])

HARD_LIMIT_AFTER_SOFT_S = 60


def _limits(soft_s: float) -> dict:
    ceiling = settings.CELERY_BROKER_TRANSPORT_OPTIONS["visibility_timeout"] - HARD_LIMIT_AFTER_SOFT_S - 60
    soft_s = min(soft_s, ceiling)
    return {"soft_time_limit": soft_s, "time_limit": soft_s + HARD_LIMIT_AFTER_SOFT_S}


# Checked before settings.CELERY_TASK_ROUTES (the first match wins).
app.conf.task_routes = ({
    "rag_studio.tasks.ingest_next": {"queue": queues.INGEST},
    "rag_studio.tasks.ingest_document": {"queue": queues.INGEST},
    "rag_studio.tasks.generate_eval_set": {"queue": queues.INTERACTIVE},
    "rag_studio.tasks.run_eval": {"queue": queues.INTERACTIVE},
    "rag_studio.tasks.tune_retrieval": {"queue": queues.INTERACTIVE},
    "serving.tasks.calibrate_group": {"queue": queues.INTERACTIVE},
    "agent_studio.tasks.run_evaluation": {"queue": queues.INTERACTIVE},
    # Beat's sweeps go to `default`, served by the node worker: they must run while ingestion is busy or stuck.
    "rag_studio.tasks.resume_stalled_documents": {"queue": "default"},
    "rag_studio.tasks.sweep_overdue_evaluations": {"queue": "default"},
}, settings.CELERY_TASK_ROUTES)
app.conf.task_annotations = {
    "rag_studio.tasks.ingest_next": _limits(settings.RAG_INGEST_TIME_LIMIT_S),
    "rag_studio.tasks.ingest_document": _limits(settings.RAG_INGEST_TIME_LIMIT_S),
    "rag_studio.tasks.generate_eval_set": _limits(settings.RAG_EVAL_TIME_LIMIT_S),
    "rag_studio.tasks.run_eval": _limits(settings.RAG_EVAL_TIME_LIMIT_S),
    "rag_studio.tasks.tune_retrieval": _limits(settings.RAG_EVAL_TIME_LIMIT_S),
    "rag_studio.tasks.resume_stalled_documents": _limits(120),
    "rag_studio.tasks.sweep_overdue_evaluations": _limits(120),
    "cluster.tasks.sweep_overdue_jobs": _limits(120),
    "cluster.tasks.request_heartbeats": _limits(60),
    "cluster.tasks.heartbeat": _limits(60),
}
app.conf.beat_schedule = {
    **settings.CELERY_BEAT_SCHEDULE,
    "rag-sweep-overdue-evaluations": {"task": "rag_studio.tasks.sweep_overdue_evaluations",
                                      "schedule": settings.RAG_STALLED_CHECK_INTERVAL_S},
    "cluster-sweep-overdue-jobs": {"task": "cluster.tasks.sweep_overdue_jobs",
                                   "schedule": settings.CLUSTER_JOB_SWEEP_INTERVAL_S},
}


@worker_init.connect
def _yield_when_background(**_) -> None:
    """The ingestion and interactive workers (scripts/proc.sh) are background work their whole life: their pool
    processes, forked after this, inherit the nice value and batch scheduling, so engines serving chats come first
    on the node's cores. The node worker is not: the engines it starts would inherit them."""
    if cpu_budget.is_background_process():
        cpu_budget.yield_to_interactive()
