"""Fair background work (issue 31): how long one workspace's documents and short jobs wait while another workspace's
bulk upload is being ingested, and what sharing costs the bulk upload.

    .venv/bin/python -m bench.fairness [--documents 1000] [--words 60-300] [--b-every-s 20] [--timeout-min 20] [--keep]
    .venv/bin/python -m bench.fairness --three [--documents 1000] [--c-documents 300] [--b-every-s 20] ...

Workspace A uploads --documents generated text documents (distinct, --words words each: by default 1-3 chunks) at
once into a knowledge base,
first alone, then again into a second knowledge base while workspace B uploads one document every --b-every-s
seconds and starts a retrieval-tuning job (5 trials, retrieval only) and a calibration of a model group of the two
preset engines (8 prompts, token F1: no judge, 32 tokens an answer). Figures:
- B's waits: a document from its upload (Document.created_at) to leaving `queued`, a job from its created_at to
  leaving `queued`, both seen by polling the database every 0.5 s (nothing records the moment itself);
- A's documents/s, alone and with B: from the start of its upload to the last of its documents' indexed time;
- the broker's `ingest` and `interactive` Redis lists, sampled every second, against the items still live for that
  queue (documents queued or being ingested, jobs queued or running) plus its worker slots.
The issue's targets are printed beside the figures; nothing is asserted.

--three (issue 49: a loaded box, three workspaces) makes one run instead of the two: workspace A uploads its
--documents as above, then workspace C uploads --c-documents Chinese man pages (bench/helpers/manpages.py's zh_CN
pages of Debian's manpages-zh, spread over the package, each cut to its first C_PAGE_CHARS characters) into a
knowledge base on the multilingual-e5-small preset, while B uploads a document every --b-every-s seconds (for as
long as A's or C's documents are being ingested) and starts the same tuning job and calibration. Figures: B's
document waits, upload to leaving `queued` and upload to indexed, p50/p95/max (issue 49's target: the
leaving-`queued` p95 <= 30 s); A's and C's documents/min (and chunks/min), each from the start of its upload to the
last of its documents' indexed time; B's jobs' waits and the broker's lists as above. A warm-up knowledge base on
the multilingual model in C's workspace (12 other pages) is ingested beside A's and B's before the run. Without
--three the bench runs as before (A alone, then A with B), its figures comparable with earlier ones.

Self-contained like bench.ingest_workers: a private data dir and SQLite database, a redis-server of its own on a free
loopback port, and the processes `make run` starts, each as `scripts/proc.sh <role>`: worker (ingest, 2 pool
processes), node (default and node.<name>: it starts the SmolLM2 and Gemma-3 llama-server replicas), beat, web (the
gateway the calibration calls), and interactive where this tree's proc.sh has that role. Trees from before issue 31
route every one of these tasks to `ingest`, one message per document. To measure such a commit, run this file from
a `git worktree` of it with .venv linked in and bench/helpers/ copied there too: each process is given that tree on
PYTHONPATH, ahead of the editable install's mapping to the main checkout.
"""

import argparse
import io
import json
import math
import os
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NODE = "bench-fair"


def _free_ports(count: int) -> list[int]:
    """`count` distinct free loopback ports (held open together while chosen, so never the same one twice)."""
    probes = [socket.socket() for _ in range(count)]
    try:
        for probe in probes:
            probe.bind(("127.0.0.1", 0))
        return [probe.getsockname()[1] for probe in probes]
    finally:
        for probe in probes:
            probe.close()


# Before Django reads its settings (importing private_instance sets it up on a private data dir): this bench's own
# Redis, the port of its web process (the gateway) and the node its workers serve, for this process and those it
# starts.
REDIS_PORT, WEB_PORT = _free_ports(2)
os.environ.update({
    "REDIS_URL": f"redis://127.0.0.1:{REDIS_PORT}/0",
    "FACTORY_NODE_NAME": NODE,
    "FACTORY_PORT": str(WEB_PORT),
    "FACTORY_GATEWAY_URL": f"http://127.0.0.1:{WEB_PORT}/v1",
    "FACTORY_PUBLIC_URL": f"http://127.0.0.1:{WEB_PORT}",
})

from bench.helpers.private_instance import DATA_DIR, bench_workspace, clean_up, print_header  # noqa: E402  isort: skip

import httpx  # noqa: E402
import redis  # noqa: E402
from celery import current_app  # noqa: E402
from django.conf import settings  # noqa: E402
from django.db import connection  # noqa: E402

from accounts.services import SYSTEM, Actor, create_workspace  # noqa: E402
from bench.helpers import manpages  # noqa: E402
from bench.helpers.synthetic import Prose  # noqa: E402
from cluster import inventory, queues  # noqa: E402
from cluster.services import register_node  # noqa: E402
from rag_studio import services  # noqa: E402
from rag_studio.evals import evaluation, tuning  # noqa: E402
from rag_studio.models import Document, DocumentStatus, KnowledgeBase, RetrievalTuning  # noqa: E402
from rag_studio.pipeline.storage import UploadedFile  # noqa: E402
from serving.engines import process  # noqa: E402
from serving.groups import services as group_services  # noqa: E402
from serving.models import CalibrationRun, Deployment, GroupPolicy, ModelGroup, Replica, ServingState  # noqa: E402
from serving.presets import GEMMA3, MULTILINGUAL_E5, SMOLLM2, register_presets  # noqa: E402
from serving.services import create_deployment, start_deployment  # noqa: E402

PROC_SH = ROOT / "scripts" / "proc.sh"
# Trees from before issue 31 have no interactive worker: there tuning and calibration go to `ingest`.
HAS_INTERACTIVE = "interactive)" in PROC_SH.read_text()
SHORT_JOB_QUEUE = "interactive" if HAS_INTERACTIVE else "ingest"
QUEUES = ("ingest", "interactive")
# proc.sh's default pool sizes (FACTORY_WORKER_CONCURRENCY, FACTORY_INTERACTIVE_CONCURRENCY).
SLOTS = {"ingest": 2, "interactive": 1 if HAS_INTERACTIVE else 0}

POLL_S = 0.5
SAMPLE_S = 1.0
PROGRESS_S = 30.0
# The shortest stretch of A's run that its documents/s is shown for (while B's jobs ran, and otherwise).
MIN_SPLIT_S = 5.0
# B's knowledge base holds these before the runs: the tuning job needs 10 questions whose documents it holds.
SEED_DOCUMENTS = 12
TUNING_TRIALS = 5  # the fewest a tuning job accepts
TUNING_AT_S, CALIBRATION_AT_S = 15.0, 30.0  # after A's upload starts
CALIBRATION_MAX_TOKENS = 32
CALIBRATION_PROMPTS = [
    ("What is the capital of France?", "Paris"),
    ("How many days are in a week?", "Seven"),
    ("What colour is a clear daytime sky?", "Blue"),
    ("What is two plus three?", "Five"),
    ("Which animal says moo?", "A cow"),
    ("What do bees make?", "Honey"),
    ("What is frozen water called?", "Ice"),
    ("Which planet do we live on?", "Earth"),
]
TARGET_DOCUMENT_P95_S = 30.0  # issue 31's, and issue 49's on a loaded box (--three)
TARGET_JOB_WAIT_S = 15.0
TARGET_THROUGHPUT_RATIO = 0.90
DOCUMENT_DONE = (DocumentStatus.INDEXED, DocumentStatus.FAILED)
JOB_DONE = ("done", "failed", "cancelled")


# ---- the platform ----


class Platform:
    """The private Redis, and the processes `make run` starts, each as `scripts/proc.sh <role>`."""

    def __init__(self):
        subprocess.run(["redis-server", "--bind", "127.0.0.1", "--port", str(REDIS_PORT), "--save", "",
                        "--appendonly", "no", "--daemonize", "yes", "--pidfile", str(DATA_DIR / "redis.pid"),
                        "--dir", str(DATA_DIR), "--logfile", str(DATA_DIR / "redis.log")], check=True)
        self.roles = ["worker", "node", "beat", "web"] + (["interactive"] if HAS_INTERACTIVE else [])
        # The tree this file is in goes first on every process's path: the editable install maps the packages to
        # the main checkout, and a worktree of an older commit must run its own code.
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        self.running = {role: subprocess.Popen(["bash", str(PROC_SH), role], cwd=ROOT, env=env,
                                               stdout=(DATA_DIR / f"{role}.log").open("wb"), stderr=subprocess.STDOUT,
                                               start_new_session=True)
                        for role in self.roles}

    def wait_ready(self, timeout_s: float = 180) -> None:
        workers = [f"{role}@{NODE}" for role in self.roles if role not in ("beat", "web")]
        deadline = time.monotonic() + timeout_s
        while True:
            self._check_alive()
            answered = {next(iter(reply)) for reply in current_app.control.ping(destination=workers, timeout=1) or []}
            if answered >= set(workers) and self._web_answers():
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"Not ready after {timeout_s:.0f} s: {sorted(set(workers) - answered)} or the "
                                   f"web process; see the logs in {DATA_DIR}")
            time.sleep(1)

    def _check_alive(self) -> None:
        for role, popen in self.running.items():
            if popen.poll() is not None:
                tail = (DATA_DIR / f"{role}.log").read_text(errors="replace")[-3000:]
                raise RuntimeError(f"scripts/proc.sh {role} exited with {popen.returncode}:\n{tail}")

    @staticmethod
    def _web_answers() -> bool:
        try:
            return httpx.get(f"http://127.0.0.1:{WEB_PORT}/healthz", timeout=2).status_code == 200
        except httpx.TransportError:
            return False

    def stop(self) -> None:
        # Engine replicas run in process groups of their own, started by the node worker: stopped first, by the PIDs
        # their replica rows record (terminate() leaves a PID alone unless this data dir's node launched it).
        for pid in Replica.objects.exclude(pid=None).values_list("pid", flat=True):
            process.terminate(pid)
        for popen in self.running.values():
            try:
                os.killpg(popen.pid, signal.SIGTERM)
                popen.wait(timeout=30)
            except ProcessLookupError:
                pass
            except subprocess.TimeoutExpired:
                os.killpg(popen.pid, signal.SIGKILL)
        subprocess.run(["redis-cli", "-p", str(REDIS_PORT), "shutdown", "nosave"], capture_output=True)


def deploy_engines() -> dict[str, Deployment]:
    """Register the presets and start one replica each of Gemma-3 and SmolLM2 on this bench's node."""
    node = register_node(name=NODE, resources=inventory.probe())
    models = register_presets(lambda line: None)
    deployments = {}
    for name in (GEMMA3, SMOLLM2):
        deployments[name] = create_deployment(actor=SYSTEM, workspace=None, model=models[name], name=name,
                                              replicas=[(node, 1.0)], cooldown_s=5.0)
        start_deployment(actor=SYSTEM, deployment=deployments[name])
    return deployments


def wait_engines(deployments: dict[str, Deployment], timeout_s: float = 300) -> None:
    deadline = time.monotonic() + timeout_s
    for name, deployment in deployments.items():
        while (state := Deployment.objects.get(pk=deployment.pk).state) != ServingState.READY:
            if state == ServingState.FAILED or time.monotonic() > deadline:
                replica = deployment.replicas.first()
                raise RuntimeError(f"{name} is {state}: {replica.last_error if replica else ''} (see {DATA_DIR})")
            time.sleep(1)


# ---- documents ----


# Words in a document of B's (and of the default bulk): one to three 800-character chunks.
SMALL = (60, 300)


def documents(prefix: str, count: int, seed: int, words: tuple[int, int]) -> list[tuple[str, bytes]]:
    """Distinct text documents: a title and `words` (a range) words of prose."""
    prose = Prose(seed)
    return [(f"{prefix}-{index:05d}.txt",
             f"{prefix} {index}: {prose.title()}\n\n{prose.passage(prose.rng.randint(*words))}\n".encode())
            for index in range(count)]


# C's pages (--three) are cut here: the median zh_CN page has about 1,500 characters, but a few run to 240,000 (one
# document of hundreds of chunks, a slot's work for minutes, whichever page the spread happens to pick).
C_PAGE_CHARS = 4000


def chinese_pages(count: int, warm_up: int) -> tuple[list[tuple[str, bytes]], list[tuple[str, bytes]]]:
    """`count` Chinese man pages for the run and `warm_up` others for the warm-up, spread over manpages-zh's zh_CN
    pages (fetched into the bench cache on first use), each a text document of its path and text."""
    root = manpages.debian_package(manpages.CHINESE_PACKAGE) / "usr/share/man/zh_CN"
    pages = [page for path in sorted(root.glob("man*/*.gz"))
             if (page := manpages.read_page(path, str(path.relative_to(root))[:-3], C_PAGE_CHARS)) is not None
             and page.text.strip()]
    if len(pages) < count + warm_up:
        raise SystemExit(f"Only {len(pages)} Chinese man pages are at hand, {warm_up} of them for the warm-up; ask "
                         f"for --c-documents {len(pages) - warm_up} or fewer")
    total = count + warm_up
    spread = [(page.path.replace("/", "-") + ".txt", f"{page.path}\n\n{page.text}\n".encode())
              for page in (pages[index * len(pages) // total] for index in range(total))]
    warm = set(range(0, total, total // warm_up)[:warm_up]) if warm_up else set()
    return ([file for index, file in enumerate(spread) if index not in warm],
            [file for index, file in enumerate(spread) if index in warm])


def word_range(text: str) -> tuple[int, int]:
    low, _dash, high = text.partition("-")
    try:
        return int(low), int(high or low)
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' is not a range of words such as 60-300")


def upload(actor: Actor, kb: KnowledgeBase, files: list[tuple[str, bytes]]) -> list[int]:
    """Through the upload path the API uses (which queues ingestion as this tree does), in one call."""
    outcomes = services.upload_documents(actor=actor, kb=kb, uploads=[
        UploadedFile(name, io.BytesIO(content), len(content)) for name, content in files])
    return [outcome.document.pk for outcome in outcomes]


def wait_documents(ids: list[int], timeout_s: float, what: str) -> None:
    deadline, last_print = time.monotonic() + timeout_s, time.monotonic()
    while (left := Document.objects.filter(pk__in=ids).exclude(status__in=DOCUMENT_DONE).count()) > 0:
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what}: {left} of {len(ids)} documents still pending after {timeout_s:.0f} s")
        if time.monotonic() - last_print >= PROGRESS_S:
            print(f"  {what}: {len(ids) - left} of {len(ids)} documents done", flush=True)
            last_print = time.monotonic()
        time.sleep(1)


# ---- what B does, and what the bench watches ----


@dataclass
class Tracked:
    """One piece of B's work: when it was created, when polling first saw it out of `queued` and finished."""

    kind: str  # "document", "tuning" or "calibration"
    pk: int
    created: float  # epoch seconds, from the row's created_at
    estimate_s: float | None  # the start estimate the product showed right after it was queued (newer trees)
    started: float | None = None
    finished: float | None = None
    final: str = ""

    @property
    def wait_s(self) -> float | None:
        return None if self.started is None else max(self.started - self.created, 0.0)


@dataclass
class Sample:
    at: float
    length: dict[str, int]
    live: dict[str, int]


class Monitor(threading.Thread):
    """Polls B's tracked work every POLL_S and samples the broker's lists every SAMPLE_S, until stopped."""

    def __init__(self):
        super().__init__(daemon=True)
        self.tracked: list[Tracked] = []
        self.samples: list[Sample] = []
        self.halt = threading.Event()
        self.broker = redis.Redis.from_url(settings.CELERY_BROKER_URL)

    def run(self) -> None:
        next_sample = 0.0
        try:
            while not self.halt.is_set():
                now = time.time()
                self._poll(now)
                if now >= next_sample:
                    self._sample(now)
                    next_sample = now + SAMPLE_S
                self.halt.wait(POLL_S)
        finally:
            connection.close()  # this thread's own connection

    def stop(self) -> None:
        self.halt.set()
        self.join()

    def _poll(self, now: float) -> None:
        pending = [item for item in list(self.tracked) if item.finished is None]
        states = {}
        for kind, rows in (("document", Document.objects.values_list("pk", "status")),
                           ("tuning", RetrievalTuning.objects.values_list("pk", "status")),
                           ("calibration", CalibrationRun.objects.values_list("pk", "state"))):
            ids = [item.pk for item in pending if item.kind == kind]
            if ids:
                states.update({(kind, pk): state for pk, state in rows.filter(pk__in=ids)})
        for item in pending:
            state = states.get((item.kind, item.pk), "deleted")
            if state != "queued" and item.started is None:
                item.started = now
            if state in (*DOCUMENT_DONE, *JOB_DONE, "deleted"):
                item.finished, item.final = now, state

    def _sample(self, now: float) -> None:
        documents_live = Document.objects.filter(status__in=[DocumentStatus.QUEUED, DocumentStatus.PROCESSING]).count()
        jobs_live = (RetrievalTuning.objects.filter(status__in=["queued", "running"]).count()
                     + CalibrationRun.objects.filter(state__in=["queued", "running"]).count())
        live = {"ingest": documents_live, "interactive": 0}
        live[SHORT_JOB_QUEUE] += jobs_live
        self.samples.append(Sample(now, {queue: int(self.broker.llen(queue)) for queue in QUEUES}, live))


def start_estimate(kind: str, row) -> float | None:
    """The start estimate the product shows for queued work (issue 31's places); None in trees without them, or when
    the work was already taken."""
    try:
        if kind == "document":
            from rag_studio.pipeline import line

            place = line.Snapshot().place(row.pk, row.knowledge_base.workspace_id)
        elif kind == "tuning":
            from rag_studio.evals import jobs

            place = jobs.place(queues.interactive_line(), RetrievalTuning, jobs.TUNE_TASK, row)
        else:
            place = group_services.calibration_place(row)
    except (ImportError, AttributeError):
        return None
    return None if place is None else place.estimated_start_s


@dataclass
class BWork:
    """What B needs at hand: its owner, knowledge base, eval set, model group and the documents it will upload."""

    actor: Actor
    kb: KnowledgeBase
    eval_set: object
    group: object
    uploads: list[tuple[str, bytes]] = field(default_factory=list)


def b_work(b: BWork, monitor: Monitor, started: float, every_s: float, bulks_done: threading.Event,
           errors: list[str]) -> None:
    """B's schedule from the bulk upload's start: a tuning job at TUNING_AT_S, a calibration at CALIBRATION_AT_S, and a
    document every `every_s` (the first at half that) while the bulk's documents (A's, and C's with --three) are
    being ingested."""
    events = [(TUNING_AT_S, "tuning"), (CALIBRATION_AT_S, "calibration")]
    events += [(every_s / 2 + n * every_s, "document") for n in range(len(b.uploads))]
    uploads = iter(b.uploads)
    try:
        for at, kind in sorted(events):
            delay = max(started + at - time.time(), 0)
            if kind != "document":
                time.sleep(delay)
            elif bulks_done.wait(delay):
                continue  # the bulk is done: B's documents were to arrive while it was being ingested
            if kind == "document":
                row = Document.objects.select_related("knowledge_base").get(
                    pk=upload(b.actor, b.kb, [next(uploads)])[0])
            elif kind == "tuning":
                row = tuning.start_tuning(actor=b.actor, kb=b.kb, eval_set=b.eval_set, trials=TUNING_TRIALS, top_k=5)
            else:
                row = group_services.start_calibration(
                    actor=b.actor, workspace=b.kb.workspace, group=b.group, source="bench.fairness",
                    items=[{"prompt": prompt, "reference": reference} for prompt, reference in CALIBRATION_PROMPTS],
                    metric="token_f1", max_tokens=CALIBRATION_MAX_TOKENS)
            monitor.tracked.append(Tracked(kind, row.pk, row.created_at.timestamp(), start_estimate(kind, row)))
    except Exception as exc:  # reported by run_bulks: a run without B's work measures nothing
        errors.append(f"{type(exc).__name__}: {exc}")
        raise
    finally:
        connection.close()


# ---- one run of the bulk uploads ----


@dataclass
class Run:
    label: str
    documents: int
    failed: int
    seconds: float
    upload_s: float
    samples: list[Sample]
    tracked: list[Tracked]
    done_at: list[float]  # each of the bulk's documents' last update (indexed), from the start of its upload
    chunks: int = 0

    @property
    def rate(self) -> float:
        return self.documents / self.seconds


@dataclass
class Bulk:
    """One workspace's bulk upload in a run: its label in the report, knowledge base and documents."""

    label: str
    kb: KnowledgeBase
    files: list[tuple[str, bytes]]


def run_a(label: str, actor: Actor, kb: KnowledgeBase, files: list[tuple[str, bytes]], b: BWork | None,
          every_s: float, timeout_s: float) -> Run:
    (run,) = run_bulks(label, actor, [Bulk(label, kb, files)], b, every_s, timeout_s)
    return run


def run_bulks(label: str, actor: Actor, bulks: list[Bulk], b: BWork | None, every_s: float,
              timeout_s: float) -> list[Run]:
    """Each bulk uploaded in one call, one after the other, while B works (where given) until all are ingested.
    B's times are from the start of the first upload; each bulk's own from the start of its upload."""
    what = [f"{len(bulk.files)} documents" + (f" ({bulk.label})" if len(bulks) > 1 else "") for bulk in bulks]
    print(f"-- {label}: uploading {', '.join(what)}", flush=True)
    monitor, bulks_done, errors = Monitor(), threading.Event(), []
    monitor.start()
    started = time.time()
    worker = None
    if b is not None:
        worker = threading.Thread(target=b_work, args=(b, monitor, started, every_s, bulks_done, errors),
                                  daemon=True)
        worker.start()
    uploaded = []  # (bulk, its document ids, its upload's start, the upload call's seconds)
    try:
        for bulk in bulks:
            began = time.time()
            ids = upload(actor, bulk.kb, bulk.files)
            uploaded.append((bulk, ids, began, time.time() - began))
            print(f"  {bulk.label + ': ' if len(bulks) > 1 else ''}uploaded in {uploaded[-1][3]:.1f} s", flush=True)
        wait_documents([pk for _bulk, ids, _began, _upload_s in uploaded for pk in ids], timeout_s, label)
        bulks_done.set()
        if worker is not None:
            worker.join()
            if errors:
                raise RuntimeError(f"B's work failed: {errors[0]}")
            _wait_tracked(monitor, timeout_s)
    finally:
        bulks_done.set()
        monitor.stop()
    tracked = [_relative(item, started) for item in monitor.tracked]
    runs = []
    for bulk, ids, began, upload_s in uploaded:
        rows = Document.objects.filter(pk__in=ids)
        done_at = sorted(at.timestamp() - began for at in rows.values_list("updated_at", flat=True))
        failed = rows.filter(status=DocumentStatus.FAILED).count()
        chunks = sum(rows.values_list("chunk_count", flat=True))
        runs.append(Run(bulk.label, len(ids), failed, done_at[-1], upload_s, monitor.samples, tracked, done_at,
                        chunks))
    return runs


def _wait_tracked(monitor: Monitor, timeout_s: float) -> None:
    """B's work after the bulks' last document: until every piece started and finished (or the time is up)."""
    deadline = time.monotonic() + timeout_s
    while any(item.finished is None for item in monitor.tracked) and time.monotonic() < deadline:
        time.sleep(1)


def _relative(item: Tracked, origin: float) -> Tracked:
    """Times from the (first) bulk upload's start, for the report."""
    def shift(value):
        return None if value is None else value - origin
    return Tracked(item.kind, item.pk, item.created - origin, item.estimate_s, shift(item.started),
                   shift(item.finished), item.final)


# ---- report ----


def nearest_rank(values: list[float], percent: float) -> float:
    ordered = sorted(values)
    return ordered[max(math.ceil(percent / 100 * len(ordered)) - 1, 0)]


def verdict(met: bool, target: str) -> str:
    return f"{target}: {'met' if met else 'MISSED'}"


def seconds(value: float | None) -> str:
    return "not started" if value is None else f"{value:.1f} s"


def queue_rows(run: Run) -> list[tuple[str, str, str]]:
    rows = []
    for queue in QUEUES:
        if queue == "interactive" and not HAS_INTERACTIVE:
            rows.append((f"{run.label}: interactive list", "no interactive queue in this tree", ""))
            continue
        lengths = [sample.length[queue] for sample in run.samples]
        excess = [sample.length[queue] - sample.live[queue] - SLOTS[queue] for sample in run.samples]
        worst = max(range(len(excess)), key=excess.__getitem__)
        at_worst = run.samples[worst]
        rows.append((f"{run.label}: {queue} list, max length", f"{max(lengths)} (mean {statistics.mean(lengths):.1f}, "
                                                              f"{len(lengths)} samples)", ""))
        rows.append((f"{run.label}: {queue} list - (live + {SLOTS[queue]} slots), max",
                     f"{excess[worst]:+d} (length {at_worst.length[queue]}, live {at_worst.live[queue]} at "
                     f"{at_worst.at - run.samples[0].at:.0f} s); over in {sum(e > 0 for e in excess)} samples",
                     verdict(excess[worst] <= 0, "never over")))
    return rows


def job_row(run: Run, kind: str, name: str) -> tuple[str, str, str]:
    items = [item for item in run.tracked if item.kind == kind]
    if not items:
        return (f"B {name} wait", "not started (A finished first?)", "")
    item = items[0]
    ran = "" if item.started is None or item.finished is None else f", ran {item.finished - item.started:.0f} s"
    estimate = "" if item.estimate_s is None else f", estimate shown {item.estimate_s:.1f} s"
    return (f"B {name} wait (created -> running)",
            f"{seconds(item.wait_s)} (created at {item.created:.0f} s{estimate}{ran}, {item.final or 'unfinished'})",
            verdict(item.wait_s is not None and item.wait_s <= TARGET_JOB_WAIT_S, f"<= {TARGET_JOB_WAIT_S:.0f} s"))


def rate_while_jobs_ran(run: Run) -> tuple[str, str, str] | None:
    """A's documents/s while B's tuning or calibration was running, and the rest of A's run: where a shortfall
    comes from (on a small machine the jobs take cores from ingestion, however fair the queues)."""
    busy = sorted((max(item.started, 0.0), min(item.finished, run.seconds)) for item in run.tracked
                  if item.kind != "document" and item.started is not None and item.finished is not None)
    merged: list[list[float]] = []
    for start, end in busy:
        if end <= start:
            continue
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    busy_s = sum(end - start for start, end in merged)
    if busy_s < MIN_SPLIT_S or run.seconds - busy_s < MIN_SPLIT_S:
        return None  # too short a stretch on either side for a rate
    during = sum(any(start <= at < end for start, end in merged) for at in run.done_at)
    return ("A with B: documents/s while B's jobs ran / otherwise",
            f"{during / busy_s:.2f} over {busy_s:.0f} s / {(run.documents - during) / (run.seconds - busy_s):.2f} "
            f"over {run.seconds - busy_s:.0f} s", "")


def b_document_rows(tracked: list[Tracked], during: str) -> list[tuple[str, str, str]]:
    """B's documents: upload to leaving `queued` (the target's wait) and upload to indexed, p50 / p95 / max."""
    b_docs = [item for item in tracked if item.kind == "document"]
    waits = [item.wait_s for item in b_docs if item.wait_s is not None]
    if not waits:
        return [("B document wait", f"no document uploaded during {during}", "")]
    p95 = nearest_rank(waits, 95)
    unstarted = len(b_docs) - len(waits)
    rows = [(f"B document wait p50 / p95 / max (n={len(b_docs)})",
             f"{nearest_rank(waits, 50):.1f} / {p95:.1f} / {max(waits):.1f} s"
             + (f"; {unstarted} never started" if unstarted else ""),
             verdict(p95 <= TARGET_DOCUMENT_P95_S and not unstarted, f"p95 <= {TARGET_DOCUMENT_P95_S:.0f} s"))]
    indexed = [item.finished - item.created for item in b_docs if item.finished is not None]
    if indexed:
        unfinished = len(b_docs) - len(indexed)
        rows.append(("B document upload -> indexed p50 / p95 / max",
                     f"{nearest_rank(indexed, 50):.1f} / {nearest_rank(indexed, 95):.1f} / {max(indexed):.1f} s"
                     + (f"; {unfinished} unfinished" if unfinished else ""), ""))
    return rows


def job_rows(run: Run) -> list[tuple[str, str, str]]:
    return [job_row(run, "tuning", f"tuning ({TUNING_TRIALS} trials)"),
            job_row(run, "calibration", f"calibration ({len(CALIBRATION_PROMPTS)} prompts)")]


def print_table(rows: list[tuple[str, str, str]], issue: str) -> None:
    width = max(len(label) for label, _, _ in rows)
    value_width = min(max(len(value) for _, value, _ in rows), 90)
    print(f"\n{'figure':<{width}}  {'value':<{value_width}}  target ({issue})")
    for label, value, target in rows:
        print(f"{label:<{width}}  {value:<{value_width}}  {target}")


def print_tracked(tracked: list[Tracked], origin: str) -> None:
    print(f"\nB's work, seconds from the start of {origin} (estimate: the start the product showed when queued):")
    print(f"{'kind':<12}{'id':>6}{'created':>9}{'estimate':>10}{'started':>9}{'wait':>7}{'finished':>10}  final")
    for item in tracked:
        estimate = "-" if item.estimate_s is None else f"{item.estimate_s:.1f}"
        started = "-" if item.started is None else f"{item.started:.1f}"
        wait = "-" if item.wait_s is None else f"{item.wait_s:.1f}"
        finished = "-" if item.finished is None else f"{item.finished:.1f}"
        print(f"{item.kind:<12}{item.pk:>6}{item.created:>9.1f}{estimate:>10}{started:>9}{wait:>7}{finished:>10}  "
              f"{item.final}")


def report(alone: Run, with_b: Run) -> None:
    ratio = with_b.rate / alone.rate
    rows = [
        ("A alone: documents/s", f"{alone.rate:.2f} ({alone.documents} in {alone.seconds:.0f} s, upload call "
                                 f"{alone.upload_s:.0f} s, {alone.failed} failed)", ""),
        ("A with B: documents/s", f"{with_b.rate:.2f} ({with_b.documents} in {with_b.seconds:.0f} s, upload call "
                                  f"{with_b.upload_s:.0f} s, {with_b.failed} failed)", ""),
        ("A with B / A alone", f"{100 * ratio:.0f}%",
         verdict(ratio >= TARGET_THROUGHPUT_RATIO, f">= {100 * TARGET_THROUGHPUT_RATIO:.0f}%")),
    ]
    if split := rate_while_jobs_ran(with_b):
        rows.append(split)
    rows += b_document_rows(with_b.tracked, "A's run")
    rows += job_rows(with_b)
    rows += queue_rows(alone) + queue_rows(with_b)
    print_table(rows, "issue 31")
    print_tracked(with_b.tracked, "A's upload")


def report_three(bulks: list[Run]) -> None:
    """--three: B's document waits against issue 49's target, and each bulk's documents/min and chunks/min."""
    rows = []
    for run in bulks:
        rows.append((f"{run.label}: documents/min", f"{60 * run.rate:.1f} ({run.documents} documents, {run.chunks} "
                                                    f"chunks ({60 * run.chunks / run.seconds:.0f}/min) in "
                                                    f"{run.seconds:.0f} s, upload call {run.upload_s:.0f} s, "
                                                    f"{run.failed} failed)", ""))
    rows += b_document_rows(bulks[0].tracked, "the bulk uploads' ingestion")
    rows += job_rows(bulks[0])
    rows += queue_rows(replace(bulks[0], label="A, B and C"))
    print_table(rows, "issue 49 for B's documents, issue 31 for the rest")
    print_tracked(bulks[0].tracked, "A's upload")


# ---- main ----


def tree_description() -> str:
    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True).stdout.strip()

    changed = "with uncommitted changes" if git("status", "--porcelain", "--untracked-files=no") else "clean"
    # Trees from before issue 49 size a turn in the line by documents, not time.
    turn = getattr(settings, "RAG_INGEST_TURN_S", None)
    return (f"tree {ROOT} at {git('rev-parse', '--short', 'HEAD')} ({changed}); "
            f"{'an interactive worker' if HAS_INTERACTIVE else 'no interactive worker (short jobs go to ingest)'}"
            + ("" if turn is None else f"; a turn in the ingestion line {turn:g} s (FACTORY_RAG_INGEST_TURN_S)"))


def set_up(actor: Actor, workspace_a, deployments: dict[str, Deployment], uploads: int,
           workspace_c=None, c_warm_up: list[tuple[str, bytes]] | None = None) -> BWork:
    """B's workspace with its seed documents, eval set and model group, and a warm-up knowledge base of A's ingested
    beside them, so that both ingestion processes have loaded their model before the runs; with `workspace_c`,
    a warm-up knowledge base of C's on the multilingual model too (`c_warm_up` its documents)."""
    workspace_b = create_workspace(actor=actor, name="B")
    kb_b = services.create_knowledge_base(actor=actor, workspace=workspace_b, name="B documents")
    warm_up = services.create_knowledge_base(actor=actor, workspace=workspace_a, name="A warm-up")
    seed = documents("b-seed", SEED_DOCUMENTS, seed=11, words=SMALL)
    ids = upload(actor, kb_b, seed) + upload(actor, warm_up, documents("a-warm", SEED_DOCUMENTS, seed=12, words=SMALL))
    if workspace_c is not None:
        c_kb = services.create_knowledge_base(actor=actor, workspace=workspace_c, name="C warm-up",
                                              embedding_model=MULTILINGUAL_E5)
        ids += upload(actor, c_kb, c_warm_up or [])
    # Each question is its document's first sentence and names the document as its expected source: enough for a
    # retrieval-only tuning job.
    questions = "\n".join(json.dumps({"question": content.decode().split("\n\n")[1].split(".")[0],
                                      "expected_sources": [name]}) for name, content in seed)
    eval_set = evaluation.upload_eval_set(actor=actor, kb=kb_b, name="B questions", filename="questions.jsonl",
                                          content=questions.encode())
    group = group_services.create_group(actor=actor, workspace=workspace_b, name="bench-pair",
                                        policy=GroupPolicy.CASCADE, big=deployments[GEMMA3],
                                        small=deployments[SMOLLM2], threshold=0.5)
    wait_documents(ids, 600, "warm-up")
    wait_engines(deployments)
    # Read again: start_calibration checks that the members it holds are ready.
    group = ModelGroup.objects.select_related("big", "small").get(pk=group.pk)
    return BWork(actor, kb_b, eval_set, group, documents("b-live", uploads, seed=13, words=SMALL))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--documents", type=int, default=1000, help="documents A uploads at once, in each run")
    parser.add_argument("--words", type=word_range, default=SMALL,
                        help="words in each of A's documents, a range (1,000 words make about 8 chunks)")
    parser.add_argument("--b-every-s", type=float, default=20.0, help="B uploads a document this often")
    parser.add_argument("--three", action="store_true",
                        help="issue 49's loaded box: one run of A's upload, C's Chinese pages on the multilingual "
                             "model and B's documents, instead of A alone and A with B")
    parser.add_argument("--c-documents", type=int, default=300,
                        help="Chinese man pages C uploads at once (--three)")
    parser.add_argument("--timeout-min", type=float, default=20.0, help="give up on a run after this long")
    parser.add_argument("--keep", action="store_true", help="keep the temporary data dir (and the processes' logs)")
    args = parser.parse_args()
    # A bench stopped with TERM (not only Ctrl-C) still stops the processes and Redis it started.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    timeout_s = args.timeout_min * 60
    platform = None
    try:
        c_files, c_warm_up = [], []
        if args.three:
            c_files, c_warm_up = chinese_pages(args.c_documents, warm_up=SEED_DOCUMENTS)
            print_header("fairness --three", f"workspace A uploads {args.documents} documents of "
                                             f"{args.words[0]}-{args.words[1]} words at once, then workspace C "
                                             f"{args.c_documents} Chinese man pages into a knowledge base on "
                                             f"{MULTILINGUAL_E5}, while workspace B uploads one document every "
                                             f"{args.b_every_s:.0f} s and starts a tuning job and a calibration; "
                                             f"{tree_description()}")
        else:
            print_header("fairness", f"workspace A uploads {args.documents} documents of {args.words[0]}-"
                                     f"{args.words[1]} words at once, alone and then while "
                                     f"workspace B uploads one every {args.b_every_s:.0f} s and starts a tuning job "
                                     f"and a calibration; {tree_description()}")
        started = time.perf_counter()
        actor, workspace_a = bench_workspace()
        platform = Platform()
        deployments = deploy_engines()  # assembles Gemma's GGUF here while the processes start
        platform.wait_ready()
        workspace_c = create_workspace(actor=actor, name="C") if args.three else None
        b = set_up(actor, workspace_a, deployments, uploads=int(timeout_s / args.b_every_s) + 1,
                   workspace_c=workspace_c, c_warm_up=c_warm_up)
        print(f"Set up in {time.perf_counter() - started:.0f} s: {', '.join(platform.roles)} running, both engines "
              f"ready, warm-up ingested", flush=True)
        bulk = {"count": args.documents, "words": args.words}
        if args.three:
            kb_a = services.create_knowledge_base(actor=actor, workspace=workspace_a, name="A bulk")
            kb_c = services.create_knowledge_base(actor=actor, workspace=workspace_c, name="C pages",
                                                  embedding_model=MULTILINGUAL_E5)
            runs = run_bulks("A, B and C", actor, [
                Bulk("A (English, MiniLM)", kb_a, documents("a-bulk", seed=22, **bulk)),
                Bulk(f"C (Chinese, {MULTILINGUAL_E5})", kb_c, c_files)], b, args.b_every_s, timeout_s)
            report_three(runs)
        else:
            kb_alone = services.create_knowledge_base(actor=actor, workspace=workspace_a, name="A alone")
            alone = run_a("A alone", actor, kb_alone, documents("a-alone", seed=21, **bulk), None,
                          args.b_every_s, timeout_s)
            kb_shared = services.create_knowledge_base(actor=actor, workspace=workspace_a, name="A with B")
            with_b = run_a("A with B", actor, kb_shared, documents("a-shared", seed=22, **bulk), b,
                           args.b_every_s, timeout_s)
            report(alone, with_b)
        print(f"Load average at the end: {', '.join(f'{v:.2f}' for v in os.getloadavg())}")
    finally:
        if platform is not None:
            platform.stop()
        clean_up(args.keep)


if __name__ == "__main__":
    main()
