"""Retrieval tuning: search a knowledge base's retrieval settings on one of its eval sets, and suggest the winner.

The eval set's usable questions (those whose expected chunks or documents are still in the knowledge base) are
split, with a fixed seed, into a tuning half and a held-back half. Trial 0 measures the settings in use; Optuna's
TPE sampler then proposes settings (mode, fusion with its normalisation and weights, RRF k, candidate depth,
per-document cap, and where the job names the models, rerank with its threshold and query rewriting; a trial draws
only the settings its mode uses), each ranked on the tuning half by the job's objective (hit@k first and MRR to
break ties by default) and measured on the held-back half for the report. A proposal of settings already measured
is answered with their result, never run again, so the trials are distinct. The best trial on the tuning half is
suggested only when it beats the settings in use on both halves: a setting that wins only on the questions it was
chosen on has learnt those questions, not the corpus; and the report says when the held-back gain is within noise
(a bootstrap of the held-back questions). An applied result can be rolled back, as a new version again.

The job runs as a lease-held Celery task (`jobs`). Every trial is saved as it finishes, so a cancelled or killed job
resumes with its trials: they are told to a fresh study before it proposes more. Trials never write to the
knowledge base or its index; only `apply_tuning` does, through the config or knowledge base's own versioned save.
The search never tunes `top_k`, which sets how much the answer model reads: a retrieval-only score would always
prefer more; the job's `top_k` is both the k of its metrics and the tuned settings' top_k.
"""

import json
import logging
import random
import time

import optuna
from django.db import IntegrityError, transaction
from optuna.distributions import CategoricalDistribution, FloatDistribution

from accounts.errors import Conflict, ValidationFailed
from accounts.models import Role
from accounts.services import Actor, record_audit, require_role
from cluster import queues
from rag_studio import selectors, services
from rag_studio.evals import eval_metrics, jobs
from rag_studio.evals.evaluation import evidence_chunks, hit_keys, visible_hits
from rag_studio.models import (
    Chunk,
    EvalItem,
    EvalSet,
    JobStatus,
    KnowledgeBase,
    RagConfig,
    RagTemplate,
    RetrievalTuning,
    TuningObjective,
    TuningTrial,
)
from rag_studio.rag import RagPipeline
from rag_studio.search.fusion import NORMALISATIONS
from rag_studio.search.retrieval import retrieve
from rag_studio.search.retrieval_config import validate_retrieval
from serving.metrics import percentile
from serving.models import RoleHint
from serving.selectors import models_visible_to

logger = logging.getLogger(__name__)
optuna.logging.set_verbosity(optuna.logging.WARNING)

MIN_QUESTIONS = 10
MIN_TRIALS, MAX_TRIALS = 5, 200
# Proposals the sampler may make per trial asked for, repeats included, before the search stops short.
PROPOSALS_PER_TRIAL = 10
ACTIVE = (JobStatus.QUEUED, JobStatus.RUNNING)


def _usable_items(eval_set: EvalSet, kb: KnowledgeBase) -> tuple[list[tuple[EvalItem, set[str]]], int]:
    """Each question with the keys a hit must match to count (its chunks still in the knowledge base and those
    holding its evidence words, else its documents), and how many were skipped because none of their expected
    sources is left."""
    items = list(eval_set.items.order_by("pk"))
    chunk_ids = {int(source[6:]) for item in items for source in item.expected_sources
                 if source.startswith("chunk:") and source[6:].isdigit()}
    live_chunks = {f"chunk:{pk}" for pk in Chunk.objects.filter(knowledge_base=kb, pk__in=chunk_ids)
                   .values_list("pk", flat=True)}
    live_files = set(kb.documents.values_list("filename", flat=True))
    usable, skipped = [], 0
    for item in items:
        relevant = {s for s in item.expected_sources if s in live_chunks} | set(evidence_chunks(item, kb)) or \
                   {s for s in item.expected_sources if s in live_files}
        if relevant:
            usable.append((item, relevant))
        elif item.expected_sources or item.evidence:
            skipped += 1
    return usable, skipped


def _split(usable: list, seed: int) -> tuple[list, list]:
    """The tuning half and the held-back half, the same for the same set and seed."""
    shuffled = list(usable)
    random.Random(seed).shuffle(shuffled)
    half = (len(shuffled) + 1) // 2
    return shuffled[:half], shuffled[half:]


def _too_few(eval_set: EvalSet, usable: int, skipped: int) -> str:
    return (f"Eval set '{eval_set.name}' has {usable} question(s) whose expected sources are in this knowledge "
            f"base; tuning needs at least {MIN_QUESTIONS} (half to tune on, half held back to check the winner)."
            + (f" {skipped} were skipped because their documents were deleted." if skipped else "")
            + " Add questions with expected sources, or generate a larger set.")


def _rerank_kind(workspace, name: str) -> str:
    """'cross_encoder' for a registered local cross-encoder, else 'llm' for a chat deployment (or a 4xx)."""
    if models_visible_to(workspace=workspace).filter(name=name, kind="hf").exclude(
            role_hint=RoleHint.EMBEDDING).exists():
        return "cross_encoder"
    services._chat_deployment(workspace, name, "rerank_model")
    return "llm"


def start_tuning(*, actor: Actor, kb: KnowledgeBase, eval_set: EvalSet, config: RagConfig | None = None,
                 trials: int = 30, top_k: int = 5, rerank_model: str = "", rewrite_model: str = "",
                 seed: int = 0, objective: str = TuningObjective.HIT_AT_K) -> RetrievalTuning:
    require_role(actor=actor, workspace=kb.workspace, role=Role.DEVELOPER)
    if objective not in TuningObjective.values:
        raise ValidationFailed(f"objective must be one of {', '.join(TuningObjective.values)}, not '{objective}'.",
                               fields={"objective": ["unknown"]})
    if eval_set.knowledge_base_id != kb.pk:
        raise ValidationFailed(f"Eval set '{eval_set.name}' belongs to another knowledge base.",
                               fields={"eval_set": ["another knowledge base"]})
    if config is not None and config.knowledge_base_id != kb.pk:
        raise ValidationFailed(f"RAG config '{config.name}' uses another knowledge base.",
                               fields={"config": ["another knowledge base"]})
    if eval_set.status != JobStatus.DONE:
        raise Conflict(f"Eval set '{eval_set.name}' is {eval_set.status}; tune on a finished set.")
    if not MIN_TRIALS <= trials <= MAX_TRIALS:
        raise ValidationFailed(f"trials must be between {MIN_TRIALS} and {MAX_TRIALS}, not {trials}.",
                               fields={"trials": ["range"]})
    if not 1 <= top_k <= 50:
        raise ValidationFailed(f"top_k must be between 1 and 50, not {top_k}.", fields={"top_k": ["range"]})
    if rerank_model:
        _rerank_kind(kb.workspace, rerank_model)
    if rewrite_model:
        services._chat_deployment(kb.workspace, rewrite_model, "rewrite_model")
    usable, skipped = _usable_items(eval_set, kb)
    if len(usable) < MIN_QUESTIONS:
        raise ValidationFailed(_too_few(eval_set, len(usable), skipped), fields={"eval_set": ["too few questions"]})
    queues.check_job_limit(kb.workspace_id)
    with transaction.atomic():
        KnowledgeBase.objects.select_for_update().filter(pk=kb.pk).first()  # one start at a time per base
        running = RetrievalTuning.objects.filter(knowledge_base=kb, status__in=ACTIVE).first()
        if running is not None and running.automatic:
            jobs.cancel(RetrievalTuning, jobs.TUNE_TASK, running.pk)  # a person's job comes before the platform's
        elif running is not None:
            raise Conflict(f"Tuning job {running.pk} is still {running.status} on '{kb.name}'; wait for it or "
                           f"cancel it first.")
        tuning = RetrievalTuning.objects.create(
            workspace=kb.workspace, knowledge_base=kb, eval_set=eval_set, config=config, trials_requested=trials,
            top_k=top_k, rerank_model=rerank_model, rewrite_model=rewrite_model, seed=seed, objective=objective)
        record_audit(actor=actor, workspace=kb.workspace, action="rag.tuning.start", target=tuning,
                     detail={"eval_set": eval_set.name, "config": config.name if config else "", "trials": trials,
                             "objective": objective})
        transaction.on_commit(lambda: jobs.dispatch(RetrievalTuning, jobs.TUNE_TASK, tuning.pk))
    return tuning


def cancel_tuning(*, actor: Actor, tuning: RetrievalTuning) -> RetrievalTuning:
    """Stop the job after the trial it is on; the trials so far are kept and it can be resumed."""
    require_role(actor=actor, workspace=tuning.workspace, role=Role.DEVELOPER)
    if not jobs.cancel(RetrievalTuning, jobs.TUNE_TASK, tuning.pk):
        raise Conflict(f"Tuning job {tuning.pk} is {tuning.status}; only a queued or running job can be cancelled.")
    record_audit(actor=actor, workspace=tuning.workspace, action="rag.tuning.cancel", target=tuning, detail={})
    tuning.refresh_from_db()
    return tuning


def resume_tuning(*, actor: Actor, tuning: RetrievalTuning) -> RetrievalTuning:
    """Queue a cancelled or failed job again: it keeps its trials and runs the rest."""
    require_role(actor=actor, workspace=tuning.workspace, role=Role.DEVELOPER)
    with transaction.atomic():
        KnowledgeBase.objects.select_for_update().filter(pk=tuning.knowledge_base_id).first()
        running = RetrievalTuning.objects.filter(knowledge_base_id=tuning.knowledge_base_id,
                                                 status__in=ACTIVE).exclude(pk=tuning.pk).first()
        if running is not None:
            raise Conflict(f"Tuning job {running.pk} is still {running.status} on this knowledge base.")
        if not RetrievalTuning.objects.filter(pk=tuning.pk, status__in=[JobStatus.CANCELLED, JobStatus.FAILED]) \
                .update(status=JobStatus.QUEUED, attempts=0, error="", finished_at=None):
            raise Conflict(f"Tuning job {tuning.pk} is {tuning.status}; only a cancelled or failed job resumes.")
        record_audit(actor=actor, workspace=tuning.workspace, action="rag.tuning.resume", target=tuning,
                     detail={"trials_kept": tuning.trials.count()})
        transaction.on_commit(lambda: jobs.dispatch(RetrievalTuning, jobs.TUNE_TASK, tuning.pk))
    tuning.refresh_from_db()
    return tuning


# ---- the search ----


def search_space(tuning: RetrievalTuning) -> dict:
    """Every setting the sampler may choose, with its range. A trial draws only those its other choices use
    (`propose`)."""
    space = {
        "mode": CategoricalDistribution(["dense", "keyword", "hybrid"]),
        "fusion": CategoricalDistribution(["weighted", "rrf"]),
        "normalisation": CategoricalDistribution(list(NORMALISATIONS)),
        "dense_weight": FloatDistribution(0.0, 1.0, step=0.1),
        "rrf_k": CategoricalDistribution([10, 30, 60, 100]),
        "candidates": CategoricalDistribution([10, 20, 30, 50, 100]),
        "max_per_document": CategoricalDistribution([0, 1, 2, 3]),
    }
    if tuning.rerank_model:
        space["rerank"] = CategoricalDistribution([False, True])
        space["rerank_threshold"] = CategoricalDistribution([0.0, 0.2, 0.4])
    if tuning.rewrite_model:
        space["rewrite"] = CategoricalDistribution([False, True])
    return space


def propose(trial: optuna.Trial, space: dict) -> dict:
    """The sampler's choices for one trial: fusion settings in hybrid mode only, and candidate depth only where it
    changes the hits. Dense and keyword search are exact, so one alone gives the same top k from any depth; fusion
    and reranking read past the top k."""

    def draw(name: str):
        distribution = space[name]
        if isinstance(distribution, FloatDistribution):
            return trial.suggest_float(name, distribution.low, distribution.high, step=distribution.step)
        return trial.suggest_categorical(name, distribution.choices)

    params = {"mode": draw("mode")}
    if params["mode"] == "hybrid":
        params["fusion"] = draw("fusion")
        if params["fusion"] == "weighted":
            params["normalisation"], params["dense_weight"] = draw("normalisation"), draw("dense_weight")
        else:
            params["rrf_k"] = draw("rrf_k")
    if "rerank" in space:
        params["rerank"] = draw("rerank")
        if params["rerank"]:
            params["rerank_threshold"] = draw("rerank_threshold")
    if params["mode"] == "hybrid" or params.get("rerank"):
        params["candidates"] = draw("candidates")
    params["max_per_document"] = draw("max_per_document")
    if "rewrite" in space:
        params["rewrite"] = draw("rewrite")
    return params


def baseline_settings(tuning: RetrievalTuning) -> dict:
    """The settings in use: the knowledge base's defaults under the config's overrides, and whether the config
    rewrites the question."""
    kb, config = tuning.knowledge_base, tuning.config
    # An automatic job (evals/adaptive.py) measures against the fixed default, whatever an earlier one adopted.
    in_use = {} if tuning.automatic else {**kb.retrieval, **(config.retrieval if config else {})}
    retrieval = validate_retrieval({**in_use, "top_k": tuning.top_k})
    rewrite = config is not None and config.template == RagTemplate.MULTI_QUERY
    return {"retrieval": retrieval, "rewrite_model": config.model if rewrite else ""}


def settings_for(params: dict, tuning: RetrievalTuning, baseline: dict, rerank_kind: str = "") -> dict:
    """The settings a trial's params make; `rerank_kind` is the rerank model's (_rerank_kind), read once a job."""
    chosen = {"mode": params["mode"], "max_per_document": params["max_per_document"], "top_k": tuning.top_k}
    if "candidates" in params:
        chosen["candidates"] = params["candidates"]
    if params["mode"] == "hybrid":
        chosen["fusion"] = params["fusion"]
        if params["fusion"] == "weighted":
            chosen["normalisation"] = params["normalisation"]
            chosen["dense_weight"] = round(params["dense_weight"], 1)
            chosen["keyword_weight"] = round(1 - params["dense_weight"], 1)
        else:
            chosen["rrf_k"] = params["rrf_k"]
    if params.get("rerank"):
        chosen["rerank"] = {"kind": rerank_kind, "model": tuning.rerank_model,
                            "top_k": tuning.top_k, "threshold": params["rerank_threshold"]}
    elif "rerank" in params:
        chosen["rerank"] = {"kind": "none", "model": "", "top_k": tuning.top_k, "threshold": 0.0}
    rewrite_model = baseline["rewrite_model"]
    if "rewrite" in params:
        rewrite_model = tuning.rewrite_model if params["rewrite"] else ""
    return {"retrieval": validate_retrieval({**baseline["retrieval"], **chosen}), "rewrite_model": rewrite_model}


def _deeper(retrieval: dict, extra: int) -> dict:
    """`retrieval` giving `extra` hits more (within the settings' limit of 50): a held-out question's hidden chunks
    are left out of its hits, and k must remain."""
    if not extra:
        return retrieval
    return {**retrieval, "top_k": min(50, retrieval["top_k"] + extra),
            "rerank": {**retrieval["rerank"], "top_k": min(50, retrieval["rerank"]["top_k"] + extra)}}


def _searcher(kb: KnowledgeBase, settings: dict):
    """(question, extra) -> hits under `settings`, `extra` hits deeper: retrieval, or a multi-query pipeline (built
    once for each depth) when it rewrites."""
    if settings["rewrite_model"]:
        pipelines = {}

        def rewritten(question: str, extra: int = 0):
            if extra not in pipelines:
                pipelines[extra] = RagPipeline(kb, {
                    "template": RagTemplate.MULTI_QUERY, "model": settings["rewrite_model"], "prompt": "",
                    "retrieval": _deeper(settings["retrieval"], extra), "generation": {}})
            return pipelines[extra].retrieve(question).hits

        return rewritten
    return lambda question, extra=0: retrieve(kb, question, _deeper(settings["retrieval"], extra)).hits


def measure(kb: KnowledgeBase, settings: dict, items: list[tuple[EvalItem, set[str]]], k: int) -> dict:
    """hit@k and MRR (within the top k) over `items`, each question's hit and reciprocal rank (the report's
    bootstrap reads them), and the p95 of query latency."""
    hits_found, reciprocal_ranks, latencies = [], [], []
    search = _searcher(kb, settings)
    for item, relevant in items:
        started = time.perf_counter()
        keys = hit_keys(visible_hits(search(item.question, len(item.hidden_chunks)), item), relevant)[:k]
        latencies.append((time.perf_counter() - started) * 1000)
        hits_found.append(eval_metrics.hit_at_k(keys, relevant, k))
        reciprocal_ranks.append(eval_metrics.reciprocal_rank(keys, relevant))
    hit, mrr = sum(hits_found) / len(items), sum(reciprocal_ranks) / len(items)
    return {"hit@k": round(hit, 4), "mrr": round(mrr, 4), "p95_ms": round(percentile(latencies, 95), 1),
            "n": len(items), "hits": [int(found) for found in hits_found],
            "ranks": [round(rank, 4) for rank in reciprocal_ranks]}


def ranking(metrics: dict, objective: str) -> tuple[float, float]:
    """(what the objective maximises, its tie-breaker)."""
    hit, mrr = metrics["hit@k"], metrics["mrr"]
    if objective == TuningObjective.MRR:
        return mrr, hit
    if objective == TuningObjective.MEAN:
        return round((hit + mrr) / 2, 4), hit
    return hit, mrr


def _sampler_value(metrics: dict, objective: str) -> float:
    """One number for the sampler: the tie-breaker weighs less than one question's worth of the objective."""
    first, second = ranking(metrics, objective)
    return first + second / (10 * (metrics["n"] + 1))


def execute_tuning(tuning_id: int, owner: str) -> str:
    """Run the trials not run yet, saving each as it finishes. Returns the job's status."""
    return jobs.run_held(RetrievalTuning, tuning_id, owner, lambda tuning: _tune(tuning.pk, owner),
                         failure="Tuning failed: ")


def _tune(tuning_id: int, owner: str) -> dict:
    tuning = RetrievalTuning.objects.select_related("knowledge_base", "eval_set", "config", "workspace") \
        .get(pk=tuning_id)
    kb, k = tuning.knowledge_base, tuning.top_k
    usable, skipped = _usable_items(tuning.eval_set, kb)
    if len(usable) < MIN_QUESTIONS:  # documents deleted since the job was queued
        return {"status": JobStatus.FAILED, "error": _too_few(tuning.eval_set, len(usable), skipped)}
    tune_half, held_back = _split(usable, tuning.seed)
    space, baseline = search_space(tuning), baseline_settings(tuning)
    rerank_kind = _rerank_kind(tuning.workspace, tuning.rerank_model) if tuning.rerank_model else ""
    objective = tuning.objective
    trials = {trial.number: trial for trial in tuning.trials.all()}
    measured = {_key(trial.settings): trial for trial in trials.values()}

    def record(number: int, params: dict, settings: dict) -> TuningTrial:
        tuning_metrics, holdout_metrics = measure(kb, settings, tune_half, k), measure(kb, settings, held_back, k)
        for metrics in (tuning_metrics, holdout_metrics):
            metrics["score"] = ranking(metrics, objective)[0]
        jobs.still_held(RetrievalTuning, tuning.pk, owner)  # cancelled meanwhile: stop, keeping what is saved
        trial = TuningTrial(tuning=tuning, number=number, params=params, settings=settings,
                            tuning_metrics=tuning_metrics, holdout_metrics=holdout_metrics)
        try:
            with transaction.atomic():
                trial.save()
        except IntegrityError:  # a worker that held the job before this one saved it; its trial stands
            trial = TuningTrial.objects.get(tuning=tuning, number=number)
        measured.setdefault(_key(trial.settings), trial)
        trials[trial.number] = trial
        RetrievalTuning.objects.filter(pk=tuning.pk).update(
            progress=100 * (len(trials) - 1) // (tuning.trials_requested + 1))
        return trial

    if 0 not in trials:
        _searcher(kb, baseline)(tune_half[0][0].question)  # loads the embedding model and the index: not trial 0's p95
        record(0, {}, baseline)
    study = optuna.create_study(direction="maximize", sampler=optuna.samplers.TPESampler(seed=tuning.seed))
    for number in sorted(trials):
        if number:
            params = trials[number].params
            study.add_trial(optuna.trial.create_trial(
                params=params, distributions={name: space[name] for name in params},
                value=_sampler_value(trials[number].tuning_metrics, objective)))
    # Dense and keyword search alone are always measured: the report compares the winner with both.
    for mode in ("dense", "keyword"):
        alone = {"mode": mode, "max_per_document": 0,
                 **{name: False for name in ("rerank", "rewrite") if name in space}}
        if _key(settings_for(alone, tuning, baseline, rerank_kind)) not in measured:
            study.enqueue_trial(alone)
    proposals = reused = 0
    guided, explore = study.sampler, optuna.samplers.RandomSampler(seed=tuning.seed)
    repeated = False
    # Each distinct setting is measured once: a proposal of one already measured (the baseline, an earlier trial)
    # is told its result and the next proposal drawn at random, since TPE tends to propose its best again; a small
    # space may run out of new settings first.
    while len(trials) - 1 < tuning.trials_requested and proposals < PROPOSALS_PER_TRIAL * tuning.trials_requested:
        study.sampler = explore if repeated else guided
        proposal = study.ask()
        params = propose(proposal, space)
        proposals += 1
        trial = measured.get(_key(settings_for(params, tuning, baseline, rerank_kind)))
        repeated = trial is not None
        if trial is None:
            trial = record(max(trials) + 1, params, settings_for(params, tuning, baseline, rerank_kind))
        else:
            reused += 1
        study.tell(proposal, _sampler_value(trial.tuning_metrics, objective))
    report = build_report(tuning, questions={"tuning": len(tune_half), "held_back": len(held_back),
                                             "skipped": skipped})
    report["proposals"] = {"asked": proposals, "already_measured": reused}
    return {"status": JobStatus.DONE, "progress": 100, "report": report}


def _key(settings: dict) -> str:
    return json.dumps(settings, sort_keys=True)


def _changes(settings: dict, baseline: dict) -> int:
    retrieval, before = settings["retrieval"], baseline["retrieval"]
    return sum(retrieval[key] != before[key] for key in retrieval) + (
        settings["rewrite_model"] != baseline["rewrite_model"])


def build_report(tuning: RetrievalTuning, *, questions: dict) -> dict:
    """The baseline, the best trial on the tuning half by the job's objective, whether it is suggested (and why),
    and whether its held-back gain is within noise."""
    trials = list(tuning.trials.all())
    baseline, objective = trials[0], tuning.objective
    # The settings in use stay best unless a trial ranks higher. Among equals, the one that changes the fewest
    # settings wins (what the objective cannot tell apart is better left as it was), then the faster, then the
    # earlier.
    best = max(trials, key=lambda t: (ranking(t.tuning_metrics, objective), -_changes(t.settings, baseline.settings),
                                      -t.tuning_metrics["p95_ms"], -t.number))
    tuned = _gain(best.tuning_metrics, baseline.tuning_metrics, objective)
    held = _gain(best.holdout_metrics, baseline.holdout_metrics, objective)
    noise = _noise(best.holdout_metrics, baseline.holdout_metrics, objective, tuning.seed)
    first = ranking(baseline.tuning_metrics, objective) >= ranking(best.tuning_metrics, objective)
    if best.number == 0 or first:
        reason, why = "no_gain", "No trial beat the settings in use on the tuning half; keep them."
    elif ranking(best.holdout_metrics, objective) <= ranking(baseline.holdout_metrics, objective):
        reason = "overfit"
        why = (f"Trial {best.number} beat the settings in use on the tuning half ({_words(tuned)}) but not on the "
               f"held-back half ({_words(held)}): it fits those questions, not the corpus. Keep the settings in use.")
    else:
        reason = "wins"
        why = (f"Trial {best.number} beats the settings in use on the tuning half ({_words(tuned)}) and on the "
               f"held-back half ({_words(held)}).")
        if noise.get("within_noise"):
            why += (f" The held-back gain is within noise: over its {noise['n']} questions (one is worth "
                    f"{noise['one_question']:.3f}), a bootstrap puts the {noise['metric']} gain between "
                    f"{noise['low']:+.3f} and {noise['high']:+.3f} in 90 of 100 resamples.")
    return {"questions": questions, "k": tuning.top_k, "objective": objective, "baseline": 0, "best": best.number,
            "suggested": reason == "wins", "reason": reason, "why": why, "noise": noise,
            "references": _references(trials),
            "gain": {"tuning": tuned["first"], "held_back": held["first"], "tuning_words": _words(tuned),
                     "held_back_words": _words(held)},
            "trials": len(trials) - 1}


def _references(trials: list[TuningTrial]) -> dict:
    """The trials of dense and keyword search alone (no cap, rerank or rewriting), by mode."""
    found = {}
    for trial in trials[1:]:
        retrieval = trial.settings["retrieval"]
        if retrieval["mode"] != "hybrid" and not retrieval["max_per_document"] and \
                retrieval["rerank"]["kind"] == "none" and not trial.settings["rewrite_model"]:
            found.setdefault(retrieval["mode"], trial.number)
    return found


_METRIC_NAMES = {TuningObjective.HIT_AT_K: ("hit@k", "MRR"), TuningObjective.MRR: ("MRR", "hit@k"),
                 TuningObjective.MEAN: ("(hit@k + MRR) / 2", "hit@k")}


def _gain(better: dict, worse: dict, objective: str) -> dict:
    (first, second), (first_before, second_before) = ranking(better, objective), ranking(worse, objective)
    names = _METRIC_NAMES[objective]
    return {"first": round(first - first_before, 4), "second": round(second - second_before, 4),
            "first_name": names[0], "second_name": names[1]}


def _words(gain: dict) -> str:
    text = f"{gain['first_name']} {gain['first']:+.3f}"
    return text + (f", {gain['second_name']} {gain['second']:+.3f}" if not gain["first"] else "")


BOOTSTRAP_SAMPLES = 2000


def _noise(best: dict, baseline: dict, objective: str, seed: int) -> dict:
    """A paired bootstrap of the held-back questions: the 90% interval of the gain in the metric that decided
    (the objective's, or its tie-breaker's where the objective tied). Within noise when it reaches 0."""
    if "hits" not in best or "hits" not in baseline or not best["hits"]:
        return {}  # trials measured before per-question results were kept
    per_question = {
        "hit@k": lambda m, i: m["hits"][i], "MRR": lambda m, i: m["ranks"][i],
        "(hit@k + MRR) / 2": lambda m, i: (m["hits"][i] + m["ranks"][i]) / 2}
    n = len(best["hits"])
    metric = next((name for name in _METRIC_NAMES[objective]
                   if any(per_question[name](best, i) != per_question[name](baseline, i) for i in range(n))),
                  _METRIC_NAMES[objective][0])
    differences = [per_question[metric](best, i) - per_question[metric](baseline, i) for i in range(n)]
    draw = random.Random(seed)
    means = sorted(sum(differences[draw.randrange(n)] for _ in range(n)) / n for _ in range(BOOTSTRAP_SAMPLES))
    low, high = means[int(0.05 * BOOTSTRAP_SAMPLES)], means[int(0.95 * BOOTSTRAP_SAMPLES) - 1]
    return {"metric": metric, "n": n, "one_question": round(1 / n, 4), "gain": round(sum(differences) / n, 4),
            "low": round(low, 4), "high": round(high, 4), "within_noise": low <= 0}


# ---- applying the winner ----


def apply_tuning(*, actor: Actor, tuning: RetrievalTuning, trial_number: int | None = None) -> str:
    """Save a trial's settings (the suggested one by default) as a new version of the config, or of the knowledge
    base's defaults when the job has no config: both are versioned in the asset registry, so it can be rolled
    back. Returns where it went."""
    require_role(actor=actor, workspace=tuning.workspace, role=Role.DEVELOPER)
    if tuning.status != JobStatus.DONE:
        raise Conflict(f"Tuning job {tuning.pk} is {tuning.status}; apply a finished job's result.")
    if trial_number is None:
        if not tuning.report.get("suggested"):
            raise Conflict(f"{tuning.report.get('why', '')} Name a trial to apply it anyway.".strip())
        trial_number = tuning.report["best"]
    trial = tuning.trials.filter(number=trial_number).first()
    if trial is None:
        raise ValidationFailed(f"Tuning job {tuning.pk} has no trial {trial_number}.", fields={"trial": ["unknown"]})
    retrieval, config = trial.settings["retrieval"], tuning.config
    with transaction.atomic():
        if config is not None:
            previous = {"version": config.version}
            template = config.template
            if "rewrite" in trial.params:
                template = RagTemplate.MULTI_QUERY if trial.settings["rewrite_model"] else (
                    RagTemplate.CITATIONS if template == RagTemplate.MULTI_QUERY else template)
            config = services.save_rag_config(
                actor=actor, workspace=config.workspace, config=config, name=config.name,
                knowledge_base=config.knowledge_base, template=template, model=config.model, prompt=config.prompt,
                retrieval=retrieval, generation=config.generation)
            applied = f"config '{config.name}' v{config.version}"
            record = {"target": "config", "version": config.version, "previous": previous}
        else:
            kb = tuning.knowledge_base
            previous = {"retrieval": kb.retrieval}
            services.update_knowledge_base(actor=actor, kb=kb, retrieval=retrieval)
            applied = f"knowledge base '{kb.name}' defaults"
            record = {"target": "knowledge_base", "previous": previous}
        RetrievalTuning.objects.filter(pk=tuning.pk).update(
            applied_to=f"trial {trial.number} → {applied}",
            applied={"trial": trial.number, **record, "rolled_back": False})
        record_audit(actor=actor, workspace=tuning.workspace, action="rag.tuning.apply", target=tuning,
                     detail={"trial": trial.number, "applied_to": applied, "retrieval": retrieval})
    tuning.refresh_from_db()
    return applied


def rollback_tuning(*, actor: Actor, tuning: RetrievalTuning) -> str:
    """Put back the settings the last apply replaced, as a new version (of the config, or of the knowledge base's
    defaults): the applied version stays in the history. Returns where it went."""
    require_role(actor=actor, workspace=tuning.workspace, role=Role.DEVELOPER)
    applied = tuning.applied or {}
    if not applied or applied.get("rolled_back"):
        raise Conflict(f"Tuning job {tuning.pk} has no applied result to roll back.")
    with transaction.atomic():
        if applied["target"] == "config":
            config = tuning.config
            if config is None:
                raise Conflict("The RAG config this job was applied to was deleted.")
            before = selectors.config_version(config, applied["previous"]["version"]).settings
            config = services.save_rag_config(
                actor=actor, workspace=config.workspace, config=config, name=config.name,
                knowledge_base=config.knowledge_base, template=before["template"], model=before["model"],
                prompt=before["prompt"], retrieval=before["retrieval"], generation=before["generation"])
            restored = f"config '{config.name}' v{config.version} (as v{applied['previous']['version']})"
        else:
            kb = tuning.knowledge_base
            services.update_knowledge_base(actor=actor, kb=kb, retrieval=applied["previous"]["retrieval"])
            restored = f"knowledge base '{kb.name}' defaults (as before trial {applied['trial']})"
        RetrievalTuning.objects.filter(pk=tuning.pk).update(
            applied_to=f"rolled back → {restored}"[:96], applied={**applied, "rolled_back": True})
        record_audit(actor=actor, workspace=tuning.workspace, action="rag.tuning.rollback", target=tuning,
                     detail={"trial": applied["trial"], "restored": restored})
    tuning.refresh_from_db()
    return restored

