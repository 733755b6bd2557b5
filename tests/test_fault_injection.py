"""Fault injection on the real platform: Celery workers, the gateway, llama-server replicas, Redis and SQLite, each
broken the hard way (kill -9, a Redis restart that loses its queues, a full disk). Every piece of work must end
finished, or failed with its reason, and nothing half-written may be marked good. Each test prints what was lost
(target 0); run with -s to see the lines."""

import errno
import io
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import psutil
import pytest
from celery import Celery, current_app
from cryptography.fernet import Fernet
from django.contrib.auth import get_user_model
from django.test import override_settings

from accounts.services import SYSTEM, Actor, create_api_key, create_workspace
from cluster import deadlines, inventory
from cluster.models import Job, JobState
from cluster.services import register_node
from rag_studio import selectors, services
from rag_studio.evals import evaluation, jobs
from rag_studio.models import Document, DocumentStatus, EvalRun, JobStatus, Stage
from rag_studio.pipeline import ingestion
from rag_studio.pipeline.storage import StorageFull, UploadedFile
from rag_studio.search.stores import store_for
from serving import services as serving_services
from serving.engines import process
from serving.models import Deployment, Replica, ServingEvent, ServingState
from serving.presets import SMOLLM2
from tests.conftest import (
    ROOT,
    WORKER_NODE,
    consumers_paused,
    deploy_presets,
    free_port,
    platform_env,
    stop_engines_and_flush,
    wait_for,
)
from workbridge import vault

pytestmark = [pytest.mark.worker, pytest.mark.timeout(600)]


def report(case: str, **figures) -> None:
    print(f"\nfault injection: {case}: " + ", ".join(f"{name} {value}" for name, value in figures.items()))


@pytest.fixture(scope="module")
def platform(celery_worker_process, web_server, django_db_blocker):
    """The session's worker and web server with SmolLM2 deployed, and a workspace."""
    with django_db_blocker.unblock():
        deploy_presets({SMOLLM2: 1}, cooldown_s=1.0)
        owner = get_user_model().objects.create_user(username="faults", password="x" * 12)
        actor = Actor(user=owner)
        workspace = create_workspace(actor=actor, name="Faults")
        yield {"url": web_server, "actor": actor, "workspace": workspace, "session_worker": celery_worker_process}
        stop_engines_and_flush()


@pytest.fixture
def session_worker_off_ingest(platform):
    """The session's worker stops taking from the ingest and interactive queues, so that the workers a test starts
    (and kills) do the ingestion and evaluation there; it takes from them again afterwards."""
    with consumers_paused(platform["session_worker"]["hostname"], "ingest", "interactive"):
        yield


class Worker:
    """A `celery worker` of its own, in its own session (so that killing it kills its pool, and only that)."""

    def __init__(self, name: str, queues: str, *, web_port: int, node: str = WORKER_NODE, concurrency: int = 1,
                 env: dict | None = None):
        self.hostname = f"{name}@{node}"
        self.log = Path(os.environ["FACTORY_DATA_DIR"]) / f"{name}-{os.getpid()}.log"
        full_env = {**os.environ, **platform_env(web_port), "FACTORY_NODE_NAME": node, **(env or {})}
        self.process = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "factory", "worker", "--queues", queues, "--hostname",
             self.hostname, "--concurrency", str(concurrency), "--without-gossip", "--without-mingle",
             "--loglevel", "INFO"],
            cwd=ROOT, env=full_env, stdout=self.log.open("wb"), stderr=subprocess.STDOUT, start_new_session=True)
        wait_for(self._answers, timeout=90, what=f"worker {self.hostname} to start")

    def _answers(self) -> bool:
        if self.process.poll() is not None:
            pytest.fail(f"{self.hostname} exited:\n{self.log.read_text()[-3000:]}")
        return bool(current_app.control.ping(destination=[self.hostname], timeout=0.5))

    def kill(self) -> None:
        """kill -9 of the whole worker: its main process and its pool."""
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.process.wait(timeout=30)


@pytest.fixture
def workers():
    started = []
    yield lambda *args, **kwargs: started.append(Worker(*args, **kwargs)) or started[-1]
    for worker in started:
        worker.kill()


def _maintenance_log(count: int, words: int) -> list[UploadedFile]:
    """Distinct text documents of about `words` words each (12,000 words: about a hundred chunks)."""
    documents = []
    for n in range(count):
        lines = [f"Unit {n}-{i}: the NW-7 robot logged a lidar check, a battery test at {(n * 31 + i) % 97} percent "
                 f"and firmware note {n}.{i} for aisle {(n * 7 + i) % 113}." for i in range(words // 24)]
        content = "\n\n".join(lines).encode()
        documents.append(UploadedFile(f"maintenance-{n:02d}.txt", io.BytesIO(content), len(content)))
    return documents


def _lost_documents(kb) -> list[str]:
    """Documents not indexed, or indexed with entries that are not exactly their chunks."""
    store = store_for(kb)
    lost = []
    for document in kb.documents.all():
        chunk_ids = sorted(document.chunks.filter(searchable=True).values_list("pk", flat=True))
        if document.status != DocumentStatus.INDEXED or sorted(store.chunk_ids(str(document.pk))) != chunk_ids:
            lost.append(f"{document.filename} ({document.status}: {document.error})")
    return lost


def _all_final(kb) -> bool:
    ingestion.resume_stalled()  # what beat does every few seconds
    return not kb.documents.filter(status__in=[DocumentStatus.QUEUED, DocumentStatus.PROCESSING]).exists()


@pytest.mark.slow
def test_a_pool_process_killed_mid_ingestion_loses_no_document(platform, web_port, live_db, workers,
                                                                session_worker_off_ingest):
    kb = services.create_knowledge_base(actor=platform["actor"], workspace=platform["workspace"], name="Kill ingest")
    worker = workers("fault-ingest", "ingest", web_port=web_port, concurrency=2,
                     env={"FACTORY_RAG_INGEST_LEASE_S": "3", "FACTORY_RAG_EMBED_BATCH_SIZE": "4",
                          "FACTORY_RAG_INGEST_GROUP_DOCS": "2"})
    services.upload_documents(actor=platform["actor"], kb=kb, uploads=_maintenance_log(6, words=12000))

    def embedding_under_way() -> Document | None:
        return kb.documents.filter(stage=Stage.EMBED, progress__gte=40, status=DocumentStatus.PROCESSING,
                                   lease_owner__startswith=worker.hostname).first()

    victim = wait_for(embedding_under_way, timeout=240, interval=0.05, what="a document half embedded")
    pool_process = int(victim.lease_owner.split("/")[1])
    os.kill(pool_process, signal.SIGKILL)
    with override_settings(RAG_QUEUED_REDISPATCH_S=5):
        wait_for(lambda: _all_final(kb), timeout=400, interval=2, what="every document to be finished")

    lost = _lost_documents(kb)
    report("kill -9 of a pool process (concurrency 2) mid-ingestion", documents=kb.documents.count(),
           lost=len(lost))
    assert lost == []
    messages = list(Document.objects.get(pk=victim.pk).events.values_list("message", flat=True))
    assert any(message.startswith("Resumed at the") for message in messages), messages


@pytest.mark.slow
def test_a_worker_killed_mid_eval_run_resumes_and_scores_each_question_once(platform, web_port, live_db, workers,
                                                                            session_worker_off_ingest):
    actor, workspace = platform["actor"], platform["workspace"]
    kb = services.create_knowledge_base(actor=actor, workspace=workspace, name="Kill eval")
    services.upload_documents(actor=actor, kb=kb, uploads=_maintenance_log(1, words=300))
    worker = workers("fault-eval", "ingest,interactive", web_port=web_port, env={"FACTORY_RAG_EVAL_LEASE_S": "3"})
    with override_settings(RAG_QUEUED_REDISPATCH_S=5):  # beat sends the task again should its message be lost
        wait_for(lambda: _all_final(kb), timeout=300, interval=2, what="indexing")
    questions = "question,expected_answer\n" + "".join(f"What did unit 0-{i} log?,a lidar check\n" for i in range(8))
    eval_set = evaluation.upload_eval_set(actor=actor, kb=kb, name="Units", filename="units.csv",
                                          content=questions.encode())
    config = services.save_rag_config(actor=actor, workspace=workspace, name="Units QA", knowledge_base=kb,
                                      template="basic", model=SMOLLM2, generation={"max_tokens": 16})
    run = evaluation.start_run(actor=actor, eval_set=eval_set, version=selectors.config_version(config))

    def half_done() -> EvalRun | None:
        current = EvalRun.objects.get(pk=run.pk)
        return current if current.results.count() >= 3 and current.lease_owner.startswith(worker.hostname) else None

    running = wait_for(half_done, timeout=240, interval=0.1, what="the run to be half done")
    os.kill(int(running.lease_owner.split("/")[1]), signal.SIGKILL)

    def finished() -> bool:
        with override_settings(RAG_QUEUED_REDISPATCH_S=5):
            jobs.sweep_overdue()  # what beat does every few seconds
        return EvalRun.objects.get(pk=run.pk).status in (JobStatus.DONE, JobStatus.FAILED)

    wait_for(finished, timeout=400, interval=2, what="the run to finish")
    run.refresh_from_db()
    scored = list(run.results.values_list("item_id", flat=True))
    lost = eval_set.items.count() - len(set(scored))
    report("kill -9 of the worker's pool process mid-eval-run", questions=eval_set.items.count(),
           scored_twice=len(scored) - len(set(scored)), lost=lost, attempts=run.attempts)
    assert (run.status, run.error) == (JobStatus.DONE, "")
    assert lost == 0 and len(scored) == len(set(scored)) and run.attempts >= 2


@pytest.mark.slow
def test_a_worker_killed_while_its_engine_starts_is_replaced_and_the_replica_comes_up(platform, web_port, live_db,
                                                                                      workers, settings):
    settings.CLUSTER_JOB_HEARTBEAT_S = 1
    node = register_node(name="fault-node", resources=inventory.probe())
    deployment = serving_services.create_deployment(
        actor=SYSTEM, workspace=None, model=Deployment.objects.get(name=SMOLLM2).model, name="fault-chat",
        replicas=[(node, 1.0)])
    first = workers("node", "default,node.fault-node", web_port=web_port, node="fault-node",
                    env={"FACTORY_JOB_HEARTBEAT_S": "1"})
    serving_services.start_deployment(actor=SYSTEM, deployment=deployment)
    replica = Replica.objects.get(deployment=deployment)
    job = Job.objects.get(kind=serving_services.START_REPLICA, payload__replica_id=replica.pk)
    wait_for(lambda: Job.objects.get(pk=job.pk).state == JobState.RUNNING, timeout=120, interval=0.02,
             what="the start job to run")
    first.kill()  # mid-start: the job is running, the replica starting, its engine launching or loading
    launched = Replica.objects.get(pk=replica.pk).pid
    assert Job.objects.get(pk=job.pk).state == JobState.RUNNING

    wait_for(lambda: job.pk in deadlines.sweep_overdue_jobs()["redispatched"], timeout=60, interval=1,
             what="beat to send the start again")
    workers("node-again", "default,node.fault-node", web_port=web_port, node="fault-node",
            env={"FACTORY_JOB_HEARTBEAT_S": "1"})
    wait_for(lambda: Replica.objects.get(pk=replica.pk).state in (ServingState.READY, ServingState.FAILED),
             timeout=180, what="the replica to come up")
    replica.refresh_from_db()
    job.refresh_from_db()
    try:
        stray = int(bool(launched) and launched != replica.pid and process.is_alive(launched))
        report("kill -9 of the node worker mid-engine-start", job=job.state, replica=replica.state,
               stray_engines=stray)
        assert (replica.state, job.state) == (ServingState.READY, JobState.SUCCEEDED), replica.last_error
        assert stray == 0
    finally:
        serving_services.stop_deployment(actor=SYSTEM, deployment=deployment)
        wait_for(lambda: Replica.objects.get(pk=replica.pk).state == ServingState.STOPPED, timeout=60,
                 what="the replica to stop")


def _engines_serving(name: str) -> list[int]:
    """The llama-server processes serving `name` (its alias), whoever started them."""
    return [engine.pid for engine in psutil.process_iter(["cmdline"])
            if "llama-server" in " ".join(engine.info["cmdline"] or []) and name in (engine.info["cmdline"] or [])]


def _smollm2_on_a_node_of_its_own(node: str, name: str) -> Deployment:
    """A SmolLM2 deployment of one replica on node `node`, which no worker serves until the test starts one."""
    return serving_services.create_deployment(
        actor=SYSTEM, workspace=None, model=Deployment.objects.get(name=SMOLLM2).model, name=name,
        replicas=[(register_node(name=node, resources=inventory.probe()), 1.0)])


def test_a_start_that_fails_after_its_engine_launched_stops_that_engine_and_says_why(platform, web_port, live_db,
                                                                                     workers):
    deployment = _smollm2_on_a_node_of_its_own("bad-key-node", "bad-key-chat")
    # A node whose secrets key is no key: it launches the engine, then cannot store the engine's own key.
    workers("bad-key", "node.bad-key-node", web_port=web_port, node="bad-key-node",
            env={"FACTORY_SECRETS_KEY": "not-a-fernet-key"})
    serving_services.start_deployment(actor=SYSTEM, deployment=deployment)
    replica = Replica.objects.get(deployment=deployment)
    wait_for(lambda: Replica.objects.get(pk=replica.pk).state == ServingState.FAILED, timeout=120,
             what="the start to fail")

    replica.refresh_from_db()
    job = Job.objects.get(kind=serving_services.START_REPLICA, payload__replica_id=replica.pk)
    report("a start failing after its engine launched", replica=replica.state, job=job.state,
           stray_engines=len(_engines_serving("bad-key-chat")))
    assert "Fernet key must be 32 url-safe base64-encoded bytes" in replica.last_error
    assert "logs/node.log" in replica.last_error and replica.pid is None
    assert job.state == JobState.FAILED
    assert _engines_serving("bad-key-chat") == []


@pytest.mark.slow
def test_a_replica_whose_engine_key_no_longer_decrypts_is_restarted_with_a_new_one(platform, web_port, live_db,
                                                                                  workers):
    from serving.tasks import check_local_replicas

    deployment = _smollm2_on_a_node_of_its_own("lost-key-node", "lost-key-chat")
    # The worker that starts the replica holds a key no other process has (two processes that each made their own
    # on a fresh data dir): the replica's engine key is stored encrypted with it.
    stray = workers("stray-key", "node.lost-key-node", web_port=web_port, node="lost-key-node",
                    env={"FACTORY_SECRETS_KEY": Fernet.generate_key().decode()})
    serving_services.start_deployment(actor=SYSTEM, deployment=deployment)
    replica = Replica.objects.get(deployment=deployment)
    wait_for(lambda: Replica.objects.get(pk=replica.pk).state == ServingState.READY, timeout=120,
             what="the replica to start")
    stray.kill()
    first = Replica.objects.get(pk=replica.pk)  # every other process can still load the row
    assert vault.unreadable(first.api_key)

    key = create_api_key(actor=platform["actor"], workspace=platform["workspace"], name="lost key").secret
    auth = {"Authorization": f"Bearer {key}"}
    others = httpx.post(f"{platform['url']}/v1/chat/completions", headers=auth, timeout=60,
                        json={"model": SMOLLM2, "max_tokens": 4, "messages": [{"role": "user", "content": "Hi"}]})
    assert others.status_code == 200

    workers("node-with-key", "node.lost-key-node", web_port=web_port, node="lost-key-node")

    def restarted() -> bool:
        check_local_replicas.apply_async(queue="node.lost-key-node")  # what beat does every few seconds
        current = Replica.objects.get(pk=replica.pk)
        return current.state == ServingState.READY and current.pid != first.pid

    wait_for(restarted, timeout=120, interval=2, what="the replica to be restarted with a new key")
    events = list(ServingEvent.objects.filter(replica=replica).values_list("message", flat=True))
    answer = httpx.post(f"{platform['url']}/v1/chat/completions", headers=auth, timeout=60,
                        json={"model": "lost-key-chat", "max_tokens": 4,
                              "messages": [{"role": "user", "content": "Hi"}]})
    report("a replica key no process can decrypt", restarted=1, old_engine_alive=int(process.is_alive(first.pid)),
           next_request=answer.status_code)
    assert any("engine key cannot be decrypted" in message for message in events)
    assert not process.is_alive(first.pid) and not vault.unreadable(Replica.objects.get(pk=replica.pk).api_key)
    assert answer.status_code == 200
    serving_services.stop_deployment(actor=SYSTEM, deployment=deployment)
    wait_for(lambda: Replica.objects.get(pk=replica.pk).state == ServingState.STOPPED, timeout=60,
             what="the replica to stop")


def test_a_replica_killed_mid_stream_ends_the_stream_with_an_error_and_is_restarted(platform, live_db):
    key = create_api_key(actor=platform["actor"], workspace=platform["workspace"], name="faults").secret
    replica = Replica.objects.get(deployment__name=SMOLLM2)
    chunks, ended_with = 0, None
    started = time.monotonic()
    with httpx.stream("POST", f"{platform['url']}/v1/chat/completions", timeout=60,
                      headers={"Authorization": f"Bearer {key}"},
                      json={"model": SMOLLM2, "stream": True, "max_tokens": 400, "temperature": 0.7,
                            "messages": [{"role": "user", "content": "Tell a long story about a robot."}]}) as reply:
        for line in reply.iter_lines():
            if not line.startswith("data: "):
                continue
            if line == "data: [DONE]":
                ended_with = "done"
                break
            event = json.loads(line[6:])
            if "error" in event:
                ended_with = event["error"]["message"]
                break
            chunks += 1
            if chunks == 3:
                os.kill(replica.pid, signal.SIGKILL)
    cut_after_s = time.monotonic() - started

    def restarted() -> bool:
        from serving.tasks import check_replicas

        check_replicas.delay()  # what beat does every few seconds
        current = Replica.objects.get(pk=replica.pk)
        return current.state == ServingState.READY and current.pid != replica.pid

    wait_for(restarted, timeout=120, interval=2, what="the replica to be restarted")
    answer = httpx.post(f"{platform['url']}/v1/chat/completions", headers={"Authorization": f"Bearer {key}"},
                        json={"model": SMOLLM2, "max_tokens": 8, "messages": [{"role": "user", "content": "Hi"}]},
                        timeout=60)
    report("kill -9 of a replica mid-stream", stream_ended=ended_with, seconds=round(cut_after_s, 1),
           hung=0, next_request=answer.status_code)
    assert ended_with not in (None, "done") and "mid-stream" in ended_with
    assert answer.status_code == 200


@pytest.mark.slow
def test_a_redis_restart_that_loses_every_queue_loses_no_document(platform, web_port, live_db, tmp_path,
                                                                    session_worker_off_ingest):
    """A private Redis (no persistence) and worker; the Redis is killed and started again, empty, mid-run. This
    test sends the ingestion sweep to it every two seconds, as beat would (a whole beat would also run the pool's
    heartbeats and job sweeps against the shared test database)."""
    port = free_port()
    redis_url = f"redis://127.0.0.1:{port}/0"

    def start_redis() -> None:
        subprocess.run(["redis-server", "--bind", "127.0.0.1", "--port", str(port), "--save", "", "--appendonly",
                        "no", "--daemonize", "yes", "--pidfile", str(tmp_path / "redis.pid"), "--dir", str(tmp_path),
                        "--logfile", str(tmp_path / "redis.log")], check=True)
        wait_for(lambda: subprocess.run(["redis-cli", "-p", str(port), "ping"], capture_output=True).returncode == 0,
                 timeout=10, what="redis")

    env = {**os.environ, **platform_env(web_port), "REDIS_URL": redis_url, "FACTORY_RAG_INGEST_LEASE_S": "5",
           "FACTORY_RAG_QUEUED_REDISPATCH_S": "5", "FACTORY_RAG_EMBED_BATCH_SIZE": "8",
           "FACTORY_RAG_INGEST_GROUP_DOCS": "2"}
    start_redis()
    worker = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "factory", "worker", "--queues", "default,ingest", "--hostname",
         f"redis-fault@{WORKER_NODE}", "--concurrency", "2", "--without-gossip", "--without-mingle"],
        cwd=ROOT, env=env, stdout=(tmp_path / "worker.log").open("wb"), stderr=subprocess.STDOUT,
        start_new_session=True)
    beat = Celery(broker=redis_url, set_as_current=False)  # the test itself keeps the session's broker

    def swept_and_finished(kb) -> bool:
        try:
            beat.send_task("rag_studio.tasks.resume_stalled_documents", queue="default", retry=False)
        except Exception:  # Redis is down this moment; beat would try again at its next tick
            pass
        return not kb.documents.filter(status__in=[DocumentStatus.QUEUED, DocumentStatus.PROCESSING]).exists()

    try:
        kb = services.create_knowledge_base(actor=platform["actor"], workspace=platform["workspace"],
                                            name="Redis restart")
        # Their messages go to the session's Redis, which no worker here reads: lost, as far as these workers
        # know, until the sweep sends them again.
        services.upload_documents(actor=platform["actor"], kb=kb, uploads=_maintenance_log(8, words=600))
        wait_for(lambda: swept_and_finished(kb) or kb.documents.filter(status=DocumentStatus.INDEXED).count() >= 2,
                 timeout=240, interval=2, what="ingestion to be under way")
        os.kill(int((tmp_path / "redis.pid").read_text()), signal.SIGKILL)
        time.sleep(2)
        start_redis()  # empty: every queued and unacknowledged message is gone
        wait_for(lambda: swept_and_finished(kb), timeout=400, interval=2, what="every document to be finished")
        lost = _lost_documents(kb)
        report("Redis killed and restarted empty mid-ingestion", documents=kb.documents.count(), lost=len(lost))
        assert lost == []
    finally:
        os.killpg(worker.pid, signal.SIGKILL)
        worker.wait(timeout=30)
        subprocess.run(["redis-cli", "-p", str(port), "shutdown", "nosave"], capture_output=True)


WRITER = """
import sys, time
import django
django.setup()
from django.db import OperationalError, transaction
from rag_studio.models import Document, DocumentEvent
document = Document.objects.get(pk=int(sys.argv[1]))
failures = 0
for n in range(150):
    try:
        with transaction.atomic():
            DocumentEvent.objects.create(document=document, stage="done", message=f"writer {sys.argv[2]} row {n}")
            Document.objects.filter(pk=document.pk).update(page_count=n)
    except OperationalError as exc:
        failures += 1
        print(exc, file=sys.stderr)
print(failures)
"""


@pytest.mark.slow
def test_several_processes_writing_sqlite_at_once_lose_nothing(platform, web_port, live_db, workers,
                                                               session_worker_off_ingest):
    actor = platform["actor"]
    kb = services.create_knowledge_base(actor=actor, workspace=platform["workspace"], name="Busy database")
    workers("busy-ingest", "ingest", web_port=web_port, concurrency=2, env={"FACTORY_RAG_INGEST_GROUP_DOCS": "1"})
    anchor, = services.upload_documents(actor=actor, kb=kb, uploads=_maintenance_log(1, words=100))
    env = {**os.environ, **platform_env(web_port), "DJANGO_SETTINGS_MODULE": "factory.settings"}
    writers = [subprocess.Popen([sys.executable, "-c", WRITER, str(anchor.document.pk), str(n)], cwd=ROOT, env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for n in range(3)]
    services.upload_documents(actor=actor, kb=kb, uploads=_maintenance_log(7, words=400)[1:])
    failures = [int(writer.communicate(timeout=300)[0].strip().splitlines()[-1]) for writer in writers]
    wait_for(lambda: _all_final(kb), timeout=300, interval=2, what="every document to be finished")

    lost = _lost_documents(kb)
    written = Document.objects.get(pk=anchor.document.pk).events.filter(message__startswith="writer ").count()
    report("three writer processes beside two ingesting ones on SQLite", writer_rows=written,
           writer_failures=sum(failures), documents=kb.documents.count(), lost=len(lost))
    assert failures == [0, 0, 0] and written == 450 and lost == []


def _mount_tmpfs(path: Path, size: str) -> None:
    path.mkdir(parents=True, exist_ok=True)
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True)
    if mounted.returncode:
        pytest.skip(f"a tmpfs cannot be mounted here ({mounted.stderr.decode().strip()}); needs root")


def test_a_full_disk_fails_work_with_the_reason_and_leaves_every_index_whole(platform, live_db,
                                                                             session_worker_off_ingest):
    actor = platform["actor"]
    kb = services.create_knowledge_base(actor=actor, workspace=platform["workspace"], name="Full disk")
    kb_dir = services.files.kb_dir(kb.pk)
    _mount_tmpfs(kb_dir, "2m")  # its uploads and indexes, on a disk of 2 MiB
    try:
        for outcome in services.upload_documents(actor=actor, kb=kb, uploads=_maintenance_log(2, words=2000)):
            assert ingestion.ingest(outcome.document.pk, "fault-test") == DocumentStatus.INDEXED
        indexed_before = store_for(kb).count()

        filler = kb_dir / "filler"  # the disk fills up, as other files would fill it
        with filler.open("wb") as out:
            try:
                while True:
                    out.write(b"\0" * 65536)
                    out.flush()
            except OSError as exc:
                assert exc.errno == errno.ENOSPC
        with pytest.raises(StorageFull, match="The data directory is full"):
            services.upload_documents(actor=actor, kb=kb, uploads=_maintenance_log(3, words=2000)[2:])
        # Room for an upload, but not for the index write that follows it.
        filler.write_bytes(b"\0" * (filler.stat().st_size - 64_000))
        late, = services.upload_documents(actor=actor, kb=kb, uploads=_maintenance_log(4, words=6000)[3:])
        assert ingestion.ingest(late.document.pk, "fault-test") == DocumentStatus.FAILED
        late.document.refresh_from_db()

        store = store_for(kb)
        half_written = [name for name in _lost_documents(kb) if not name.startswith(late.document.filename)]
        report("the data dir's disk full (tmpfs)", upload="507 storage_full", ingestion=late.document.error_code,
               chunks_still_indexed=f"{store.count()}/{indexed_before}", half_written_marked_good=len(half_written))
        assert late.document.error_code == "storage_full" and "free space" in late.document.error
        assert store.count() == indexed_before and half_written == []
        assert store.chunk_ids(str(late.document.pk)) == []

        filler.unlink()  # an operator frees space and retries the document
        services.retry_document(actor=actor, document=late.document)
        assert ingestion.ingest(late.document.pk, "fault-test") == DocumentStatus.INDEXED
        assert _lost_documents(kb) == []
    finally:
        subprocess.run(["umount", "-l", str(kb_dir)], capture_output=True)
