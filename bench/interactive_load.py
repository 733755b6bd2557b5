"""Interactive first (issue 49): streamed chats with the preset SmolLM2 through the gateway, quiet and while the
platform does background work on the same machine, side by side in one run, with the background work's rate under
the chats against its rate alone.

    .venv/bin/python -m bench.interactive_load [--phases quiet,lone,ingest,tuning,lora] [--rounds 8] [--window-s 45]
                                               [--documents 300] [--lone-requests 20] [--tuning-pages 60]

Against `make run` (FACTORY_URL, .run/env): the preset deployment smollm2-135m-instruct itself, not a bench copy,
with the other preset, gemma-3-270m, deployed and ready beside it (the bench refuses to start otherwise). Chats:
4 clients, each streaming chat completions of exactly 64 tokens (ignore_eos, temperature 0, a different question
each) back to back through FACTORY_URL/v1 with a throwaway API key of a workspace made for the chats; TTFT and TPOT
are timed by the client with serving/metrics.py's definitions, tokens counted by the engine's usage chunk.

- quiet: --rounds requests per client, the platform's workers idle;
- lone: --lone-requests requests one at a time (concurrency 1). Target: TPOT p50 <= 12 ms;
- ingest: another workspace made for the run uploads --documents English man pages (bench/helpers/manpages.py) at
  once through rag_studio.services.upload_documents into a new knowledge base; the ingestion workers ingest them.
  Progress: the documents' own progress summed (Document.progress through the stages, moving batch by batch while
  chunks are embedded), sampled every 0.5 s: a worker indexes up to 32 documents at one time, too few completion
  times in a window for a rate;
- tuning: a retrieval tuning job (Optimise: rag_studio.evals.tuning.start_tuning, run by the interactive worker) of
  200 trials, retrieval only, on a knowledge base of --tuning-pages man pages with their questions as its eval set.
  Progress: trials saved (TuningTrial.created_at), the baseline trial left out;
- lora: a LoRA fine-tune of the SmolLM2 preset on the shipped instruction dataset (enhancement.services
  .create_finetune_job), trained by the node's job process on the CPU; it asks for far more steps than it will run.
  Progress: training steps (the job's MetricSample rows).

In a background phase, once the work is under way (a few documents indexed, a trial after the baseline saved, two
steps done), the 4 clients run for at least --window-s seconds and --rounds requests each; then the work runs alone
for a window as long. Its rate in each window (per minute; trials and steps interpolated between the completion
times the platform recorded) is printed beside the chats' figures, then the work is stopped (its knowledge base
deleted, the job cancelled). Targets (issue 49): under each background load TTFT p90 <= 1.5x quiet's and TPOT
p50 <= 1.5x quiet's, and the work keeps >= 50% of its rate alone. A phase whose work ran out inside a window says
so: its figures then cover less background than asked.

The knowledge bases get retrieval settings of their own (30 candidates -> 31), so the platform starts no automatic
tuning job on them (rag_studio/evals/adaptive.py) and each phase is one kind of background work. Before quiet and
each background phase the bench waits for the platform's workers (and any training process) to go idle. What it
made (its two workspaces with their knowledge bases, eval set, dataset and job, the API key, and its requests'
rows in the preset's history) is deleted at the end.
"""

import argparse
import asyncio
import bisect
import io
import json
import os
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import httpx
import psutil

# First: it reads the instance's settings and sets Django up, which the project's models need.
from bench.helpers.running_instance import (
    ADMIN_USERNAME,
    CLIENT_TIMEOUT,
    GATEWAY_URL,
    PRESET_MODEL,
    REPO_ROOT,
    StreamResult,
    chat_body,
    print_header,
    prompts,
    stream_chat,
    wait_for,
)

# isort: split

from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import connection
from django.db.models import Sum

from accounts.errors import ApplicationError
from accounts.services import Actor, create_api_key, create_workspace, revoke_api_key
from bench.helpers import manpages
from cluster.models import FINISHED_JOB_STATES, JobState, Node
from enhancement import services as enhancement_services
from enhancement.models import EnhancementJob, MetricSample
from enhancement.runner import POLL_S
from rag_studio import services as rag_services
from rag_studio.evals import evaluation, tuning
from rag_studio.models import Document, DocumentStatus, JobStatus, KnowledgeBase, RetrievalTuning, TuningTrial
from rag_studio.pipeline.storage import UploadedFile
from serving.engines import process as engine_process
from serving.engines.base import engine
from serving.metrics import percentile
from serving.models import Deployment, Model, RequestRecord, ServingState
from serving.preset_names import GEMMA3

PHASES = ("quiet", "lone", "ingest", "tuning", "lora")
BACKGROUND_PHASES = ("ingest", "tuning", "lora")
CONCURRENCY = 4
MAX_TOKENS = 64
WARMUP_REQUESTS = 4
# Targets (issue 49).
LOAD_RATIO_TARGET = 1.5
BACKGROUND_SHARE_TARGET = 0.5
LONE_TPOT_TARGET_MS = 12.0
# Retrieval settings of the user's own (the default has 30 candidates): the platform leaves such a knowledge base's
# default alone, so no automatic tuning job joins the phase (rag_studio/evals/adaptive.py).
OWN_RETRIEVAL = {"candidates": 31}
TUNING_TRIALS = tuning.MAX_TRIALS
WARM_DOCUMENTS = 4
WARM_STEPS = 2
# LoRA: more steps than any run of the bench lasts; no checkpoint nor evaluation while it runs. One packed row of 256
# tokens a step, so that a window holds several steps (4 rows take about 25 s a step on 2 busy cores).
LORA_HYPERPARAMETERS = {"max_steps": 100_000, "batch_size": 1, "cutoff": 256, "save_steps": 1_000_000,
                        "eval_steps": 1_000_000, "lr_scheduler": "constant"}
# Idle: the platform's workers together below this many cores over SETTLE_SAMPLE_S.
SETTLE_CORES = 0.15
SETTLE_SAMPLE_S = 3.0
SETTLE_TIMEOUT_S = 180.0
PROGRESS_S = 30.0
CHECK, CROSS = "✓", "✗"


# ---- chats ----


@dataclass
class Chats:
    results: list[StreamResult]
    started: float  # epoch seconds, as the platform's rows record time
    ended: float

    @property
    def ok(self) -> list[StreamResult]:
        return [r for r in self.results if r.ok]

    def ttft(self, percent: float) -> float | None:
        return percentile([r.timing.ttft_ms for r in self.ok if r.timing.ttft_ms is not None], percent)

    def tpot(self, percent: float) -> float | None:
        return percentile([t for t in (r.tpot_ms() for r in self.ok) if t is not None], percent)

    def short(self) -> int:
        """Answers the engine ended before MAX_TOKENS despite ignore_eos."""
        return sum(1 for r in self.ok if r.output_tokens is not None and r.output_tokens < MAX_TOKENS)

    def errors(self) -> list[str]:
        return [r.error for r in self.results if not r.ok]


class Questions:
    """A different question for every request of the run, so that no prompt is served from the engine's cache."""

    def __init__(self):
        self.pool, self.next = prompts(4000), 0

    def take(self) -> str:
        question = self.pool[self.next % len(self.pool)]
        self.next += 1
        return question


def run_chats(api_key: str, questions: Questions, *, concurrency: int, each: int, min_s: float = 0.0) -> Chats:
    """`concurrency` clients streaming back to back, each at least `each` requests and until `min_s` have passed."""
    async def client_loop(client: httpx.AsyncClient, until: float, results: list[StreamResult]) -> None:
        done = 0
        while done < each or time.time() < until:
            body = chat_body(model=PRESET_MODEL, prompt=questions.take(), max_tokens=MAX_TOKENS, stream=True)
            results.append(await stream_chat(client, base_url=GATEWAY_URL, api_key=api_key,
                                             body=body | {"ignore_eos": True}))
            done += 1

    async def clients(until: float) -> list[StreamResult]:
        results: list[StreamResult] = []
        limits = httpx.Limits(max_connections=concurrency + 2, max_keepalive_connections=concurrency + 2)
        async with httpx.AsyncClient(timeout=CLIENT_TIMEOUT, limits=limits) as client:
            await asyncio.gather(*(client_loop(client, until, results) for _ in range(concurrency)))
        return results

    started = time.time()
    results = asyncio.run(clients(started + min_s))
    return Chats(results, started, time.time())


# ---- the platform's processes ----


def _run_pid(role: str) -> int | None:
    try:
        return int((REPO_ROOT / ".run" / f"{role}.pid").read_text().strip())
    except (OSError, ValueError):
        return None


def _tree(pid: int | None) -> list[psutil.Process]:
    if not pid:
        return []
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.Error:
        return []


def background_processes() -> list[psutil.Process]:
    """The workers `make run` started (ingestion, interactive, node) with their children, and any training
    process (a session of its own, so no worker's child)."""
    found = {}
    for role in ("worker", "interactive", "node"):
        found.update({p.pid: p for p in _tree(_run_pid(role))})
    for pid in EnhancementJob.objects.exclude(pid=None).values_list("pid", flat=True):
        found.update({p.pid: p for p in _tree(pid)})
    return list(found.values())


def _cpu_seconds(processes: list[psutil.Process]) -> dict[int, float]:
    seconds = {}
    for process in processes:
        try:
            times = process.cpu_times()
            seconds[process.pid] = times.user + times.system
        except psutil.Error:
            continue
    return seconds


def wait_settled(what: str) -> None:
    """Until the platform's background processes are idle (a job of an earlier phase winding down, an automatic
    job, a sweep), so that a phase starts from a quiet platform."""
    if _run_pid("worker") is None:
        print(f"  (no .run/worker.pid: not started by make run, so not waiting for idle workers before {what})")
        return
    deadline = time.monotonic() + SETTLE_TIMEOUT_S
    while True:
        processes = background_processes()
        before = _cpu_seconds(processes)
        time.sleep(SETTLE_SAMPLE_S)
        after = _cpu_seconds(processes)
        cores = sum(after[pid] - before[pid] for pid in after.keys() & before.keys()) / SETTLE_SAMPLE_S
        if cores < SETTLE_CORES:
            return
        if time.monotonic() > deadline:
            print(f"  the platform's workers still used {cores:.2f} cores after {SETTLE_TIMEOUT_S:.0f} s; "
                  f"starting {what} anyway", flush=True)
            return


def _scheduling(process: psutil.Process) -> str:
    try:
        policy = {os.SCHED_OTHER: "other", os.SCHED_BATCH: "batch", os.SCHED_IDLE: "idle"}.get(
            os.sched_getscheduler(process.pid), "?")
        return f"nice {process.nice()} {policy}"
    except (psutil.Error, OSError):
        return "gone"


def describe_processes() -> str:
    """Nice value and scheduling policy of each role's processes, as issue 49's budget sets them."""
    parts = []
    for role in ("web", "worker", "interactive", "node"):
        tree = _tree(_run_pid(role))
        if tree:
            kinds = sorted({_scheduling(p) for p in tree})
            parts.append(f"{role} ({len(tree)}): {', '.join(kinds)}")
    return "; ".join(parts) or "no .run/*.pid (not started by make run)"


def describe_deployment(deployment: Deployment) -> str:
    replicas = []
    for replica in deployment.replicas.order_by("pk"):
        detail = f"replica {replica.pk} {replica.state}"
        try:
            process = psutil.Process(replica.pid)
            argv = process.cmdline()
            threads = argv[argv.index("--threads") + 1] if "--threads" in argv else "?"
            cpus = ",".join(map(str, process.cpu_affinity()))
            detail += f" pid {replica.pid}, --threads {threads}, CPUs {cpus}, {_scheduling(process)}"
        except (psutil.Error, TypeError, ValueError):
            detail += f" pid {replica.pid}"
        replicas.append(detail)
    slots = engine(deployment.engine).slots(model=deployment.model, settings=deployment.settings)
    return f"{deployment.name}: {deployment.state}, {slots} slots a replica; {'; '.join(replicas) or 'no replica'}"


def presets_ready() -> list[Deployment]:
    deployments = []
    for name in (PRESET_MODEL, GEMMA3):
        deployment = Deployment.objects.filter(workspace=None, name=name).first()
        if deployment is None or deployment.state != ServingState.READY:
            state = deployment.state if deployment else "not deployed"
            raise SystemExit(f"The preset {name} is {state}: the bench measures both presets deployed and ready, "
                             f"as make run leaves them. Start it on Models & Serving, or rerun make run.")
        deployments.append(deployment)
    return deployments


# ---- background work ----


def progress_at(events: list[float], at: float) -> float:
    """Units of work done by `at`: the count done, linear between the distinct completion times recorded (sorted;
    several units may share one)."""
    done = bisect.bisect_right(events, at)
    if done == 0 or done == len(events):
        return float(done)
    previous, following = events[done - 1], events[done]
    done_then = bisect.bisect_right(events, following)
    return done + (done_then - done) * (at - previous) / (following - previous)


@dataclass
class Rate:
    per_min: float | None
    seconds: float
    ran_out_at: float | None  # seconds into the window when the work ran out, if it did

    def text(self) -> str:
        if self.per_min is None:
            return "-" if self.ran_out_at is None else "- (ran out before)"
        return f"{self.per_min:.1f}" + (f" (ran out at {self.ran_out_at:.0f} s)" if self.ran_out_at is not None else "")


def rate(progress: Callable[[float], float], start: float, end: float, ran_out: float | None) -> Rate:
    """The work's rate over [start, end], or over the part of it before the work ran out (at `ran_out`)."""
    ran_out_at = None
    if ran_out is not None and ran_out < end:
        ran_out_at, end = max(ran_out - start, 0.0), ran_out
    if end - start <= 0:
        return Rate(None, 0.0, ran_out_at)
    return Rate(60 * (progress(end) - progress(start)) / (end - start), end - start, ran_out_at)


class Background:
    """One kind of background work; the methods in the order the bench calls them."""

    name = ""
    unit = ""
    _events: list[float] = []

    def prepare(self) -> None:
        """What the work needs before it starts (not measured)."""

    def start(self) -> None:
        raise NotImplementedError

    def warm(self) -> None:
        """Wait until the work is under way (models loaded, its first units done)."""
        raise NotImplementedError

    def events(self) -> list[float]:
        """Completion times (epoch seconds, sorted) of the units of work done so far, past the warm-up."""
        raise NotImplementedError

    def finished(self) -> bool:
        raise NotImplementedError

    def watch(self) -> None:
        """Called as the windows begin."""

    def close_windows(self, end: float) -> None:
        """Called once the windows are over, `end` the last one's end: the progress read between completion times
        needs the first one after it."""
        _wait(lambda: (self.events(), self.finished()),
              lambda state: state[1] or (state[0] and state[0][-1] > end), timeout_s=300,
              what=f"{self.name}'s next unit of work after the windows")
        self._events = self.events()

    def progress(self, at: float) -> float:
        """Units of work done by `at` (after close_windows)."""
        return progress_at(self._events, at)

    def ran_out(self) -> float | None:
        """When the last unit of work was done, if there is no more (after close_windows)."""
        return self._events[-1] if self._events and self.finished() else None

    def describe(self) -> str:
        return ""

    def stop(self) -> None:
        """Stop the work where it is (cleanup removes what is left)."""


def _wait(read: Callable, done: Callable, *, timeout_s: float, what: str, progress: Callable | None = None):
    """wait_for with a line every PROGRESS_S, and a failure of the work raised at once (`done` may raise)."""
    deadline, last_print = time.monotonic() + timeout_s, time.monotonic()
    while True:
        value = read()
        if done(value):
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"Timed out after {timeout_s:.0f} s waiting for {what} (last seen: {value}).")
        if progress is not None and time.monotonic() - last_print >= PROGRESS_S:
            print(f"  ... {progress(value)}", flush=True)
            last_print = time.monotonic()
        time.sleep(0.5)


def _upload(actor: Actor, kb: KnowledgeBase, files: list[tuple[str, bytes]]) -> list[int]:
    """Through the upload path the API uses, in one call; duplicates (the same page text twice) left out."""
    outcomes = rag_services.upload_documents(actor=actor, kb=kb, uploads=[
        UploadedFile(name, io.BytesIO(content), len(content)) for name, content in files])
    return [o.document.pk for o in outcomes if o.document is not None and o.duplicate_of is None]


def _done_documents(ids: list[int]) -> int:
    return Document.objects.filter(pk__in=ids, status__in=[DocumentStatus.INDEXED, DocumentStatus.FAILED]).count()


def _page_file(page: manpages.Page) -> tuple[str, bytes]:
    return page.path.replace("/", "-") + ".txt", f"{page.path}\n\n{page.text}\n".encode()


class Ingest(Background):
    """Progress: each document's own (Document.progress, 0-100 through the stages, moving batch by batch while its
    chunks are embedded), summed: a worker indexes a group of up to RAG_INGEST_GROUP_DOCS documents at one time, too
    few completion times in a window for a rate. Sampled every SAMPLE_S while the windows last."""

    name, unit = "ingest", "documents/min"
    SAMPLE_S = 0.5

    def __init__(self, actor: Actor, workspace, pages: list[manpages.Page]):
        self.actor, self.workspace, self.pages = actor, workspace, pages
        self.kb: KnowledgeBase | None = None
        self.ids: list[int] = []
        self.upload_s = 0.0
        self.samples: list[tuple[float, float]] = []
        self.halt = threading.Event()
        self.sampler: threading.Thread | None = None

    def prepare(self) -> None:
        self.kb = rag_services.create_knowledge_base(actor=self.actor, workspace=self.workspace,
                                                     name=f"ingest-{secrets.token_hex(3)}", retrieval=OWN_RETRIEVAL)

    def start(self) -> None:
        began = time.perf_counter()
        self.ids = _upload(self.actor, self.kb, [_page_file(page) for page in self.pages])
        self.upload_s = time.perf_counter() - began
        print(f"  uploaded {len(self.ids)} documents in {self.upload_s:.1f} s", flush=True)

    def warm(self) -> None:
        warm = min(WARM_DOCUMENTS, max(1, len(self.ids) // 10))
        _wait(lambda: _done_documents(self.ids), lambda done: done >= warm, timeout_s=600,
              what=f"the first {warm} documents to be ingested")

    def events(self) -> list[float]:
        indexed = Document.objects.filter(pk__in=self.ids, status=DocumentStatus.INDEXED).values_list(
            "indexed_at", flat=True)
        failed = Document.objects.filter(pk__in=self.ids, status=DocumentStatus.FAILED).values_list(
            "updated_at", flat=True)
        return sorted(at.timestamp() for at in [*indexed, *failed] if at is not None)

    def finished(self) -> bool:
        return _done_documents(self.ids) >= len(self.ids)

    def _sample(self) -> None:
        done = Document.objects.filter(pk__in=self.ids).aggregate(total=Sum("progress"))["total"] or 0
        self.samples.append((time.time(), done / 100))

    def _sample_until_halted(self) -> None:
        try:
            while not self.halt.is_set():
                self._sample()
                self.halt.wait(self.SAMPLE_S)
        finally:
            connection.close()  # this thread's own

    def watch(self) -> None:
        self.sampler = threading.Thread(target=self._sample_until_halted, daemon=True)
        self.sampler.start()

    def close_windows(self, end: float) -> None:
        self.halt.set()
        self.sampler.join()
        self._sample()
        self._events = self.events()

    def progress(self, at: float) -> float:
        index = bisect.bisect_right(self.samples, (at, float("inf")))
        if index == 0:
            return self.samples[0][1]
        if index == len(self.samples):
            return self.samples[-1][1]
        (before, done_before), (after, done_after) = self.samples[index - 1], self.samples[index]
        return done_before + (done_after - done_before) * (at - before) / (after - before)

    def describe(self) -> str:
        done = _done_documents(self.ids)
        failed = Document.objects.filter(pk__in=self.ids, status=DocumentStatus.FAILED).count()
        groups = len(set(self.events()))
        return (f"{done} of {len(self.ids)} documents done ({failed} failed) when stopped, indexed at {groups} "
                f"distinct times (a worker indexes up to {settings.RAG_INGEST_GROUP_DOCS} together); the upload call "
                f"took {self.upload_s:.1f} s")

    def stop(self) -> None:
        if self.kb is not None:
            rag_services.delete_knowledge_base(actor=self.actor, kb=self.kb)
            self.kb = None


class Tuning(Background):
    name, unit = "tuning", "trials/min"

    def __init__(self, actor: Actor, workspace, asked: list[tuple[manpages.Page, str]]):
        self.actor, self.workspace, self.asked = actor, workspace, asked
        self.kb: KnowledgeBase | None = None
        self.eval_set = None
        self.job: RetrievalTuning | None = None

    def prepare(self) -> None:
        self.kb = rag_services.create_knowledge_base(actor=self.actor, workspace=self.workspace,
                                                     name=f"tuning-{secrets.token_hex(3)}", retrieval=OWN_RETRIEVAL)
        files = [_page_file(page) for page, _ in self.asked]
        ids = _upload(self.actor, self.kb, files)
        print(f"  ingesting the {len(ids)} pages the tuning job searches ...", flush=True)
        _wait(lambda: _done_documents(ids), lambda done: done >= len(ids), timeout_s=900,
              what="the tuning knowledge base's documents", progress=lambda done: f"{done} of {len(ids)} done")
        # Each question is its page's NAME description with the page's names taken out; the page is its source.
        lines = "\n".join(json.dumps({"question": question, "expected_sources": [name]}, ensure_ascii=False)
                          for (page, question), (name, _) in zip(self.asked, files))
        self.eval_set = evaluation.upload_eval_set(actor=self.actor, kb=self.kb, name="man page questions",
                                                   filename="questions.jsonl", content=lines.encode())

    def start(self) -> None:
        self.job = tuning.start_tuning(actor=self.actor, kb=self.kb, eval_set=self.eval_set, trials=TUNING_TRIALS,
                                       top_k=5)

    def _status(self) -> tuple[str, int]:
        job = RetrievalTuning.objects.get(pk=self.job.pk)
        if job.status == JobStatus.FAILED:
            raise RuntimeError(f"The tuning job failed: {job.error}")
        return job.status, job.trials.count()

    def warm(self) -> None:
        # Trial 0 (the settings in use) loads the embedding model and the index; trial 1 is the search's first.
        _wait(self._status, lambda state: state[1] >= 2, timeout_s=600, what="the tuning job's first trials")

    def events(self) -> list[float]:
        return sorted(at.timestamp() for at in TuningTrial.objects.filter(tuning=self.job, number__gte=1)
                      .values_list("created_at", flat=True))

    def finished(self) -> bool:
        return self._status()[0] not in tuning.ACTIVE

    def describe(self) -> str:
        status, trials = self._status()
        return f"job {self.job.pk} {status} with {trials - 1} of {TUNING_TRIALS} trials when stopped"

    def stop(self) -> None:
        if self.job is None:
            return
        try:
            tuning.cancel_tuning(actor=self.actor, tuning=self.job)
        except ApplicationError:
            pass  # already finished
        # Cancelled after the trial it is on: wait for it, so that the next phase starts from idle workers.
        wait_for(lambda: RetrievalTuning.objects.get(pk=self.job.pk).status,
                 done=lambda status: status not in tuning.ACTIVE, timeout_s=120, interval_s=0.5,
                 what="the tuning job to stop")


class Lora(Background):
    name, unit = "lora", "steps/min"

    def __init__(self, actor: Actor, workspace):
        self.actor, self.workspace = actor, workspace
        self.job: EnhancementJob | None = None

    def start(self) -> None:
        dataset = enhancement_services.import_sample_dataset(actor=self.actor, workspace=self.workspace)
        self.job = enhancement_services.create_finetune_job(
            actor=self.actor, workspace=self.workspace, name=f"bench-lora-{secrets.token_hex(3)}",
            base_model=Model.objects.get(workspace=None, name=PRESET_MODEL), dataset=dataset,
            node=Node.objects.get(name=settings.NODE_NAME), method="lora", hyperparameters=LORA_HYPERPARAMETERS,
            quantizations=["q8_0"])
        hyper = self.job.hyperparameters
        print(f"  job {self.job.pk}: LoRA rank {hyper['lora_rank']} on {', '.join(hyper['lora_targets'])}, batch "
              f"{hyper['batch_size']} (micro-batch {hyper['micro_batch_size']}), cutoff {hyper['cutoff']}, "
              f"{hyper['workers']} worker(s)", flush=True)

    def _state(self) -> tuple[str, str, int]:
        job = EnhancementJob.objects.select_related("cluster_job").get(pk=self.job.pk)
        if job.state in (JobState.FAILED, JobState.CANCELLED):
            raise RuntimeError(f"The fine-tune job {job.state}: {job.error}")
        return job.state, job.stage, MetricSample.objects.filter(job=job, step_time_s__isnull=False).count()

    def warm(self) -> None:
        # A GGUF base is converted to Hugging Face form first (once; kept for later jobs), then loaded.
        _wait(self._state, lambda state: state[2] >= WARM_STEPS, timeout_s=1200,
              what="the fine-tune job's first steps", progress=lambda state: f"job {state[0]}, stage {state[1]}")

    def events(self) -> list[float]:
        return sorted(at.timestamp() for at in MetricSample.objects.filter(
            job=self.job, step_time_s__isnull=False).values_list("at", flat=True))

    def finished(self) -> bool:
        return self._state()[0] in FINISHED_JOB_STATES

    def describe(self) -> str:
        job = EnhancementJob.objects.get(pk=self.job.pk)
        return f"job {job.pk} {job.state} at step {job.step} when stopped"

    def stop(self) -> None:
        if self.job is None:
            return
        # Read again: the process is stopped by the pid the row holds now (none when it was created).
        job = EnhancementJob.objects.select_related("cluster_job").get(pk=self.job.pk)
        if job.cluster_job is not None and job.cluster_job.state not in FINISHED_JOB_STATES:
            enhancement_services.cancel_job(actor=self.actor, job=job)  # stops the process here and now
        # The node worker's loop sees the cancel within a second and leaves the job; deleted before that, it would
        # take the stopped process for a failure.
        wait_for(lambda: engine_process.is_alive(EnhancementJob.objects.get(pk=job.pk).pid),
                 done=lambda alive: not alive, timeout_s=60, what="the training process to stop")
        time.sleep(3 * POLL_S)
        enhancement_services.delete_job(actor=self.actor, job=EnhancementJob.objects.get(pk=job.pk))
        self.job = None


# ---- phases ----


@dataclass
class Row:
    phase: str
    chats: Chats | None = None
    under_chats: Rate | None = None
    alone: Rate | None = None
    unit: str = ""
    note: str = ""
    failed: str = ""


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def _ratio(value: float | None, quiet: float | None) -> float | None:
    return None if value is None or not quiet else value / quiet


def _mark(met: bool | None) -> str:
    return "" if met is None else (CHECK if met else CROSS)


HEADER = (f"{'phase':<8} {'ok':>4} {'err':>3} {'TTFT p50':>9} {'TTFT p90':>9} {'TPOT p50':>9} {'TTFT p90 x':>11} "
          f"{'TPOT p50 x':>11}  background rate with chats / alone (share)")


def row_line(row: Row, quiet: Row | None) -> str:
    """A phase's figures (ms), as HEADER names them, with the ratios to quiet and the targets met or not."""
    if row.failed or row.chats is None:
        return f"{row.phase:<8} failed: {row.failed}"
    chats = row.chats
    ttft_ratio = tpot_ratio = None
    if row.phase in BACKGROUND_PHASES and quiet is not None and quiet.chats is not None:
        ttft_ratio = _ratio(chats.ttft(90), quiet.chats.ttft(90))
        tpot_ratio = _ratio(chats.tpot(50), quiet.chats.tpot(50))
    last = ""
    if row.under_chats is not None:
        share = (row.under_chats.per_min / row.alone.per_min
                 if row.under_chats.per_min is not None and row.alone.per_min else None)
        last = f"{row.unit} {row.under_chats.text()} / {row.alone.text()}"
        if share is not None:
            last += f" ({100 * share:.0f}% {_mark(share >= BACKGROUND_SHARE_TARGET)})"
    elif row.phase == "lone":
        tpot = chats.tpot(50)
        last = f"TPOT p50 <= {LONE_TPOT_TARGET_MS:g} ms {_mark(tpot is not None and tpot <= LONE_TPOT_TARGET_MS)}"
    return (f"{row.phase:<8} {len(chats.ok):>4} {len(chats.errors()):>3} {_ms(chats.ttft(50)):>9} "
            f"{_ms(chats.ttft(90)):>9} {_ms(chats.tpot(50)):>9} {_ratio_cell(ttft_ratio):>11} "
            f"{_ratio_cell(tpot_ratio):>11}  {last}").rstrip()


def print_row(row: Row, quiet: Row | None) -> None:
    print(HEADER)
    print(row_line(row, quiet), flush=True)
    if row.chats is None:
        return
    errors = row.chats.errors()
    for note in [f"{len(errors)} failed, the first: {errors[0]}" if errors else "",
                 f"{row.chats.short()} answers under {MAX_TOKENS} tokens" if row.chats.short() else "", row.note]:
        if note:
            print(f"  {note}", flush=True)


def _ratio_cell(ratio: float | None) -> str:
    if ratio is None:
        return ""
    return f"{ratio:.2f}x {_mark(ratio <= LOAD_RATIO_TARGET)}"


def run_background(work: Background, api_key: str, questions: Questions, args) -> Row:
    print(f"-- {work.name}: preparing", flush=True)
    work.prepare()
    wait_settled(work.name)
    work.start()
    work.warm()
    work.watch()
    print(f"-- {work.name}: under way; chats for at least {args.window_s:.0f} s and {args.rounds} requests per "
          f"client", flush=True)
    chats = run_chats(api_key, questions, concurrency=CONCURRENCY, each=args.rounds, min_s=args.window_s)
    length = chats.ended - chats.started
    print(f"-- {work.name}: {length:.0f} s of chats done; the work alone for as long", flush=True)
    time.sleep(length)
    alone_end = chats.ended + length
    work.close_windows(alone_end)
    ran_out = work.ran_out()
    row = Row(work.name, chats, rate(work.progress, chats.started, chats.ended, ran_out),
              rate(work.progress, chats.ended, alone_end, ran_out), work.unit)
    notes = [work.describe()]
    if row.under_chats.ran_out_at is not None:
        notes.append(f"the work ran out {row.under_chats.ran_out_at:.0f} s into the {length:.0f} s of chats: "
                     f"later chats had no background load (ask for more work)")
    row.note = "; ".join(note for note in notes if note)
    return row


# ---- set-up and clean-up ----


def man_pages(documents: int, asked: int) -> tuple[list[manpages.Page], list[tuple[manpages.Page, str]]]:
    """`documents` English pages spread over the packages for ingest, and `asked` pages with their questions (the
    pages of rag_quality's man page set) for tuning."""
    roots = manpages.ensure_packages()
    pages = []
    for package in manpages.ENGLISH_PACKAGES:
        man = roots[package] / "usr/share/man"
        for path in sorted(man.glob("man*/*.gz")):
            page = manpages.read_page(path, str(path.relative_to(man))[:-3], manpages.EN_PAGE_CHARS)
            if page is not None and page.text.strip():
                pages.append(page)
    if len(pages) < documents:
        raise SystemExit(f"Only {len(pages)} English man pages are at hand; ask for --documents {len(pages)} or fewer")
    spread = [pages[index * len(pages) // documents] for index in range(documents)]
    english, chinese = manpages.parallel_pages(roots)
    chosen = manpages.questions(english, chinese, asked)
    return spread, [(en, en_question) for en, en_question, _zh, _ in chosen]


class Setup:
    """The run's two workspaces (the chats' key is in one; the background work is in the other) and its key."""

    def __init__(self):
        admin = get_user_model().objects.get(username=ADMIN_USERNAME)
        self.actor = Actor(user=admin)
        tag = secrets.token_hex(3)
        self.chat_workspace = create_workspace(actor=self.actor, name=f"bench-interactive-chats-{tag}")
        self.work_workspace = create_workspace(actor=self.actor, name=f"bench-interactive-work-{tag}")
        self.issued = create_api_key(actor=self.actor, workspace=self.chat_workspace, name="bench-interactive")

    def tear_down(self) -> None:
        revoke_api_key(actor=self.actor, api_key=self.issued.api_key)
        for job in EnhancementJob.objects.filter(workspace=self.work_workspace):
            enhancement_services.delete_job(actor=self.actor, job=job)
        for kb in KnowledgeBase.objects.filter(workspace=self.work_workspace):
            rag_services.delete_knowledge_base(actor=self.actor, kb=kb)
        # The bench's requests only blur the preset's request history.
        RequestRecord.objects.filter(workspace=self.chat_workspace).delete()
        self.work_workspace.delete()
        self.chat_workspace.delete()


def summary(rows: list[Row]) -> None:
    quiet = next((row for row in rows if row.phase == "quiet"), None)
    print(f"\nSummary (ms; issue 49's targets: under each load TTFT p90 and TPOT p50 <= {LOAD_RATIO_TARGET:g}x "
          f"quiet's, the work >= {100 * BACKGROUND_SHARE_TARGET:.0f}% of its rate alone; lone TPOT p50 <= "
          f"{LONE_TPOT_TARGET_MS:g} ms)")
    print(HEADER)
    for row in rows:
        print(row_line(row, quiet))


def _phases(text: str) -> list[str]:
    chosen = [name.strip() for name in text.split(",") if name.strip()]
    unknown = [name for name in chosen if name not in PHASES]
    if unknown or not chosen:
        raise argparse.ArgumentTypeError(f"phases are among {','.join(PHASES)} (got {text!r})")
    return [name for name in PHASES if name in chosen]  # always in this order: quiet is what the others compare to


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--phases", type=_phases, default=list(PHASES), help=f"among {','.join(PHASES)}")
    parser.add_argument("--rounds", type=int, default=8,
                        help="requests per client in quiet, and at least this many under each load")
    parser.add_argument("--window-s", type=float, default=45.0,
                        help="the chats under a load last at least this long; the work alone as long after")
    parser.add_argument("--lone-requests", type=int, default=20, help="requests of the lone phase")
    parser.add_argument("--documents", type=int, default=300, help="man pages the ingest phase uploads at once")
    parser.add_argument("--tuning-pages", type=int, default=60, help="pages (and questions) the tuning job searches")
    args = parser.parse_args()

    loads = [phase for phase in args.phases if phase in BACKGROUND_PHASES]
    print_header("interactive_load", f"{CONCURRENCY} streams of {MAX_TOKENS} tokens to {PRESET_MODEL} through the "
                                     f"gateway, phases {', '.join(args.phases)}"
                                     + (f" ({', '.join(loads)} in another workspace)" if loads else ""))
    for deployment in presets_ready():
        print(describe_deployment(deployment))
    print(f"Processes: {describe_processes()}", flush=True)
    pages, asked = [], []
    if {"ingest", "tuning"} & set(args.phases):
        pages, asked = man_pages(args.documents if "ingest" in args.phases else 0, args.tuning_pages)
    began = time.monotonic()
    setup = Setup()
    questions, rows = Questions(), []
    try:
        # Warm: the engine's first requests and the gateway's key check, not measured.
        run_chats(setup.issued.secret, questions, concurrency=CONCURRENCY, each=WARMUP_REQUESTS // CONCURRENCY)
        for phase in args.phases:
            quiet = next((row for row in rows if row.phase == "quiet"), None)
            try:
                if phase in ("quiet", "lone"):
                    wait_settled(phase)
                    concurrency, each = (CONCURRENCY, args.rounds) if phase == "quiet" else (1, args.lone_requests)
                    row = Row(phase, run_chats(setup.issued.secret, questions, concurrency=concurrency, each=each))
                    if phase == "lone":
                        gemma = Deployment.objects.get(workspace=None, name=GEMMA3)
                        row.note = f"{GEMMA3} {gemma.state} beside it"
                else:
                    work = {"ingest": lambda: Ingest(setup.actor, setup.work_workspace, pages),
                            "tuning": lambda: Tuning(setup.actor, setup.work_workspace, asked),
                            "lora": lambda: Lora(setup.actor, setup.work_workspace)}[phase]()
                    try:
                        row = run_background(work, setup.issued.secret, questions, args)
                    finally:
                        work.stop()
            except Exception as exc:  # the other phases still run, and the clean-up below
                row = Row(phase, failed=f"{exc.__class__.__name__}: {exc}")
            rows.append(row)
            print_row(row, quiet)
    finally:
        setup.tear_down()
    summary(rows)
    load = ", ".join(f"{value:.2f}" for value in os.getloadavg())
    print(f"\n{time.monotonic() - began:.0f} s in all; load average at the end {load}")


if __name__ == "__main__":
    main()
