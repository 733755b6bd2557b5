"""A default that adapts to each knowledge base without an eval set (issue 34).

When a knowledge base finishes indexing, and again once documents indexed since hold a third of its chunks, a set
of questions is drawn from its own chunks without an LLM: held-out sentences. Each question is a whole sentence of a
sampled chunk; its answer is the rest of that chunk's document, and the chunks holding the sentence itself are left
out of the results when it is scored (`EvalItem.hidden_chunks`). Like a user's question, it is about the document
but not in it word for word, so keyword search cannot find it by the sentence's exact words. A short tuning job
(`tuning`, on the main workers' queue) then searches the retrieval settings on half of them, always measuring dense
and keyword search alone too, and its winner becomes the knowledge base's default only where it beats the fixed
default on the held-back half beyond noise. What was measured and chosen is shown on the knowledge base's page.

Only a knowledge base on the fixed default (or on an earlier automatic winner) adapts: settings the user chose
are theirs.

Why held out: questions made of a chunk's own sentence with words left out, answered by that chunk, favoured keyword
search on the English man pages of bench.rag_quality (keyword alone 0.733 against dense 0.417), while on the bench's
questions (pages named by their description) dense found 0.950 and keyword 0.883. On 300 held-out sentences of the
same pages dense found 0.597 and keyword 0.600 (hybrid 0.650): no longer a set that favours keyword search, though
short descriptions favour dense search more than whole sentences do, which such a set cannot show.
"""

import logging
import random
import re
from dataclasses import dataclass

import jieba
from django.db import transaction
from django.utils import timezone

from accounts.errors import ApplicationError
from accounts.services import SYSTEM, record_audit
from cluster import queues
from rag_studio import services
from rag_studio.evals import jobs, tuning
from rag_studio.models import (
    Chunk,
    DocumentStatus,
    EvalItem,
    EvalSet,
    EvalSetSource,
    JobStatus,
    KnowledgeBase,
    RetrievalTuning,
)
from rag_studio.search.retrieval_config import is_default, validate_retrieval

logger = logging.getLogger(__name__)
GENERATOR = "held-out sentences of its own chunks, answered by the rest of their document (no LLM)"
QUESTIONS = 300
TRIALS = 20
MIN_CHUNKS = 10
# At most this many questions from one chunk (different sentences).
ROUNDS = 3
# Documents indexed since the last automatic job must hold this share of the chunks for it to run again.
CHANGED_SHARE = 1 / 3
# A question is a sentence of at least this many words, cut at this many characters.
MIN_WORDS = 8
MAX_QUESTION_CHARS = 300
# Chunk texts read at a time while drawing questions: a large base is never read whole.
TEXT_BATCH = 500
_SENTENCE_END = re.compile(r"(?<=[.!?。！？；;])\s*|\n+")
_WORD = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff]+|[^\W_]+(?:[-_./][^\W_]+)*")
_CJK = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff]")


@dataclass(frozen=True)
class SyntheticQuestion:
    question: str
    chunk_id: int  # the chunk it was drawn from
    relevant: list[int]  # the other chunks of its document: the answer
    hidden: list[int]  # the chunks holding the sentence itself, left out of its results


def _words(sentence: str) -> list[str]:
    words = []
    for word in _WORD.findall(sentence):
        words.extend(jieba.lcut(word) if _CJK.match(word) else [word])
    return [word for word in words if word.strip()]


def sentence_from(text: str, draw: random.Random) -> str:
    """A sentence of `text` of at least MIN_WORDS words, whitespace collapsed and cut at MAX_QUESTION_CHARS; ''
    when there is none."""
    sentences = [" ".join(part.split())[:MAX_QUESTION_CHARS] for part in _SENTENCE_END.split(text)
                 if len(_words(part)) >= MIN_WORDS]
    return draw.choice(sentences) if sentences else ""


def synthetic_questions(kb: KnowledgeBase, count: int = QUESTIONS, seed: int = 0) -> list[SyntheticQuestion]:
    """Held-out sentences of chunks sampled across the knowledge base's documents of two chunks or more: one a
    chunk first, then more rounds where a small base has fewer chunks than questions asked for."""
    documents: dict[int, list[int]] = {}
    for chunk_id, document_id in kb.chunks.filter(searchable=True).order_by("pk").values_list("pk", "document_id"):
        documents.setdefault(document_id, []).append(chunk_id)
    chunks = [(chunk_id, document_id) for document_id, ids in documents.items() if len(ids) > 1 for chunk_id in ids]
    draw = random.Random(seed)
    draw.shuffle(chunks)
    questions, asked = [], set()
    for _round in range(ROUNDS):
        for start in range(0, len(chunks), TEXT_BATCH):
            batch = chunks[start:start + TEXT_BATCH]
            texts = dict(Chunk.objects.filter(pk__in=[chunk_id for chunk_id, _ in batch]).values_list("pk", "text"))
            for chunk_id, document_id in batch:
                sentence = sentence_from(texts.get(chunk_id, ""), draw)
                if not sentence or sentence in asked:
                    continue
                hidden = set(Chunk.objects.filter(document_id=document_id, searchable=True, text__contains=sentence)
                             .values_list("pk", flat=True)) | {chunk_id}
                relevant = [other for other in documents[document_id] if other not in hidden]
                if relevant:
                    questions.append(SyntheticQuestion(sentence, chunk_id, relevant, sorted(hidden)))
                    asked.add(sentence)
                if len(questions) == count:
                    return questions
    return questions


def adapts(kb: KnowledgeBase) -> bool:
    """Whether the knowledge base's default is the platform's to set: the fixed one, or an automatic winner."""
    if is_default(kb.retrieval):
        return True
    last = kb.tunings.filter(automatic=True, applied__target="knowledge_base").order_by("-pk").first()
    if last is None or last.applied.get("rolled_back"):
        return False
    trial = last.trials.filter(number=last.applied["trial"]).first()
    return trial is not None and trial.settings["retrieval"] == validate_retrieval(kb.retrieval)


def _changed_enough(kb: KnowledgeBase, total: int) -> bool:
    last = kb.tunings.filter(automatic=True).order_by("-pk").first()
    if last is None:
        return True
    if last.status in tuning.ACTIVE:
        return False
    new = Chunk.objects.filter(knowledge_base=kb, searchable=True, document__indexed_at__gt=last.created_at).count()
    return new >= total * CHANGED_SHARE


def consider(kb_id: int) -> RetrievalTuning | None:
    """Start an automatic tuning job where the knowledge base is indexed, large enough, its default is the
    platform's to set, and it changed enough since the last one. Returns the job, or None."""
    kb = KnowledgeBase.objects.filter(pk=kb_id).select_related("workspace").first()
    if kb is None or not adapts(kb) or kb.building_key:
        return None
    if kb.documents.filter(status__in=[DocumentStatus.QUEUED, DocumentStatus.PROCESSING]).exists():
        return None  # the last document to finish offers it again
    total = kb.chunks.filter(searchable=True).count()
    if total < MIN_CHUNKS or not _changed_enough(kb, total):
        return None
    questions = synthetic_questions(kb, seed=total)
    if len(questions) < tuning.MIN_QUESTIONS:
        return None
    try:
        queues.check_job_limit(kb.workspace_id)
    except ApplicationError:
        return None  # the workspace's own jobs come first; the next change offers it again
    with transaction.atomic():
        KnowledgeBase.objects.select_for_update().filter(pk=kb.pk).first()
        if RetrievalTuning.objects.filter(knowledge_base=kb, status__in=tuning.ACTIVE).exists():
            return None
        eval_set = EvalSet.objects.create(
            workspace=kb.workspace, knowledge_base=kb, source=EvalSetSource.GENERATED, generator=GENERATOR,
            name=f"Automatic {timezone.now():%Y-%m-%d %H:%M} ({len(questions)})", requested_items=len(questions))
        EvalItem.objects.bulk_create([
            EvalItem(eval_set=eval_set, question=item.question, source_chunk_id=item.chunk_id,
                     expected_sources=[f"chunk:{chunk_id}" for chunk_id in item.relevant], hidden_chunks=item.hidden)
            for item in questions])
        job = RetrievalTuning.objects.create(workspace=kb.workspace, knowledge_base=kb, eval_set=eval_set,
                                             trials_requested=TRIALS, automatic=True)
        record_audit(actor=SYSTEM, workspace=kb.workspace, action="rag.tuning.automatic", target=job,
                     detail={"questions": len(questions), "chunks": total})
        transaction.on_commit(lambda: jobs.dispatch(RetrievalTuning, jobs.TUNE_TASK, job.pk))
    return job


def adopt(tuning_id: int) -> str:
    """After an automatic job: its winner becomes the default where it beat the fixed default on both halves,
    beyond noise on the held-back one, and the default is still the platform's to set; otherwise the fixed default
    stays (or comes back, where an earlier winner no longer beats it). Returns what happened: 'adopted', 'kept' or
    'skipped'."""
    job = RetrievalTuning.objects.select_related("knowledge_base").filter(pk=tuning_id, automatic=True,
                                                                         status=JobStatus.DONE).first()
    if job is None or job.applied or not adapts(job.knowledge_base):
        return "skipped"
    kb, report = job.knowledge_base, job.report
    winner = job.trials.get(number=report["best"]).settings["retrieval"] if report.get("suggested") else None
    refused = winner and _not_adoptable(report)
    if winner and not refused:
        retrieval, outcome = winner, "adopted"
    else:
        retrieval, outcome = validate_retrieval(None), "kept"
    with transaction.atomic():
        if refused:  # the page shows the job's why
            RetrievalTuning.objects.filter(pk=job.pk).update(report={**report, "why": f"{report['why']} {refused}"})
        previous = kb.retrieval
        KnowledgeBase.objects.filter(pk=kb.pk).update(retrieval=retrieval, updated_at=timezone.now())
        kb.refresh_from_db()
        services.register_kb_asset(kb)
        if outcome == "adopted":
            RetrievalTuning.objects.filter(pk=job.pk).update(
                applied_to=f"trial {report['best']} → knowledge base '{kb.name}' defaults (automatic)"[:96],
                applied={"trial": report["best"], "target": "knowledge_base", "previous": {"retrieval": previous},
                         "rolled_back": False})
        record_audit(actor=SYSTEM, workspace=kb.workspace, action="rag.tuning.automatic_result", target=job,
                     detail={"outcome": outcome, "trial": report.get("best"),
                             "why": f"{report.get('why', '')} {refused or ''}".strip()})
    return outcome


def _not_adoptable(report: dict) -> str:
    """Why a winner is not adopted, or '': a default that moves for every knowledge base must gain beyond noise."""
    if report.get("noise", {}).get("within_noise"):
        return "Not adopted: the gain is within noise."
    return ""


def measured_default(kb: KnowledgeBase) -> dict | None:
    """What the knowledge base page says of its default: the last finished automatic job's held-back figures for
    the fixed default, dense and keyword search alone, and the winner where one was adopted."""
    job = kb.tunings.filter(automatic=True, status=JobStatus.DONE).order_by("-pk").first()
    if job is None:
        return None
    report = job.report
    trials = {trial.number: trial for trial in job.trials.all()}
    references = report.get("references", {})

    def held(number):
        trial = trials.get(number)
        return trial.holdout_metrics["hit@k"] if trial else None

    adopted = job.applied and not job.applied.get("rolled_back")
    return {"job": job, "questions": report["questions"]["held_back"], "k": report["k"], "default": held(0),
            "dense": held(references.get("dense")), "keyword": held(references.get("keyword")),
            "adopted": held(report["best"]) if adopted else None, "trial": report["best"] if adopted else None,
            "in_use": adopted and adapts(kb) and not is_default(kb.retrieval)}
