"""Node jobs past their deadline: beat sends again a job whose message was lost or whose worker died, and after
CLUSTER_JOB_MAX_DISPATCHES (or on an unhealthy node) fails it with the reason; a replica whose start was given up
fails instead of staying "starting" for ever; a second message for a running job never runs it twice, and a job
handed back to the pool runs on its next message even while its old run is ending."""

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

import pytest
from django.core.cache import cache
from django.utils import timezone

from accounts.services import SYSTEM
from cluster import deadlines, inventory
from cluster.models import Job, JobEvent, JobState, NodeStatus
from cluster.services import dispatch_job, register_node
from cluster.tasks import run_job
from serving.models import Deployment, Replica, ServingState
from serving.presets import SMOLLM2, register_presets
from serving.services import START_REPLICA


@pytest.fixture
def node(db):
    return register_node(name="node-a", resources=inventory.probe())


@pytest.fixture
def sent(monkeypatch) -> list[tuple[int, str]]:
    """(job id, queue) of each run_job message sent."""
    messages = []

    class Sent:
        id = "sent-task"

    def send(name, args, *, queue, workspace_id):
        assert name == deadlines.RUN_JOB_TASK
        messages.append((args[0], queue))
        return Sent()

    monkeypatch.setattr(deadlines.queues, "send", send)
    return messages


@pytest.fixture
def forget_heartbeats():
    """The cache is the session's Redis: drop the keys these tests leave, by job id."""
    job_ids = []
    yield job_ids.append
    cache.delete_many([key for pk in job_ids for key in (deadlines._alive_key(pk), deadlines._suspect_key(pk))])


def _age(job: Job, seconds: float) -> None:
    """As if the job had been dispatched `seconds` ago."""
    then = timezone.now() - timedelta(seconds=seconds)
    Job.objects.filter(pk=job.pk).update(created_at=then)
    JobEvent.objects.filter(job=job).update(at=then)


def test_a_job_whose_message_was_lost_is_sent_again_then_failed_with_the_reason(node, sent, settings):
    settings.CLUSTER_JOB_QUEUED_DEADLINE_S, settings.CLUSTER_JOB_MAX_DISPATCHES = 60, 2
    # Dispatched in a transaction that commits here only at the end of the test: its message is never sent.
    job = dispatch_job(actor=SYSTEM, workspace=None, kind="node.inventory", node=node)
    assert deadlines.sweep_overdue_jobs() == {"redispatched": [], "failed": []}  # not overdue yet

    _age(job, 120)
    assert deadlines.sweep_overdue_jobs() == {"redispatched": [job.pk], "failed": []}
    assert sent == [(job.pk, "node.node-a")]
    assert deadlines.sweep_overdue_jobs() == {"redispatched": [], "failed": []}  # sent again just now

    _age(job, 120)
    assert deadlines.sweep_overdue_jobs() == {"redispatched": [], "failed": [job.pk]}
    job.refresh_from_db()
    assert job.state == JobState.FAILED and job.finished_at is not None
    assert job.error.startswith("Its message was not taken within 60 s") and "gave up after 2 dispatches" in job.error
    assert [e.state for e in job.events.all()] == [JobState.QUEUED, JobState.QUEUED, JobState.FAILED]


def test_a_replica_whose_start_was_given_up_fails_with_the_reason(node, sent, settings):
    settings.CLUSTER_JOB_QUEUED_DEADLINE_S = 60
    model = register_presets(lambda line: None)[SMOLLM2]
    deployment = Deployment.objects.create(workspace=None, name="chat", model=model, engine="llamacpp",
                                           state=ServingState.STARTING)
    replica = Replica.objects.create(deployment=deployment, node=node, state=ServingState.STARTING)
    job = dispatch_job(actor=SYSTEM, workspace=None, kind=START_REPLICA, node=node,
                       payload={"replica_id": replica.pk})
    node.status = NodeStatus.UNHEALTHY  # its worker stopped answering after the start was queued
    node.save()
    _age(job, 120)

    assert deadlines.sweep_overdue_jobs() == {"redispatched": [], "failed": [job.pk]}
    replica.refresh_from_db()
    deployment.refresh_from_db()
    assert replica.state == ServingState.FAILED and deployment.state == ServingState.FAILED
    assert replica.last_error.startswith("Node 'node-a' is unhealthy") and sent == []


def test_a_running_job_whose_worker_died_is_run_again(node, sent, settings, forget_heartbeats):
    settings.CLUSTER_JOB_HEARTBEAT_S = 1  # beats every second, expires after 3 s
    job = dispatch_job(actor=SYSTEM, workspace=None, kind="node.inventory", node=node)
    forget_heartbeats(job.pk)
    Job.objects.filter(pk=job.pk).update(state=JobState.RUNNING, worker="worker@node-a",
                                         started_at=timezone.now() - timedelta(seconds=5))
    beating = deadlines.JobHeartbeat(job.pk, "worker@node-a/7/t1")
    assert beating.claim()
    with beating:
        assert deadlines.sweep_overdue_jobs() == {"redispatched": [], "failed": []}  # alive
        time.sleep(3.5)
        assert deadlines.sweep_overdue_jobs() == {"redispatched": [], "failed": []}  # still beating

    # kill -9: the heartbeat stops (here the key also goes, as it does when it expires).
    assert deadlines.sweep_overdue_jobs() == {"redispatched": [], "failed": []}  # suspected first
    time.sleep(3.2)
    assert deadlines.sweep_overdue_jobs() == {"redispatched": [job.pk], "failed": []}
    assert sent == [(job.pk, "node.node-a")]
    assert job.events.last().message.startswith("Dispatched again (2 of 3): Its worker (worker@node-a) stopped")


def test_a_second_message_for_a_running_job_does_not_run_it_again(node, forget_heartbeats):
    job = dispatch_job(actor=SYSTEM, workspace=None, kind="node.inventory", node=node)
    forget_heartbeats(job.pk)
    first = deadlines.JobHeartbeat(job.pk, "worker@node-a/7/t1")
    assert first.claim()
    with first:
        assert run_job.apply(args=[job.pk]).get() == "running elsewhere"
        job.refresh_from_db()
        assert job.state == JobState.QUEUED and job.events.count() == 1


def test_a_job_handed_back_to_the_pool_runs_on_its_next_message_while_the_old_run_ends(node, forget_heartbeats,
                                                                                      settings):
    job = dispatch_job(actor=SYSTEM, workspace=None, kind="node.inventory", node=node)
    forget_heartbeats(job.pk)
    old_run = deadlines.JobHeartbeat(job.pk, "worker@node-a/7/t1")
    assert old_run.claim()
    settings.NODE_NAME = "node-a"
    with old_run:
        deadlines.hand_over(job.pk)  # as the pool's hand-back does, then sends the restart's message
        # Another worker takes that message before the old run's heartbeat block has ended: it runs the job.
        assert run_job.apply(args=[job.pk]).get() == JobState.SUCCEEDED


def test_of_the_messages_for_a_job_handed_over_only_one_runs_it(node, forget_heartbeats):
    job = dispatch_job(actor=SYSTEM, workspace=None, kind="node.inventory", node=node)
    forget_heartbeats(job.pk)
    # The restart's message, a redispatch…: taken by several workers at the same moment, after each hand-over.
    claimers = 8
    for round_ in range(20):
        deadlines.hand_over(job.pk)
        start = threading.Barrier(claimers)
        runs = [deadlines.JobHeartbeat(job.pk, f"worker@node-{n}/{round_}/t1") for n in range(claimers)]

        def claim(run):
            start.wait()
            return run.claim()

        with ThreadPoolExecutor(claimers) as pool:
            won = [run for run, claimed in zip(runs, pool.map(claim, runs)) if claimed]
        assert len(won) == 1, f"round {round_}: {len(won)} runs took the job"
        assert won[0].claim(), "the run that took it still holds it"
