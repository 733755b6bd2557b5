"""A default that adapts without an eval set (issue 34): held-out sentences of a knowledge base's own chunks, no
LLM, a short tuning job in the background, and its winner adopted only where it beats the fixed default on the
held-back half beyond noise; the knowledge base page shows what was measured."""

import random
import re
from collections import Counter

import pytest

from cluster import queues
from rag_studio import services
from rag_studio.evals import adaptive, jobs, tuning
from rag_studio.models import EvalItem, EvalSet, EvalSetSource, JobStatus
from rag_studio.pipeline import ingestion
from rag_studio.pipeline.ingestion import ingest
from rag_studio.search.retrieval import retrieve
from rag_studio.search.retrieval_config import is_default, validate_retrieval
from tests.rag_studio.conftest import sample

pytestmark = pytest.mark.usefixtures("shared_northwind")


def test_questions_are_held_out_sentences_answered_by_the_rest_of_their_document(indexed_kb):
    questions = adaptive.synthetic_questions(indexed_kb, count=20, seed=1)

    documents = Counter(indexed_kb.chunks.filter(searchable=True).values_list("document_id", flat=True))
    eligible = indexed_kb.chunks.filter(searchable=True, document_id__in=[d for d, n in documents.items() if n > 1])
    # Spread over the base: a chunk each first, then more rounds.
    assert len(questions) == 20 and len({item.chunk_id for item in questions}) >= min(20, eligible.count()) * 2 // 3
    for item in questions:
        source = indexed_kb.chunks.get(pk=item.chunk_id)
        assert item.question in " ".join(source.text.split())
        assert len(adaptive._words(item.question)) >= adaptive.MIN_WORDS
        document = set(indexed_kb.chunks.filter(document=source.document, searchable=True).values_list("pk", flat=True))
        holding = {chunk.pk for chunk in indexed_kb.chunks.filter(pk__in=document)
                   if item.question in " ".join(chunk.text.split())}
        # Answered by the rest of its document; every chunk holding the sentence itself is left out of the results.
        assert set(item.hidden) == holding | {item.chunk_id}
        assert set(item.relevant) == document - set(item.hidden) and item.relevant

    chinese = "反应釜压力超过零点六兆帕时，操作人员必须立即停止进料并通知当班班长。其余内容"
    assert adaptive.sentence_from(chinese, random.Random(0)) == chinese.split("。")[0] + "。"


def test_a_held_out_question_is_scored_on_the_hits_past_its_own_chunks(indexed_kb):
    question = adaptive.synthetic_questions(indexed_kb, count=1, seed=3)[0].question
    ranked = [hit.chunk_id for hit in retrieve(indexed_kb, question, {"mode": "keyword", "top_k": 10}).hits]
    settings = {"retrieval": validate_retrieval({"mode": "keyword", "top_k": 5}), "rewrite_model": ""}
    eval_set = EvalSet.objects.create(workspace=indexed_kb.workspace, knowledge_base=indexed_kb, name="held out")
    sixth = EvalItem.objects.create(eval_set=eval_set, question=question, expected_sources=[f"chunk:{ranked[5]}"])
    own = EvalItem.objects.create(eval_set=eval_set, question=question, expected_sources=[f"chunk:{ranked[0]}"])

    def hit(item: EvalItem) -> float:
        return tuning.measure(indexed_kb, settings, [(item, set(item.expected_sources))], 5)["hit@k"]

    assert (hit(sixth), hit(own)) == (0, 1)
    for item in (sixth, own):
        item.hidden_chunks = [ranked[0]]
    # Its own chunk never counts, and the search reaches one deeper, so the sixth hit is now in the top 5.
    assert (hit(sixth), hit(own)) == (1, 0)


def test_an_indexed_knowledge_base_is_measured_and_adopts_a_winner_only_where_it_beats_the_fixed_default(
        ann, client, indexed_kb, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=True):
        job = adaptive.consider(indexed_kb.pk)
    assert job is not None and job.automatic and job.status == JobStatus.QUEUED
    assert job.eval_set.source == EvalSetSource.GENERATED
    assert tuning.MIN_QUESTIONS <= job.eval_set.items.count() <= adaptive.QUESTIONS
    assert adaptive.consider(indexed_kb.pk) is None  # one at a time

    assert tuning.execute_tuning(job.pk, "worker@a/1/t1") == JobStatus.DONE
    outcome = adaptive.adopt(job.pk)

    job.refresh_from_db()
    indexed_kb.refresh_from_db()
    report, trials = job.report, {trial.number: trial for trial in job.trials.all()}
    assert trials[0].settings["retrieval"] == validate_retrieval({"top_k": 5})  # the fixed default, measured
    assert set(report["references"]) == {"dense", "keyword"}
    best, fixed = trials[report["best"]], trials[0]
    beats = (tuning.ranking(best.tuning_metrics, "hit@k") > tuning.ranking(fixed.tuning_metrics, "hit@k")
             and tuning.ranking(best.holdout_metrics, "hit@k") > tuning.ranking(fixed.holdout_metrics, "hit@k"))
    trusted = not report["noise"].get("within_noise")  # the held-back gain must be beyond noise
    assert outcome == ("adopted" if beats and trusted else "kept")
    assert ("Not adopted" in report["why"]) == (beats and not trusted)
    beats = beats and trusted
    if beats:
        assert indexed_kb.retrieval == best.settings["retrieval"]
    else:
        assert is_default(indexed_kb.retrieval)

    # The page's claim is the measured one: the fixed default's held-back hit@5 on this knowledge base.
    client.force_login(ann.user)
    page = client.get(f"/rag/kb/{indexed_kb.pk}/").content.decode()
    assert f'data-measured="{"adopted" if beats else "default"}"' in page
    assert f"{fixed.holdout_metrics['hit@k']:.3f}" in page
    assert adaptive.consider(indexed_kb.pk) is None  # nothing changed since


def test_settings_the_user_chose_are_never_adapted(ann, indexed_kb, django_capture_on_commit_callbacks):
    services.update_knowledge_base(actor=ann, kb=indexed_kb, retrieval={"mode": "dense"})
    assert adaptive.consider(indexed_kb.pk) is None

    services.update_knowledge_base(actor=ann, kb=indexed_kb, retrieval={})
    with django_capture_on_commit_callbacks(execute=True):
        job = adaptive.consider(indexed_kb.pk)
    assert tuning.execute_tuning(job.pk, "worker@a/1/t1") == JobStatus.DONE
    # The user set their own while it ran: the result leaves them alone.
    services.update_knowledge_base(actor=ann, kb=indexed_kb, retrieval={"mode": "keyword"})
    assert adaptive.adopt(job.pk) == "skipped"
    indexed_kb.refresh_from_db()
    assert indexed_kb.retrieval["mode"] == "keyword"


def test_the_last_document_to_finish_offers_the_adaptation_once(acme, ann, settings, monkeypatch):
    settings.RAG_INGEST_GROUP_DOCS, settings.RAG_ADAPTIVE_DEFAULTS = 1, True
    sent = []
    monkeypatch.setattr(ingestion.queues, "send",
                        lambda task, args, **options: sent.append((task, args, options["queue"])))
    kb = services.create_knowledge_base(actor=ann, workspace=acme, name="Offered")
    first, second = services.upload_documents(actor=ann, kb=kb, uploads=[
        sample("northwind-product-guide.docx"), sample("northwind-employee-handbook.pdf")])

    assert ingest(first.document.pk, "pytest") == "indexed"
    assert not [task for task, *_ in sent if task == jobs.ADAPT_TASK]  # the other document is still queued
    assert ingest(second.document.pk, "pytest") == "indexed"
    # Nobody waits for it: it goes to the main workers' queue, never the interactive one.
    assert [sent_ for sent_ in sent if re.search("adapt", sent_[0])] == [(jobs.ADAPT_TASK, [kb.pk], queues.DEFAULT)]


def test_an_automatic_job_stays_off_the_interactive_queue_and_gives_way_to_a_person_s_job(
        ann, indexed_kb, settings, monkeypatch, django_capture_on_commit_callbacks):
    sent = []
    monkeypatch.setattr(jobs.queues, "send", lambda task, args, **options: sent.append((task, options["queue"])))
    with django_capture_on_commit_callbacks(execute=True):
        automatic = adaptive.consider(indexed_kb.pk)
    assert sent == [(jobs.TUNE_TASK, queues.DEFAULT)]
    # It does not count against the workspace's limit of jobs, and a person's job on the same base replaces it.
    settings.WORKSPACE_MAX_JOBS = 1
    assert jobs.active_in(indexed_kb.workspace_id) == 0
    mine = tuning.start_tuning(actor=ann, kb=indexed_kb, eval_set=automatic.eval_set, config=None, trials=5)
    automatic.refresh_from_db()
    assert automatic.status == JobStatus.CANCELLED and mine.status == JobStatus.QUEUED and not mine.automatic
