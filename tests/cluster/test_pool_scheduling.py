"""The shared pool on real rows: jobs asking for CPU slots are admitted, wait with a reason, preempt by class and
quota, hand their devices back at a checkpoint and resume; replica jobs never wait; quotas by platform admins; the
Pool page, API and metrics; bad input is a 400."""

from datetime import timedelta

import pytest
from bs4 import BeautifulSoup
from django.contrib.auth import get_user_model
from django.test import override_settings
from django.utils import timezone, translation
from rest_framework.test import APIClient

from accounts.errors import ValidationFailed
from accounts.middleware import SESSION_KEY as WORKSPACE_SESSION_KEY
from accounts.models import Role
from accounts.services import Actor, add_member
from cluster import inventory
from cluster.deadlines import sweep_overdue_jobs
from cluster.jobs import job_handler
from cluster.models import DeviceQuota, Job, JobState, Workload, WorkloadState
from cluster.scheduling import pool
from cluster.scheduling.pool import DeviceRequest, Preempted
from cluster.scheduling.services import set_quota
from cluster.services import dispatch_job, register_node, run_job

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("four_slots")]
KIND = pool.CPU_SLOT
STOPPED_HANDS_BACK = {"value": False}


@job_handler("test.train")
def _train(job, report) -> dict:
    """A training job's stand-in: it stops at a checkpoint when the test says the pool asked it to."""
    if STOPPED_HANDS_BACK["value"]:
        raise Preempted("stopped at a checkpoint")
    return {"trained": True}


@pytest.fixture
def four_slots(settings):
    settings.POOL_CPU_SLOTS = 2
    settings.NODE_NAME = "cpu-a"
    for name in ("cpu-a", "cpu-b"):
        register_node(name=name, resources=inventory.Resources(
            hostname=name, cpu_cores=2, memory_bytes=8 * 2**30, memory_available_bytes=4 * 2**30,
            load_average=[0.0, 0.0, 0.0]))
    STOPPED_HANDS_BACK["value"] = False


@pytest.fixture
def teams(make_workspace):
    """Workspace A (ann owns it, dev is a developer) and workspace B (bob owns it); carl is a platform admin."""
    a = make_workspace("Team A", owner="ann", dev="developer")
    b = make_workspace("Team B", owner="bob")
    carl = get_user_model().objects.create_user(username="carl", password="correct-horse-battery", is_staff=True)
    return {"a": a, "b": b, "ann": Actor(user=a.memberships.get(role=Role.OWNER).user),
            "dev": Actor(user=get_user_model().objects.get(username="dev")),
            "bob": Actor(user=b.memberships.get(role=Role.OWNER).user), "carl": Actor(user=carl)}


def ask(actor, workspace, devices=2, *, priority="normal", most=None, node="cpu-a") -> Job:
    from cluster.models import Node

    return dispatch_job(actor=actor, workspace=workspace, kind="test.train", node=Node.objects.get(name=node),
                        request=DeviceRequest(device_kind=KIND, min_devices=devices, max_devices=most or devices,
                                              priority=priority))


def finish(*, job_id: int, worker: str) -> Job:
    """Run the job's handler as the worker of the node the pool placed it on."""
    with override_settings(NODE_NAME=Job.objects.get(pk=job_id).node.name):
        return run_job(job_id=job_id, worker=worker)


def workload(job: Job) -> Workload:
    return Workload.objects.get(job=job)


def test_jobs_are_admitted_until_the_pool_is_full_then_wait_saying_why(teams):
    first, second = ask(teams["dev"], teams["a"]), ask(teams["dev"], teams["a"])
    third = ask(teams["dev"], teams["a"])
    assert workload(first).state == workload(second).state == WorkloadState.RUNNING
    assert {node for job in (first, second) for node in workload(job).allocation} == {"cpu-a", "cpu-b"}
    assert Job.objects.get(pk=first.pk).celery_task_id, "an admitted job's message is sent"
    waiting = workload(third)
    assert waiting.state == WorkloadState.WAITING and not Job.objects.get(pk=third.pk).celery_task_id
    assert waiting.reason == ("waiting: needs 2 cpu-slot; 0 of 0 cpu-slot in your quota in use; 0 idle to borrow; "
                              "number 1 in your queue")

    finish(job_id=first.pk, worker="w")  # it ends: the next in line gets its slots at once
    assert workload(third).state == WorkloadState.RUNNING
    assert workload(first).state == WorkloadState.FINISHED


def test_a_replica_job_never_waits_on_the_pool(teams):
    ask(teams["dev"], teams["a"]), ask(teams["dev"], teams["a"])
    from cluster.models import Node

    replica_like = dispatch_job(actor=teams["dev"], workspace=teams["a"], kind="node.inventory",
                                node=Node.objects.get(name="cpu-a"))
    assert not Workload.objects.filter(job=replica_like).exists()
    assert Job.objects.get(pk=replica_like.pk).celery_task_id


def test_an_urgent_job_preempts_a_low_one_which_checkpoints_is_requeued_and_resumes(teams):
    low = [ask(teams["dev"], teams["a"], priority="low") for _ in range(2)]
    urgent = ask(teams["ann"], teams["a"], priority="urgent")
    victims = [w for w in Workload.objects.filter(job__in=low) if w.state == WorkloadState.STOPPING]
    assert len(victims) == 1 and victims[0].stopped_for_id == urgent.pk
    assert pool.stop_instruction(victims[0].job_id) == "stop"
    assert workload(urgent).reason == f"preempting job {victims[0].job_id}; starts when they checkpoint"
    assert victims[0].job.events.last().message.startswith(f"Preempted by job {urgent.pk} (urgent)")

    STOPPED_HANDS_BACK["value"] = True  # the victim's process saved a checkpoint and stopped
    requeued = finish(job_id=victims[0].job_id, worker="w")
    assert requeued.state == JobState.QUEUED
    assert workload(urgent).state == WorkloadState.RUNNING
    again = workload(requeued)
    assert again.state == WorkloadState.WAITING and again.preemptions == 1
    assert "in your queue" in again.reason

    STOPPED_HANDS_BACK["value"] = False
    finish(job_id=urgent.pk, worker="w")
    assert workload(requeued).state == WorkloadState.RUNNING  # resumes when the urgent job is done
    assert finish(job_id=requeued.pk, worker="w").state == JobState.SUCCEEDED


def test_a_queue_reclaims_its_quota_from_a_borrower_without_a_quota_change_killing_anything(teams):
    borrowers = [ask(teams["bob"], teams["b"]) for _ in range(2)]
    set_quota(actor=teams["carl"], workspace=teams["a"], device_kind=KIND, nominal=2)
    assert all(workload(job).state == WorkloadState.RUNNING for job in borrowers), "a quota change stops nothing"
    # Past their minimum run time (FACTORY_POOL_MIN_RUN_S), B's jobs are reclaimed.
    Workload.objects.filter(job__in=borrowers).update(started_at=timezone.now() - timedelta(hours=1))
    mine = ask(teams["dev"], teams["a"], priority="low")
    stopping = Workload.objects.filter(job__in=borrowers, state=WorkloadState.STOPPING)
    assert stopping.count() == 1, "B borrows A's quota: A's low job reclaims it from B's normal one"
    assert workload(mine).reason.startswith("preempting job") or workload(mine).reason.startswith("waiting for")


def test_an_elastic_job_starts_on_what_is_free_and_shrinks_rather_than_stopping(teams):
    ask(teams["bob"], teams["b"], 1)
    elastic = ask(teams["dev"], teams["a"], 1, most=2, priority="low")
    assert workload(elastic).devices == 2, "the spare node's slots, on one node"
    ask(teams["bob"], teams["b"], 1)  # the pool is full
    # B's jobs would lose an hour's work; the elastic job has just checkpointed.
    Workload.objects.filter(job__workspace=teams["b"]).update(started_at=timezone.now() - timedelta(hours=1))
    Workload.objects.filter(job=elastic).update(last_checkpoint_at=timezone.now())
    urgent = ask(teams["ann"], teams["a"], 1, priority="urgent")
    shrinking = workload(elastic)
    assert shrinking.state == WorkloadState.STOPPING and sum(shrinking.stop_keep.values()) == 1
    STOPPED_HANDS_BACK["value"] = True
    finish(job_id=elastic.pk, worker="w")
    assert workload(elastic).state == WorkloadState.RUNNING and workload(elastic).devices == 1
    assert workload(urgent).state == WorkloadState.RUNNING


def test_a_waiting_job_is_not_sent_again_by_the_sweep_of_lost_messages(teams, settings):
    settings.CLUSTER_JOB_QUEUED_DEADLINE_S = 0
    ask(teams["dev"], teams["a"]), ask(teams["dev"], teams["a"])
    waiting = ask(teams["dev"], teams["a"])
    assert waiting.pk not in sweep_overdue_jobs()["redispatched"]


@translation.override("en")  # the messages as written: a page an earlier test rendered may have left another language
def test_bad_requests_and_quotas_are_refused_with_the_reason(teams):
    with pytest.raises(ValidationFailed, match="asks for up to 3 cpu-slot, and node cpu-a has 2 on one node|"
                                                "and the pool has 2 on one node"):
        ask(teams["dev"], teams["a"], 3)
    with pytest.raises(ValidationFailed, match="The urgent class needs the owner role"):
        ask(teams["dev"], teams["a"], priority="urgent")
    with pytest.raises(ValidationFailed, match="Unknown priority class 'asap'"):
        ask(teams["dev"], teams["a"], priority="asap")
    with pytest.raises(ValidationFailed, match="1 <= min <= max"):
        ask(teams["dev"], teams["a"], 2, most=1)
    with pytest.raises(ValidationFailed, match="no devices of kind 'H100'"):
        set_quota(actor=teams["carl"], workspace=teams["a"], device_kind="H100", nominal=1)
    with pytest.raises(ValidationFailed, match="would add up to 5, and the pool has 4"):
        set_quota(actor=teams["carl"], workspace=teams["a"], device_kind=KIND, nominal=5)
    ask(teams["dev"], teams["a"]), ask(teams["dev"], teams["a"])
    with pytest.raises(ValidationFailed, match="runs 4 cpu-slot now, above the quota plus borrowing limit of 2"):
        set_quota(actor=teams["carl"], workspace=teams["a"], device_kind=KIND, nominal=1, borrowing_limit=1)


def test_the_api_refuses_with_400s_and_shows_the_pool_with_reasons(teams, key_client):
    developer = key_client("dev", teams["a"])
    answer = developer.post("/api/cluster/quotas/", {"workspace": teams["a"].slug, "device_kind": KIND,
                                                     "nominal": 2}, format="json")
    assert answer.status_code == 403
    add_member(actor=teams["ann"], workspace=teams["a"], username="carl", role=Role.VIEWER)
    admin = APIClient()
    admin.login(username="carl", password="correct-horse-battery")
    session = admin.session
    session[WORKSPACE_SESSION_KEY] = teams["a"].pk
    session.save()
    too_much = admin.post("/api/cluster/quotas/", {"workspace": teams["a"].slug, "device_kind": KIND,
                                                   "nominal": 9}, format="json")
    assert too_much.status_code == 400 and "the pool has 4" in too_much.json()["error"]["message"]
    saved = admin.post("/api/cluster/quotas/", {"workspace": teams["a"].slug, "device_kind": KIND, "nominal": 2,
                                                "borrowing_limit": 0}, format="json")
    assert saved.status_code == 200, saved.json()
    assert DeviceQuota.objects.get(workspace=teams["a"]).nominal == 2

    first = ask(teams["dev"], teams["a"])
    second = ask(teams["dev"], teams["a"])
    view = developer.get("/api/cluster/pool/").json()
    jobs = {job["job"]: job for job in view["jobs"]}
    assert jobs[first.pk]["state"] == "running"
    assert jobs[second.pk]["reason"] == (f"waiting: needs 2 cpu-slot; 2 of 2 cpu-slot in your quota in use by job "
                                         f"{first.pk}; your borrowing limit of 0 is reached; number 1 in "
                                         f"your queue")
    assert view["queues"] == [{"workspace": teams["a"].slug, "workspace_id": teams["a"].pk, "device_kind": KIND,
                               "nominal": 2, "borrowing_limit": 0, "lending_limit": None, "in_use": 2,
                               "borrowed": 0, "lent": 0}]
    assert {kind["in_use"] for node in view["nodes"] for kind in node["devices"]} == {0, 2}
    assert developer.get("/api/cluster/jobs/").json()["results"][0]["queue"]["reason"].startswith("waiting: needs 2")

    page = admin.get("/cluster/")
    reasons = [cell.get_text() for cell in BeautifulSoup(page.content, "lxml").select("td.reason")]
    assert page.status_code == 200 and any(reason.endswith("number 1 in your queue") for reason in reasons)
    metrics = admin.get("/metrics")
    assert 'factory_pool_devices{device_kind="cpu-slot",node="cpu-a",state="in_use"}' in metrics.content.decode()


@override_settings(POOL_CPU_SLOTS=2)
def test_device_hours_are_counted_per_workspace(teams):
    job = ask(teams["dev"], teams["a"])
    Workload.objects.filter(job=job).update(started_at=workload(job).started_at.replace(year=2000),
                                            accounted_at=None)
    finish(job_id=job.pk, worker="w")
    from cluster.scheduling.selectors import device_hours

    assert device_hours()[(teams["a"].slug, KIND)] > 1000
