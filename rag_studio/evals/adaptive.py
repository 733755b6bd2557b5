"""A default that adapts to each knowledge base without an eval set (issue 34).

When a knowledge base finishes indexing, and again once documents indexed since hold a third of its chunks, a set
of questions is drawn from its own chunks without an LLM: a sentence of a sampled chunk, with half its words left
out, its rarest quarter among them (a user's question shares some words with its passage, rarely all, and often not
its exact terms, the ones keyword search keys on), whose answer is that chunk. A short
tuning job (`tuning`, on the interactive queue) then searches the retrieval settings on half of them, always
measuring dense and keyword search alone too, and its winner becomes the knowledge base's default only where it
beats the fixed default on the held-back half. What was measured and chosen is shown on the knowledge base's page.

Only a knowledge base on the fixed default (or on an earlier automatic winner) adapts: settings the user chose
are theirs. The questions share more words with their passages than a user's would, so keyword search does better
on them than on real questions; a gain must show on the held-back half, and the page says where it came from.
"""

import logging
import random
import re
from collections import Counter

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
from rag_studio.search.retrieval_config import DEFAULT_RETRIEVAL, is_default, validate_retrieval

logger = logging.getLogger(__name__)
GENERATOR = "sentences of its own chunks, their rarest words and half in all left out (no LLM)"
QUESTIONS = 60
TRIALS = 20
MIN_CHUNKS = 10
# At most this many questions from one chunk (different sentences, or other words left out).
ROUNDS = 3
# Documents indexed since the last automatic job must hold this share of the chunks for it to run again.
CHANGED_SHARE = 1 / 3
DROPPED_SHARE = 1 / 2
# Of a sentence's words, this share of the rarest always goes (fewest chunks hold them).
RAREST_SHARE = 1 / 4
# Chunks read to count which words are rare: enough to rank words, few enough to stay quick on a large base.
FREQUENCY_SAMPLE = 2000
_SENTENCE_END = re.compile(r"(?<=[.!?。！？；;])\s*|\n+")
_WORD = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff]+|[^\W_]+(?:[-_./][^\W_]+)*")
_CJK = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff]")


def _words(sentence: str) -> list[str]:
    words = []
    for word in _WORD.findall(sentence):
        words.extend(jieba.lcut(word) if _CJK.match(word) else [word])
    return [word for word in words if word.strip()]


def question_from(text: str, draw: random.Random, chunks_with: Counter | None = None) -> str:
    """A question made of a sentence of `text` with half its words left out, its rarest quarter among them (those
    fewest chunks hold, by `chunks_with`; without it, the longest); '' when no sentence is long enough to leave
    words out of (at least 8 words)."""
    sentences = [words for part in _SENTENCE_END.split(text) if len(words := _words(part)) >= 8]
    if not sentences:
        return ""
    words = draw.choice(sentences)[:24]
    # The rarest words are the exact terms a user may not know, and the ones that let keyword search alone find the
    # chunk from its own words: they always go; others at random. Keyword search alone found the source chunk of
    # 0.636 of such questions in its top 5 on the English man pages of bench.rag_quality (0.760 Chinese), against
    # 0.704 (0.783) when the longest word went instead: a set that favours keyword search less.
    if chunks_with is None:
        rarest_first = sorted(range(len(words)), key=lambda index: -len(words[index]))
    else:
        rarest_first = sorted(range(len(words)), key=lambda index: (chunks_with[words[index].lower()],
                                                                    -len(words[index])))
    rarest = set(rarest_first[:max(1, int(len(words) * RAREST_SHARE))])
    others = [index for index in range(len(words)) if index not in rarest]
    dropped = rarest | set(draw.sample(others, max(0, int(len(words) * DROPPED_SHARE) - len(rarest))))
    kept = [word for index, word in enumerate(words) if index not in dropped]
    question = ""
    for word in kept:  # Chinese words join without spaces; others take one
        joined = question and not (_CJK.match(word) and _CJK.search(question[-1]))
        question += (" " if joined else "") + word
    return question


def synthetic_questions(kb: KnowledgeBase, count: int = QUESTIONS, seed: int = 0) -> list[tuple[str, int]]:
    """(question, id of the chunk it was drawn from), from chunks sampled across the knowledge base: one each
    first, then another round where a small base has fewer chunks than questions asked for."""
    chunks = list(kb.chunks.filter(searchable=True).order_by("pk").values_list("pk", "text"))
    draw = random.Random(seed)
    draw.shuffle(chunks)
    chunks_with = Counter(word for _, text in chunks[:FREQUENCY_SAMPLE] for word in {w.lower() for w in _words(text)})
    questions, asked = [], set()
    for _round in range(ROUNDS):
        for chunk_id, text in chunks:
            question = question_from(text, draw, chunks_with)
            if question and question not in asked:
                questions.append((question, chunk_id))
                asked.add(question)
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
        EvalItem.objects.bulk_create([EvalItem(eval_set=eval_set, question=question, source_chunk_id=chunk_id,
                                               expected_sources=[f"chunk:{chunk_id}"])
                                      for question, chunk_id in questions])
        job = RetrievalTuning.objects.create(workspace=kb.workspace, knowledge_base=kb, eval_set=eval_set,
                                             trials_requested=TRIALS, automatic=True)
        record_audit(actor=SYSTEM, workspace=kb.workspace, action="rag.tuning.automatic", target=job,
                     detail={"questions": len(questions), "chunks": total})
        transaction.on_commit(lambda: jobs.dispatch(RetrievalTuning, jobs.TUNE_TASK, job.pk))
    return job


def adopt(tuning_id: int) -> str:
    """After an automatic job: its winner becomes the default where it beat the fixed default on both halves and
    the default is still the platform's to set; otherwise the fixed default stays (or comes back, where an earlier
    winner no longer beats it). Returns what happened: 'adopted', 'kept' or 'skipped'."""
    job = RetrievalTuning.objects.select_related("knowledge_base").filter(pk=tuning_id, automatic=True,
                                                                         status=JobStatus.DONE).first()
    if job is None or job.applied or not adapts(job.knowledge_base):
        return "skipped"
    kb, report = job.knowledge_base, job.report
    winner = job.trials.get(number=report["best"]).settings["retrieval"] if report.get("suggested") else None
    refused = winner and _not_adoptable(winner, report)
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


def _not_adoptable(winner: dict, report: dict) -> str:
    """Why a synthetic set's winner is not adopted, or ''. Questions drawn from the chunks' own sentences favour
    keyword search whatever words are left out: on the English man pages of bench.rag_quality, dense search found
    0.333 of their source chunks and keyword search 0.733, while on the bench's real questions (pages named by
    their description) dense found 0.950 and keyword 0.883, and adopting the keyword-leaning winner cost 0.033
    against the fixed default. So such a set may move the default only within hybrid search and toward dense, and
    only by more than noise."""
    if report.get("noise", {}).get("within_noise"):
        return "Not adopted: the gain is within noise."
    if winner["mode"] != "hybrid":
        return (f"Not adopted: {winner['mode']} search alone; questions drawn from the text favour keyword search "
                f"more than real ones do, so the default keeps both.")
    if winner["fusion"] == "weighted" and winner["dense_weight"] < DEFAULT_RETRIEVAL["dense_weight"]:
        return ("Not adopted: it weights keyword search above the fixed default, which questions drawn from the text "
                "favour more than real ones do.")
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
