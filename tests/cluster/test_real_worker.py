"""Jobs and heartbeats go through a real Celery worker process and a real Redis, not eager mode."""

from datetime import timedelta

import pytest
from django.utils import timezone

from accounts.services import SYSTEM
from cluster import inventory
from cluster.models import Job, JobState, Node, NodeStatus
from cluster.services import dispatch_job, register_node
from cluster.tasks import request_heartbeats
from tests.conftest import wait_for

pytestmark = [pytest.mark.worker, pytest.mark.django_db(transaction=True)]


def _finished(job_id: int) -> Job | None:
    job = Job.objects.get(pk=job_id)
    return job if job.state in (JobState.SUCCEEDED, JobState.FAILED) else None


def test_a_job_runs_on_its_nodes_worker_and_records_every_transition(celery_worker_process):
    node = register_node(name=celery_worker_process["node"], resources=inventory.probe())

    job = dispatch_job(actor=SYSTEM, workspace=None, kind="node.inventory", node=node)

    done = wait_for(lambda: _finished(job.pk), what="the job to finish on the worker")
    assert done.state == JobState.SUCCEEDED, done.error
    assert done.worker == celery_worker_process["hostname"]
    assert done.celery_task_id
    assert done.progress == 1.0
    assert done.result["cpu_cores"] >= 1
    assert [e.state for e in done.events.all()][0] == JobState.QUEUED
    assert [e.state for e in done.events.all()][-1] == JobState.SUCCEEDED
    assert JobState.RUNNING in [e.state for e in done.events.all()]


def test_a_job_for_another_node_waits_for_that_nodes_worker(celery_worker_process):
    other = register_node(name="elsewhere", resources=inventory.probe())
    mine = register_node(name=celery_worker_process["node"], resources=inventory.probe())

    stranded = dispatch_job(actor=SYSTEM, workspace=None, kind="node.inventory", node=other)
    served = dispatch_job(actor=SYSTEM, workspace=None, kind="node.inventory", node=mine)

    wait_for(lambda: _finished(served.pk), what="the job on the worker's own node")
    assert Job.objects.get(pk=stranded.pk).state == JobState.QUEUED


def test_beat_heartbeats_reach_the_worker_and_silent_nodes_turn_unhealthy(celery_worker_process):
    node = register_node(name=celery_worker_process["node"], resources=inventory.probe())
    Node.objects.filter(pk=node.pk).update(last_heartbeat_at=timezone.now() - timedelta(seconds=30))
    ghost = register_node(name="ghost", resources=inventory.probe())
    Node.objects.filter(pk=ghost.pk).update(last_heartbeat_at=timezone.now() - timedelta(hours=1))
    before = Node.objects.get(pk=node.pk).last_heartbeat_at

    request_heartbeats.delay()

    wait_for(lambda: Node.objects.get(pk=node.pk).last_heartbeat_at > before, what="the worker's heartbeat")
    assert wait_for(lambda: Node.objects.get(pk=ghost.pk).status == NodeStatus.UNHEALTHY, what="ghost unhealthy")
    assert Node.objects.get(pk=node.pk).status == NodeStatus.HEALTHY
