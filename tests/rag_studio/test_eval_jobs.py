"""Eval-set generation and eval runs as jobs, in one process: a generation that ends with nothing fails with the
reason, a second message for a run that is running (Redis redelivers after its visibility timeout) leaves it
alone, and beat dispatches again the runs and sets whose message was lost or whose worker died, failing them with
the reason after RAG_EVAL_MAX_ATTEMPTS."""

from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

from accounts.errors import RateLimited
from cluster import queues
from rag_studio import selectors, services
from rag_studio.evals import evaluation, jobs
from rag_studio.models import Document, EvalResult, EvalRun, EvalSet, JobStatus
from serving.models import Deployment
from tests.conftest import UNREAD_QUEUE

CHAT = "smollm2-135m-instruct"
real_send = queues.send
# The tests on the knowledge base share one (the test that needs no database does not make it).
shares_northwind = pytest.mark.usefixtures("shared_northwind")


@pytest.fixture
def dispatched(monkeypatch) -> list[tuple[str, int]]:
    sent = []
    monkeypatch.setattr(jobs.queues, "send", lambda task, args, **options: sent.append((task, args[0])))
    return sent


@pytest.fixture
def chat_deployment(presets):
    """A chat deployment by name; nothing runs it: these tests never reach the model."""
    return Deployment.objects.create(workspace=None, name=CHAT, model=presets[CHAT], engine="llamacpp")


@pytest.fixture
def eval_set(acme, ann, indexed_kb, chat_deployment, dispatched, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=True):
        return evaluation.start_generation(actor=ann, kb=indexed_kb, name="Generated", generator=CHAT, count=3)


@shares_northwind
def test_a_generation_that_ends_with_no_items_fails_with_the_reason(eval_set, indexed_kb):
    # The documents were deleted after the set was queued: there is nothing left to ask about.
    Document.objects.filter(knowledge_base=indexed_kb).delete()

    assert evaluation.generate_items(eval_set.pk, "worker@n/1/t1") == JobStatus.FAILED
    eval_set.refresh_from_db()
    assert eval_set.status == JobStatus.FAILED and not eval_set.items.exists()
    assert eval_set.error.startswith("No question could be generated from the 0 sampled passage(s)")


def test_generation_holds_the_model_to_a_json_schema_and_reads_its_reply():
    schema = evaluation.QA_SCHEMA
    assert schema["required"] == ["question", "answer"] and schema["additionalProperties"] is False
    assert evaluation.parse_generated('{"question": "How long is the warranty?", "answer": "Two years."}') == (
        "How long is the warranty?", "Two years.")
    assert evaluation.parse_generated('{"question": "How long is the') is None  # cut short


def _run(acme, ann, eval_set, dispatched, django_capture_on_commit_callbacks) -> EvalRun:
    eval_set.items.create(question="How many days of annual leave?", expected_answer="25")
    EvalSet.objects.filter(pk=eval_set.pk).update(status=JobStatus.DONE)
    eval_set.refresh_from_db()
    config = services.save_rag_config(actor=ann, workspace=acme, name="QA", knowledge_base=eval_set.knowledge_base,
                                      template="basic", model=CHAT)
    with django_capture_on_commit_callbacks(execute=True):
        return evaluation.start_run(actor=ann, eval_set=eval_set, version=selectors.config_version(config))


@shares_northwind
def test_a_second_message_for_a_running_run_leaves_it_running(acme, ann, eval_set, dispatched,
                                                               django_capture_on_commit_callbacks):
    run = _run(acme, ann, eval_set, dispatched, django_capture_on_commit_callbacks)
    assert (jobs.RUN_TASK, run.pk) in dispatched
    # Worker A is running it (its lease is fresh); Redis hands the message to worker B after the visibility timeout.
    EvalRun.objects.filter(pk=run.pk).update(status=JobStatus.RUNNING, lease_owner="worker@a/1/t1",
                                             lease_until=timezone.now() + timedelta(seconds=60))

    assert evaluation.execute_run(run.pk, "worker@b/2/t1") == JobStatus.RUNNING
    run.refresh_from_db()
    assert (run.status, run.error, run.lease_owner) == (JobStatus.RUNNING, "", "worker@a/1/t1")
    assert not EvalResult.objects.filter(run=run).exists()


@shares_northwind
def test_beat_dispatches_lost_and_abandoned_eval_work_again_and_fails_it_after_the_attempts(
        acme, ann, eval_set, dispatched, django_capture_on_commit_callbacks, settings):
    settings.RAG_QUEUED_REDISPATCH_S, settings.RAG_EVAL_MAX_ATTEMPTS = 60, 2
    run = _run(acme, ann, eval_set, dispatched, django_capture_on_commit_callbacks)
    long_ago = timezone.now() - timedelta(seconds=120)
    # The run's message was lost; the generation's worker died (its lease ran out).
    EvalRun.objects.filter(pk=run.pk).update(dispatched_at=long_ago)
    EvalSet.objects.filter(pk=eval_set.pk).update(status=JobStatus.RUNNING, lease_owner="worker@a/1/t1",
                                                  lease_until=long_ago, attempts=2)
    dispatched.clear()

    swept = jobs.sweep_overdue()

    assert swept == {jobs.GENERATE_TASK: [eval_set.pk], jobs.RUN_TASK: [run.pk], jobs.TUNE_TASK: []}
    assert sorted(dispatched) == sorted([(jobs.GENERATE_TASK, eval_set.pk), (jobs.RUN_TASK, run.pk)])
    # Taken over a third time, past RAG_EVAL_MAX_ATTEMPTS: it fails, saying why.
    assert evaluation.generate_items(eval_set.pk, "worker@b/2/t2") == JobStatus.FAILED
    eval_set.refresh_from_db()
    assert eval_set.status == JobStatus.FAILED and eval_set.error.startswith("Stopped 2 times without finishing")
    assert jobs.sweep_overdue() == {jobs.GENERATE_TASK: [], jobs.RUN_TASK: [], jobs.TUNE_TASK: []}


@shares_northwind
def test_a_queued_run_says_where_it_stands_and_a_workspace_holds_at_most_its_limit_of_jobs(
        acme, ann, eval_set, key_client, settings, monkeypatch, django_capture_on_commit_callbacks):
    """Its message waits in the interactive line (here the tests' unread queue, where every message goes), behind
    another workspace's job, whose name it never sees."""
    monkeypatch.setattr(jobs.queues, "send", real_send)
    monkeypatch.setattr(jobs.queues, "INTERACTIVE", UNREAD_QUEUE)
    queues.broker().delete(UNREAD_QUEUE)
    queues.send(jobs.RUN_TASK, [987654], queue=UNREAD_QUEUE, workspace_id=acme.pk + 1000)
    run = _run(acme, ann, eval_set, [], django_capture_on_commit_callbacks)

    shown = key_client("ann", acme).get(f"/api/rag/eval-runs/{run.pk}/").json()
    assert shown["status"] == "queued" and shown["queue"]["position"] == 2
    assert shown["queue"]["ahead_in_your_workspace"] == 0 and shown["queue"]["estimated_start_s"] > 0
    assert "interactive worker" in shown["queue"]["reason"]

    settings.WORKSPACE_MAX_JOBS = 1
    with pytest.raises(RateLimited, match="limit of 1 evaluations"):
        evaluation.start_run(actor=ann, eval_set=EvalSet.objects.get(pk=eval_set.pk),
                             version=run.config_version)
    queues.broker().delete(UNREAD_QUEUE)


@shares_northwind
def test_beat_leaves_a_queued_job_alone_while_its_message_waits_its_turn(acme, ann, eval_set, dispatched, settings,
                                                                        monkeypatch,
                                                                        django_capture_on_commit_callbacks):
    settings.RAG_QUEUED_REDISPATCH_S = 60
    monkeypatch.setattr(jobs.queues, "INTERACTIVE", UNREAD_QUEUE)
    queues.broker().delete(UNREAD_QUEUE)
    run = _run(acme, ann, eval_set, dispatched, django_capture_on_commit_callbacks)
    EvalRun.objects.filter(pk=run.pk).update(dispatched_at=timezone.now() - timedelta(seconds=600))
    real_send(jobs.RUN_TASK, [run.pk], queue=UNREAD_QUEUE, workspace_id=acme.pk)
    assert jobs.sweep_overdue()[jobs.RUN_TASK] == []  # in line still, only slow: no copy
    queues.broker().delete(UNREAD_QUEUE)  # lost, as with a Redis restart
    assert jobs.sweep_overdue()[jobs.RUN_TASK] == [run.pk]


@shares_northwind
def test_a_queued_run_is_cancelled_from_the_api_and_leaves_the_line_at_once(
        acme, ann, eval_set, key_client, monkeypatch, django_capture_on_commit_callbacks):
    monkeypatch.setattr(jobs.queues, "send", real_send)
    monkeypatch.setattr(jobs.queues, "INTERACTIVE", UNREAD_QUEUE)
    queues.broker().delete(UNREAD_QUEUE)
    queues.send(jobs.RUN_TASK, [987654], queue=UNREAD_QUEUE, workspace_id=acme.pk + 1000)
    run = _run(acme, ann, eval_set, [], django_capture_on_commit_callbacks)
    api = key_client("ann", acme)
    assert [message.args for message in queues.waiting(UNREAD_QUEUE)] == [(987654,), (run.pk,)]

    cancelled = api.post(f"/api/rag/eval-runs/{run.pk}/cancel/")

    assert cancelled.status_code == 200 and cancelled.json()["status"] == "cancelled"
    assert cancelled.json()["queue"] is None
    # Its message left the line; the other workspace's stays.
    assert [message.args for message in queues.waiting(UNREAD_QUEUE)] == [(987654,)]
    again = api.post(f"/api/rag/eval-runs/{run.pk}/cancel/")
    assert again.status_code == 409 and "only a queued or running run" in again.json()["error"]["message"]
    # A copy of the message that a worker had already taken finds nothing to do.
    assert evaluation.execute_run(run.pk, "worker@a/1/t1") == JobStatus.CANCELLED
    assert not EvalResult.objects.filter(run=run).exists()
    queues.broker().delete(UNREAD_QUEUE)


@shares_northwind
def test_a_running_generation_cancelled_in_the_gui_stops_before_its_next_question(
        acme, ann, eval_set, monkeypatch):
    EvalSet.objects.filter(pk=eval_set.pk).update(status=JobStatus.RUNNING, lease_owner="worker@a/1/t1",
                                                  lease_until=timezone.now() + timedelta(seconds=60))
    browser = Client()
    browser.force_login(ann.user)
    page = browser.get("/rag/evals/").content.decode()
    assert 'name="action" value="cancel_set"' in page

    browser.post("/rag/evals/", {"action": "cancel_set", "id": eval_set.pk})

    eval_set.refresh_from_db()
    assert eval_set.status == JobStatus.CANCELLED and eval_set.lease_owner == ""
    with pytest.raises(jobs.Held):  # what the worker checks before saving each question
        jobs.still_held(EvalSet, eval_set.pk, "worker@a/1/t1")
    assert 'value="cancel_set"' not in browser.get("/rag/evals/").content.decode()
