"""Eval sets (uploaded, or generated from the corpus by an LLM) and eval runs of a RAG config version over them.

Generation and runs are Celery tasks that hold their row by a lease, as `jobs` describes: each item is saved as it
completes, and a task that takes over skips what is done.
"""

import json
import logging
import random
import re
import time
from collections import defaultdict
from itertools import zip_longest

from celery.exceptions import SoftTimeLimitExceeded
from django.db import IntegrityError, transaction

from accounts.errors import Conflict, ValidationFailed
from accounts.models import Role
from accounts.services import Actor, record_audit, require_role
from cluster import queues
from rag_studio.evals import eval_metrics, jobs
from rag_studio.evals.eval_files import EvalFileError, parse_eval_file
from rag_studio.gateway_client import openai_client
from rag_studio.models import (
    Chunk,
    DocumentStatus,
    EvalItem,
    EvalResult,
    EvalRun,
    EvalSet,
    EvalSetSource,
    JobStatus,
    KnowledgeBase,
    RagConfigVersion,
)
from rag_studio.rag import format_context
from rag_studio.services import _chat_deployment, pipeline_for

logger = logging.getLogger(__name__)
MAX_GENERATED_ITEMS = 200
GENERATE_PROMPT = (
    "Read the passage and write one question that it answers, and the answer, taken from the passage. "
    "Reply in JSON: {{\"question\": \"...\", \"answer\": \"...\"}}\n\nPassage:\n{passage}\n")
# The engine is held to this schema (a grammar in llama-server, guided decoding in vLLM), so even a tiny model's
# reply parses. The lengths keep a whole reply well within GENERATE_MAX_TOKENS (a reply cut short would not parse),
# and a short answer is what token F1 compares best.
MAX_QUESTION_CHARS, MAX_ANSWER_CHARS = 160, 120
GENERATE_MAX_TOKENS = 384
GENERATE_TIMEOUT_S = 600
QA_SCHEMA = {
    "type": "object",
    "properties": {"question": {"type": "string", "minLength": 5, "maxLength": MAX_QUESTION_CHARS},
                   "answer": {"type": "string", "minLength": 1, "maxLength": MAX_ANSWER_CHARS}},
    "required": ["question", "answer"],
    "additionalProperties": False,
}
FAITHFULNESS_PROMPT = (
    "Is every claim in the answer supported by the context? Rate from 1 (not supported) to 5 (fully supported). "
    "Reply with the number only.\n\nContext:\n{context}\n\nAnswer: {answer}\n\nRating:")
RELEVANCE_PROMPT = (
    "Does the answer address the question? Rate from 1 (not at all) to 5 (completely). Reply with the number "
    "only.\n\nQuestion: {question}\n\nAnswer: {answer}\n\nRating:")
RATING = re.compile(r"\b([1-5])\b")
METRIC_NAMES = ("hit@k", "recall@k", "mrr", "ndcg@k", "token_f1", "exact_match", "faithfulness", "relevance")


def upload_eval_set(*, actor: Actor, kb: KnowledgeBase, name: str, filename: str, content: bytes) -> EvalSet:
    require_role(actor=actor, workspace=kb.workspace, role=Role.DEVELOPER)
    try:
        drafts = parse_eval_file(content, filename)
    except EvalFileError as exc:
        raise ValidationFailed(f"{filename}: {exc}", fields={"file": [str(exc)]})
    with transaction.atomic():
        eval_set = EvalSet.objects.create(workspace=kb.workspace, knowledge_base=kb, name=name.strip() or filename,
                                          source=EvalSetSource.UPLOADED)
        EvalItem.objects.bulk_create([EvalItem(eval_set=eval_set, question=d.question,
                                               expected_answer=d.expected_answer,
                                               expected_sources=d.expected_sources, evidence=d.evidence)
                                      for d in drafts])
        record_audit(actor=actor, workspace=kb.workspace, action="rag.evalset.upload", target=eval_set,
                     detail={"items": len(drafts)})
    return eval_set


def delete_eval_set(*, actor: Actor, eval_set: EvalSet) -> None:
    """Delete an eval set with its items and its runs; the audit log keeps its name and size."""
    require_role(actor=actor, workspace=eval_set.workspace, role=Role.DEVELOPER)
    with transaction.atomic():
        record_audit(actor=actor, workspace=eval_set.workspace, action="rag.evalset.delete", target=eval_set,
                     detail={"name": eval_set.name, "items": eval_set.items.count(), "runs": eval_set.runs.count()})
        eval_set.delete()


def add_corrected_item(*, actor: Actor, kb: KnowledgeBase, eval_set: EvalSet | None, question: str,
                       expected_answer: str, expected_sources: list[str]) -> EvalItem:
    """One question with its corrected answer, into `eval_set` or, without one, the knowledge base's feedback
    set (made on first use): how a wrong answer seen in production becomes a test of the next config."""
    require_role(actor=actor, workspace=kb.workspace, role=Role.DEVELOPER)
    question, expected_answer = question.strip(), expected_answer.strip()
    if not question or not expected_answer:
        raise ValidationFailed("An eval item needs the question and the corrected answer.",
                               fields={"expected_answer": ["Write the answer the assistant should have given."]})
    if eval_set is not None and eval_set.knowledge_base_id != kb.pk:
        raise ValidationFailed(f"The eval set '{eval_set.name}' belongs to another knowledge base.")
    with transaction.atomic():
        if eval_set is None:
            eval_set, _ = EvalSet.objects.get_or_create(
                workspace=kb.workspace, knowledge_base=kb, source=EvalSetSource.FEEDBACK,
                defaults={"name": f"{kb.name}: corrected answers"})
        item = EvalItem.objects.create(eval_set=eval_set, question=question, expected_answer=expected_answer,
                                       expected_sources=expected_sources)
        record_audit(actor=actor, workspace=kb.workspace, action="rag.evalset.add_item", target=eval_set,
                     detail={"item": item.pk})
    return item


def start_generation(*, actor: Actor, kb: KnowledgeBase, name: str, generator: str, count: int) -> EvalSet:
    require_role(actor=actor, workspace=kb.workspace, role=Role.DEVELOPER)
    _chat_deployment(kb.workspace, generator, "generator")
    if not 1 <= count <= MAX_GENERATED_ITEMS:
        raise ValidationFailed(f"count must be between 1 and {MAX_GENERATED_ITEMS}.", fields={"count": ["range"]})
    if not Chunk.objects.filter(knowledge_base=kb, searchable=True,
                                document__status=DocumentStatus.INDEXED).exists():
        raise Conflict("The knowledge base has no indexed chunks to generate questions from.")
    queues.check_job_limit(kb.workspace_id)
    with transaction.atomic():
        eval_set = EvalSet.objects.create(
            workspace=kb.workspace, knowledge_base=kb, name=name.strip() or f"Generated from {kb.name}",
            source=EvalSetSource.GENERATED, status=JobStatus.QUEUED, generator=generator, requested_items=count)
        record_audit(actor=actor, workspace=kb.workspace, action="rag.evalset.generate", target=eval_set,
                     detail={"generator": generator, "count": count})
        transaction.on_commit(lambda: jobs.dispatch(EvalSet, jobs.GENERATE_TASK, eval_set.pk))
    return eval_set


def _sample_chunks(eval_set: EvalSet) -> list[Chunk]:
    """Chunks spread over the documents, the same ones for the same set (seeded by its id)."""
    chunks = list(Chunk.objects.filter(knowledge_base=eval_set.knowledge_base, searchable=True,
                                       document__status=DocumentStatus.INDEXED).select_related("document", "parent")
                  .order_by("pk"))
    random.Random(eval_set.pk).shuffle(chunks)
    by_document = defaultdict(list)
    for chunk in chunks:
        by_document[chunk.document_id].append(chunk)
    round_robin = [c for group in zip_longest(*by_document.values()) for c in group if c is not None]
    return round_robin[:eval_set.requested_items]


def parse_generated(text: str) -> tuple[str, str] | None:
    """(question, answer) from the generator's JSON reply, or None when it is not that (cut short, say)."""
    try:
        reply = json.loads(text or "")
    except ValueError:
        return None
    if not isinstance(reply, dict) or not all(isinstance(reply.get(key), str) for key in ("question", "answer")):
        return None
    question, answer = reply["question"].strip(), reply["answer"].strip()
    return (question, answer) if question and answer else None


def generate_items(eval_set_id: int, owner: str) -> str:
    """Ask the generator for one question and answer per sampled chunk, held to QA_SCHEMA. Returns the set's
    status. A set that ends with no items fails, saying why."""
    return jobs.run_held(EvalSet, eval_set_id, owner, lambda eval_set: _generate(eval_set, owner),
                         failure="Generation failed: ")


def _generate(eval_set: EvalSet, owner: str) -> dict:
    # A busy replica can take minutes over a reply of GENERATE_MAX_TOKENS; the task's own time limit bounds the set.
    client = openai_client(eval_set.workspace_id, timeout=GENERATE_TIMEOUT_S)
    done = set(eval_set.items.values_list("source_chunk_id", flat=True))
    chunks = _sample_chunks(eval_set)
    unparseable = 0
    for chunk in chunks:
        if chunk.pk in done:
            continue
        passage = (chunk.parent or chunk).text[:2000]
        reply = client.chat.completions.create(
            model=eval_set.generator, temperature=0.3, max_tokens=GENERATE_MAX_TOKENS,
            messages=[{"role": "user", "content": GENERATE_PROMPT.format(passage=passage)}],
            response_format={"type": "json_schema", "json_schema": {"name": "question_and_answer",
                                                                    "schema": QA_SCHEMA, "strict": True}})
        parsed = parse_generated(reply.choices[0].message.content or "")
        if parsed is None:
            unparseable += 1
            continue
        jobs.still_held(EvalSet, eval_set.pk, owner)
        EvalItem.objects.create(eval_set=eval_set, question=parsed[0], expected_answer=parsed[1],
                                expected_sources=[f"chunk:{chunk.pk}", chunk.document.filename],
                                source_chunk=chunk)
    note = f"{unparseable} of the generator's outputs could not be parsed and were skipped." if unparseable else ""
    if not eval_set.items.exists():
        return {"status": JobStatus.FAILED,
                "error": f"No question could be generated from the {len(chunks)} sampled passage(s). {note}".strip()}
    return {"status": JobStatus.DONE, "error": note}


def start_run(*, actor: Actor, eval_set: EvalSet, version: RagConfigVersion, judge: str = "",
              top_k: int = 5) -> EvalRun:
    require_role(actor=actor, workspace=eval_set.workspace, role=Role.DEVELOPER)
    if version.config.workspace_id != eval_set.workspace_id:
        raise ValidationFailed("The config and the eval set belong to different workspaces.")
    if judge:
        _chat_deployment(eval_set.workspace, judge, "judge")
    if not 1 <= top_k <= 50:
        raise ValidationFailed("top_k must be between 1 and 50.", fields={"top_k": ["range"]})
    if eval_set.status != JobStatus.DONE or not eval_set.items.exists():
        raise Conflict(f"Eval set '{eval_set.name}' has no items yet.")
    queues.check_job_limit(eval_set.workspace_id)
    with transaction.atomic():
        run = EvalRun.objects.create(eval_set=eval_set, config_version=version, judge=judge, top_k=top_k)
        record_audit(actor=actor, workspace=eval_set.workspace, action="rag.eval.run", target=run,
                     detail={"config": str(version), "set": eval_set.name, "judge": judge})
        transaction.on_commit(lambda: jobs.dispatch(EvalRun, jobs.RUN_TASK, run.pk))
    return run


def cancel_generation(*, actor: Actor, eval_set: EvalSet) -> EvalSet:
    """Stop generating questions: the set keeps those written so far, and leaves the line at once if queued."""
    require_role(actor=actor, workspace=eval_set.workspace, role=Role.DEVELOPER)
    if not jobs.cancel(EvalSet, jobs.GENERATE_TASK, eval_set.pk):
        raise Conflict(f"Eval set '{eval_set.name}' is {eval_set.status}; only one being generated can be "
                       f"cancelled.")
    record_audit(actor=actor, workspace=eval_set.workspace, action="rag.evalset.cancel", target=eval_set, detail={})
    eval_set.refresh_from_db()
    return eval_set


def cancel_run(*, actor: Actor, run: EvalRun) -> EvalRun:
    """Stop an eval run: the questions scored so far are kept, and a queued run leaves the line at once."""
    require_role(actor=actor, workspace=run.eval_set.workspace, role=Role.DEVELOPER)
    if not jobs.cancel(EvalRun, jobs.RUN_TASK, run.pk):
        raise Conflict(f"Eval run {run.pk} is {run.status}; only a queued or running run can be cancelled.")
    record_audit(actor=actor, workspace=run.eval_set.workspace, action="rag.eval.cancel", target=run, detail={})
    run.refresh_from_db()
    return run


def visible_hits(hits, item: EvalItem) -> list:
    """The hits a question is scored on: a held-out question's own chunks (`hidden_chunks`) left out."""
    hidden = set(item.hidden_chunks)
    return [hit for hit in hits if hit.chunk_id not in hidden] if hidden else list(hits)


def hit_keys(hits, relevant: set[str]) -> list[str]:
    """Each hit as the key it matches in the expected sources: its chunk, its parent chunk, or its document."""
    keys = []
    for hit in hits:
        candidates = [f"chunk:{hit.chunk_id}", f"chunk:{hit.parent_id}", hit.filename, str(hit.chunk_id)]
        keys.append(next((key for key in candidates if key in relevant), f"chunk:{hit.chunk_id}"))
    return keys


def evidence_chunks(item: EvalItem, kb: KnowledgeBase) -> list[str]:
    """The chunks holding the item's evidence words ("chunk:<id>"), within its expected documents when it names
    any; none without evidence."""
    if not item.evidence:
        return []
    # Any whitespace between the words: a PDF's text breaks lines where the writer's phrase has spaces.
    pattern = r"\s+".join(re.escape(word) for word in item.evidence.split())
    chunks = Chunk.objects.filter(knowledge_base=kb, text__iregex=pattern)
    files = [source for source in item.expected_sources if not source.startswith("chunk:")]
    if files:
        chunks = chunks.filter(document__filename__in=files)
    return [f"chunk:{pk}" for pk in chunks.order_by("pk").values_list("pk", flat=True)]


def score_retrieval(hits, expected_sources: list[str], k: int) -> dict:
    if not expected_sources:
        return {}
    relevant = set(expected_sources)
    # A generated item names both its chunk and its document; the chunk is the stricter target, so use it.
    chunk_sources = {s for s in relevant if s.startswith("chunk:")}
    relevant = chunk_sources or relevant
    keys = hit_keys(hits, relevant)
    return {"hit@k": eval_metrics.hit_at_k(keys, relevant, k), "recall@k": eval_metrics.recall_at_k(keys, relevant, k),
            "mrr": eval_metrics.reciprocal_rank(keys, relevant), "ndcg@k": eval_metrics.ndcg_at_k(keys, relevant, k)}


def _judge(client, judge: str, prompt: str) -> tuple[float | None, str]:
    reply = client.chat.completions.create(model=judge, temperature=0, max_tokens=4,
                                           messages=[{"role": "user", "content": prompt}])
    text = reply.choices[0].message.content or ""
    match = RATING.search(text)
    return (None if match is None else (int(match.group(1)) - 1) / 4), text


def _evaluate_item(run: EvalRun, pipeline, item: EvalItem, client) -> EvalResult:
    started = time.perf_counter()
    outcome = pipeline.run(item.question)
    metrics = score_retrieval(visible_hits(outcome.hits, item),
                              item.expected_sources + evidence_chunks(item, pipeline.kb), run.top_k)
    if item.expected_answer:
        metrics["token_f1"] = eval_metrics.token_f1(outcome.answer, item.expected_answer)
        metrics["exact_match"] = eval_metrics.exact_match(outcome.answer, item.expected_answer)
    judge_output = []
    if run.judge:
        for name, prompt in (("faithfulness", FAITHFULNESS_PROMPT.format(context=format_context(outcome.hits)[:4000],
                                                                         answer=outcome.answer)),
                             ("relevance", RELEVANCE_PROMPT.format(question=item.question, answer=outcome.answer))):
            score, raw = _judge(client, run.judge, prompt)
            judge_output.append(f"{name}: {raw!r}")
            if score is None:
                metrics[f"{name}_unparseable"] = 1
            else:
                metrics[name] = score
    return EvalResult(run=run, item=item, answer=outcome.answer, metrics=metrics,
                      judge_output="\n".join(judge_output),
                      retrieved=[{"chunk_id": h.chunk_id, "document": h.filename, "score": h.rerank or h.fused}
                                 for h in outcome.hits],
                      latency_ms=round((time.perf_counter() - started) * 1000, 1))


def execute_run(run_id: int, owner: str) -> str:
    """Evaluate every item not done yet, saving each result as it completes. Returns the run's status."""
    return jobs.run_held(EvalRun, run_id, owner, lambda run: _execute(run.pk, owner))


def _execute(run_id: int, owner: str) -> dict:
    run = EvalRun.objects.select_related("eval_set", "config_version").get(pk=run_id)
    _evaluate_items(run, owner)
    summary, unparseable = summarise(run)
    return {"status": JobStatus.DONE, "progress": 100, "metrics": summary, "judge_unparseable": unparseable}


def _evaluate_items(run: EvalRun, owner: str) -> None:
    pipeline = pipeline_for(run.config_version)
    client = openai_client(run.eval_set.workspace_id)
    items = list(run.eval_set.items.all())
    done = set(run.results.values_list("item_id", flat=True))
    for position, item in enumerate(items, start=1):
        if item.pk in done:
            continue
        try:
            result = _evaluate_item(run, pipeline, item, client)
        except SoftTimeLimitExceeded:
            raise
        except Exception as exc:  # one failing question is recorded and the run goes on
            logger.warning("Eval run %s item %s failed: %s", run.pk, item.pk, exc)
            result = EvalResult(run=run, item=item, error=str(exc)[:2000])
        jobs.still_held(EvalRun, run.pk, owner)
        try:
            with transaction.atomic():
                result.save()
        except IntegrityError:
            pass  # a worker that held the run before this one saved this item; its result stands
        EvalRun.objects.filter(pk=run.pk).update(progress=100 * position // len(items))


def summarise(run: EvalRun) -> tuple[dict, int]:
    """Means over the items that have each metric, with the count behind each, and the judge's unparseable
    outputs (counted, never folded into the means)."""
    results = list(run.results.all())
    summary = {}
    for name in METRIC_NAMES:
        values = [r.metrics[name] for r in results if name in r.metrics]
        if values:
            summary[name] = {"mean": round(sum(values) / len(values), 4), "n": len(values)}
    latencies = sorted(r.latency_ms for r in results if r.latency_ms is not None)
    if latencies:
        summary["latency_ms_p50"] = {"mean": latencies[len(latencies) // 2], "n": len(latencies)}
    summary["errors"] = {"mean": sum(1 for r in results if r.error), "n": len(results)}
    unparseable = sum(r.metrics.get("faithfulness_unparseable", 0) + r.metrics.get("relevance_unparseable", 0)
                      for r in results)
    return summary, unparseable
