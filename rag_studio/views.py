import json

from asgiref.sync import sync_to_async
from django.contrib import messages
from django.http import JsonResponse, StreamingHttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils import translation
from django.utils.translation import gettext as _
from django.views.decorators.http import require_POST

from accounts.errors import ApplicationError, NotFound, ValidationFailed, error_body
from accounts.gui import gui_actor, has_role, workspace_page
from accounts.models import Role
from assets.views import bundle_download
from cluster import queues
from rag_studio import embedding_choice, selectors, services
from rag_studio.bundles import export_config_bundle
from rag_studio.evals import adaptive, evaluation, jobs, tuning
from rag_studio.evals.evaluation import METRIC_NAMES
from rag_studio.models import (
    EmbeddingModelSource,
    EvalRun,
    EvalSet,
    JobStatus,
    RagTemplate,
    RetrievalTuning,
    TuningObjective,
)
from rag_studio.pipeline.chunking import CHUNK_MODES
from rag_studio.pipeline.ocr import validate_ocr
from rag_studio.pipeline.screening import ACTIONS, CATEGORIES
from rag_studio.rag import DEFAULT_PROMPTS
from rag_studio.search.fusion import NORMALISATIONS
from rag_studio.search.retrieval import retrieve
from rag_studio.search.retrieval_config import (
    FUSION_METHODS,
    RERANK_KINDS,
    RETRIEVAL_MODES,
    is_default,
)
from serving.models import RoleHint
from serving.preset_names import MULTILINGUAL_E5
from serving.selectors import chat_models, models_visible_to


def _kb(request, kb_id):
    return selectors.scoped(selectors.knowledge_bases(workspace=request.workspace), kb_id, "Knowledge base")


def _config(request, config_id):
    return selectors.scoped(selectors.rag_configs(workspace=request.workspace), config_id, "RAG config")


def _chat_deployments(workspace):
    return chat_models(workspace=workspace)


def _embedding_models(workspace):
    return models_visible_to(workspace=workspace).filter(role_hint=RoleHint.EMBEDDING)


def _int(value: str, field: str) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        raise ValidationFailed(f"{field} must be a whole number, not '{value}'.")


def _float(value: str, field: str) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        raise ValidationFailed(f"{field} must be a number, not '{value}'.")


def _chunking_from(post) -> dict:
    """The chunking form sends every mode's fields; validation keeps only the chosen mode's."""
    config = {"mode": post.get("chunk_mode", "recursive")}
    for field in ("chunk_size", "chunk_overlap", "parent_size", "child_size", "child_overlap"):
        if post.get(field):
            config[field] = _int(post[field], field.replace("_", " "))
    if post.get("delimiter"):
        try:
            config["delimiter"] = post["delimiter"].encode().decode("unicode_escape")
        except UnicodeDecodeError as exc:  # a broken escape such as a lone \x
            raise ValidationFailed(f"The delimiter '{post['delimiter']}' has a broken escape ({exc.reason}); write "
                                   f"\\n for a new line, \\t for a tab, \\\\ for a backslash.")
    return config


def _retrieval_from(post) -> dict:
    config = {"mode": post.get("mode", "hybrid"), "fusion": post.get("fusion", "weighted")}
    if post.get("normalisation"):
        config["normalisation"] = post["normalisation"]
    for field in ("top_k", "candidates", "rrf_k", "max_per_document"):
        if post.get(field):
            config[field] = _int(post[field], field)
    for field in ("dense_weight", "keyword_weight", "score_threshold"):
        if post.get(field):
            config[field] = _float(post[field], field)
    kind = post.get("rerank_kind", "none")
    config["rerank"] = {"kind": kind, "model": post.get("rerank_model", "") if kind != "none" else ""}
    if post.get("rerank_top_k"):
        config["rerank"]["top_k"] = _int(post["rerank_top_k"], "rerank top_k")
    if post.get("rerank_threshold"):
        config["rerank"]["threshold"] = _float(post["rerank_threshold"], "rerank threshold")
    return config


def _form_choices(workspace) -> dict:
    return {
        "chunk_modes": CHUNK_MODES, "retrieval_modes": RETRIEVAL_MODES, "fusion_methods": FUSION_METHODS,
        "normalisations": NORMALISATIONS,
        "rerank_kinds": RERANK_KINDS, "screening_categories": CATEGORIES, "screening_actions": ACTIONS,
        "embedding_models": _embedding_models(workspace),
        "embedding_deployments": selectors.ready_embedding_deployments(workspace),
        "chat_deployments": _chat_deployments(workspace),
        "cross_encoders": models_visible_to(workspace=workspace).exclude(role_hint=RoleHint.EMBEDDING)
        .filter(kind="hf"),
    }


@workspace_page
def rag_home(request):
    if request.method == "POST":
        kb = services.create_knowledge_base(
            actor=gui_actor(request), workspace=request.workspace, name=request.POST.get("name", ""),
            description=request.POST.get("description", ""),
            embedding_model=request.POST.get("embedding_model", ""),
            chunking=_chunking_from(request.POST))
        messages.success(request, _("Created knowledge base '%(name)s'. Upload documents to it below.")
                         % {"name": kb.name})
        return redirect("rag-kb", kb_id=kb.pk)
    return render(request, "rag/home.html", {
        # In the Chinese GUI the form offers the multilingual embedding preset first.
        "suggested_embedding": MULTILINGUAL_E5 if translation.get_language() == "zh-hans" else "",
        "knowledge_bases": selectors.knowledge_bases(workspace=request.workspace),
        "configs": selectors.rag_configs(workspace=request.workspace),
        **_form_choices(request.workspace),
    })


@workspace_page
def kb_page(request, kb_id):
    kb = _kb(request, kb_id)
    return render(request, "rag/kb.html", {
        "kb": kb, "documents": selectors.document_progress(kb=kb), "needs_reindex": selectors.needs_reindex(kb),
        "index_search": selectors.index_search(kb),
        "policy": [(category, kb.screening.get(category)) for category in CATEGORIES],
        "ocr": validate_ocr(kb.ocr),
        "chinese_suggestion": _chinese_suggestion(kb),
        "embedding_choice": _embedding_choice(kb),
        "tuned": selectors.tuned_settings_in_use(kb),
        "measured": adaptive.measured_default(kb),
        "automatic_defaults": is_default(kb.retrieval),
        "keyword_terms": "\n".join(kb.keyword_terms),
        **_form_choices(request.workspace),
    })


def _chinese_suggestion(kb) -> bool:
    """For Chinese or mixed text embedded by an English-only model, where the multilingual preset is registered:
    its vectors tell Chinese passages apart (bench.rag_quality: dense hit@5 0.357 on MiniLM, 1.000 on e5)."""
    return embedding_choice.embedding_fit(kb).suggested == MULTILINGUAL_E5


def _embedding_choice(kb) -> dict:
    """What the page says about an embedding model the user did not choose (embedding_choice)."""
    evidence = kb.embedding_model_evidence or {}
    if kb.embedding_model_source == EmbeddingModelSource.PENDING:
        state = "pending"
    elif kb.embedding_model_source != EmbeddingModelSource.DETECTED:
        return {}
    elif evidence.get("model") != kb.embedding_model.name:
        state = "switched"
    else:
        state = "unavailable" if evidence.get("unavailable") else "kept"
    return {"state": state, "share": f"{evidence.get('chinese_share', 0):.0%}", "default": evidence.get("model", "")}


@workspace_page
def kb_progress(request, kb_id):
    kb = _kb(request, kb_id)
    return JsonResponse({"documents": selectors.document_progress(kb=kb), "building": bool(kb.building_key),
                         "index_key": kb.index_key})


@workspace_page
@require_POST
def kb_upload(request, kb_id):
    """The drag-and-drop zone posts here with fetch and gets each file's outcome back."""
    kb = _kb(request, kb_id)
    try:
        outcomes = services.upload_documents(actor=gui_actor(request), kb=kb,
                                             uploads=request.FILES.getlist("files"))
    except ApplicationError as exc:
        return JsonResponse(error_body(exc.code, exc.message), status=exc.status)
    return JsonResponse({"outcomes": [
        {"filename": o.filename, "status": o.status, "error": o.document.error if o.document else "",
         "duplicate_of": o.duplicate_of.filename if o.duplicate_of else None} for o in outcomes]})


@workspace_page
@require_POST
def kb_settings(request, kb_id):
    kb = _kb(request, kb_id)
    post = request.POST
    if post.get("action") == "reindex":
        key = services.start_reindex(actor=gui_actor(request), kb=kb)
        messages.success(request, _("Re-indexing into %(index)s; searches use the current index until it is done.")
                         % {"index": key})
        return redirect("rag-kb", kb_id=kb.pk)
    if post.get("action") == "multilingual_embedding":
        services.update_knowledge_base(actor=gui_actor(request), kb=kb, embedding_model=MULTILINGUAL_E5, reindex=True)
        messages.success(request, _("Re-indexing with %(model)s, which reads Chinese; searches use the current index "
                                    "until it is done.") % {"model": MULTILINGUAL_E5})
        return redirect("rag-kb", kb_id=kb.pk)
    if post.get("action") == "delete":
        services.delete_knowledge_base(actor=gui_actor(request), kb=kb)
        messages.success(request, _("Deleted knowledge base '%(name)s'.") % {"name": kb.name})
        return redirect("rag")
    stale = services.update_knowledge_base(
        actor=gui_actor(request), kb=kb, reindex=post.get("reindex") == "on",
        name=post.get("name", kb.name), description=post.get("description", ""),
        embedding_model=post.get("embedding_model", ""), embedding_deployment=post.get("embedding_deployment", ""),
        chunking=_chunking_from(post), retrieval=_retrieval_from(post),
        keyword_terms=post["keyword_terms"].splitlines() if "keyword_terms" in post else None,
        ocr={"mode": post["ocr_mode"], "languages": post.get("ocr_languages", "auto")} if "ocr_mode" in post else None,
        screening={category: post.get(f"screen_{category}", "flag") for category in CATEGORIES})
    if stale and post.get("reindex") != "on":
        messages.info(request, _("Saved. The index was built with other settings: re-index to apply them."))
    else:
        messages.success(request, _("Saved. Re-indexing in the background.") if stale else _("Saved."))
    return redirect("rag-kb", kb_id=kb.pk)


@workspace_page
def hit_test(request, kb_id):
    """Hits for a query with every score; with ?tuning=&trial=, beside the hits of that tuning trial's settings."""
    kb = _kb(request, kb_id)
    result, compared, query = None, None, request.GET.get("query", "")
    settings = {**kb.retrieval}
    candidate = _candidate(request, kb) if request.GET.get("tuning") else None
    if query:
        overrides = _retrieval_from(request.GET)
        result = retrieve(kb, query, overrides)
        settings = result.settings
        if candidate is not None:
            compared = retrieve(kb, query, candidate["retrieval"])
            _cross_ranks(result.hits, compared.hits)
        _flag_low_confidence_ocr([*result.hits, *(compared.hits if compared else [])])
    return render(request, "rag/hit_test.html", {
        "kb": kb, "query": query, "result": result, "compared": compared, "candidate": candidate,
        "result_summary": retrieval_summary({"retrieval": settings}) if result else "", "settings": settings,
        **_form_choices(request.workspace)})


def _candidate(request, kb) -> dict:
    """A tuning trial's settings, to compare with: a 404 unless the trial is one of this knowledge base's."""
    job = selectors.scoped(selectors.tunings(workspace=request.workspace).filter(knowledge_base=kb),
                           request.GET["tuning"], "Tuning job")
    trial = job.trials.filter(number=_int(request.GET.get("trial"), "trial")).first()
    if trial is None:
        raise NotFound(f"Tuning job {job.pk} has no trial {request.GET.get('trial')}.")
    return {"tuning": job.pk, "trial": trial.number, "retrieval": trial.settings["retrieval"],
            "label": _("Trial %(trial)s of tuning job #%(job)s") % {"trial": trial.number, "job": job.pk},
            "summary": retrieval_summary(trial.settings)}


def _cross_ranks(left, right) -> None:
    """Each hit's rank in the other list (None when only one list has it), to show why one setting wins."""
    ranks = [{hit.chunk_id: hit.rank for hit in hits} for hits in (left, right)]
    for hits, other in ((left, ranks[1]), (right, ranks[0])):
        for hit in hits:
            hit.other_rank = other.get(hit.chunk_id)


def _flag_low_confidence_ocr(hits) -> None:
    """Hits from a page OCR read with low confidence say so ("low-confidence OCR, page 12")."""
    unsure = selectors.low_confidence_ocr(pages={(hit.document_id, hit.page) for hit in hits})
    for hit in hits:
        hit.low_confidence_ocr = (hit.document_id, hit.page) in unsure


def _document(request, document_id):
    return selectors.scoped(selectors.documents(workspace=request.workspace), document_id, "Document")


@workspace_page
def document_page(request, document_id):
    document = _document(request, document_id)
    ocr_pages = list(selectors.ocr_pages(document=document))
    return render(request, "rag/document.html", {
        "document": document, "findings": document.findings.all(), "events": document.events.all(),
        "ocr_pages": ocr_pages, "unsure_pages": [page.page for page in ocr_pages if page.low_confidence],
        "chunks": document.chunks.select_related("parent")[:200]})


@workspace_page
@require_POST
def document_action(request, document_id):
    document = _document(request, document_id)
    kb_id = document.knowledge_base_id
    if request.POST.get("action") == "delete":
        services.delete_document(actor=gui_actor(request), document=document)
        messages.success(request, _("Deleted '%(name)s' and its chunks from the index.") % {"name": document.filename})
    elif request.POST.get("action") == "retry":
        services.retry_document(actor=gui_actor(request), document=document)
        messages.success(request, _("Queued '%(name)s' again.") % {"name": document.filename})
    elif request.POST.get("action") == "cancel":
        services.cancel_document(actor=gui_actor(request), document=document)
        messages.success(request, _("Cancelled '%(name)s'; retry it to go on from where it stopped.")
                         % {"name": document.filename})
    return redirect("rag-kb", kb_id=kb_id)


@workspace_page
def config_edit(request, config_id=None):
    config = _config(request, config_id) if config_id else None
    if request.method == "POST":
        post = request.POST
        kb = _kb(request, post.get("knowledge_base"))
        retrieval = _retrieval_from(post) if post.get("override_retrieval") == "on" else {}
        config = services.save_rag_config(
            actor=gui_actor(request), workspace=request.workspace, config=config, name=post.get("name", ""),
            knowledge_base=kb, template=post.get("template", ""), model=post.get("model", ""),
            prompt=post.get("prompt", "").strip(), retrieval=retrieval,
            generation={"temperature": post.get("temperature") or 0.2,
                        "max_tokens": post.get("max_tokens") or 256})
        messages.success(request, _("Saved '%(name)s' (version %(version)s).") % {"name": config.name,
                                                                                 "version": config.version})
        return redirect("rag-config", config_id=config.pk)
    kbs = selectors.knowledge_bases(workspace=request.workspace)
    selected_kb = config.knowledge_base if config else kbs.first()
    return render(request, "rag/config.html", {
        "config": config, "knowledge_bases": kbs, "templates": RagTemplate.choices,
        "versions": config.versions.all() if config else [],
        "settings": {**(selected_kb.retrieval if selected_kb else {}), **(config.retrieval if config else {})},
        "default_prompts": DEFAULT_PROMPTS, "can_export": has_role(request, Role.DEVELOPER),
        **_form_choices(request.workspace)})


@workspace_page
def config_export(request, config_id):
    version = request.GET.get("version")
    exported = export_config_bundle(actor=gui_actor(request), config=_config(request, config_id),
                                    version_number=_int(version, "version") if version else None,
                                    include_indexes=request.GET.get("include_indexes") == "on")
    return bundle_download(exported.path, exported.filename)


@workspace_page
def config_chat(request, config_id):
    return redirect(reverse("rag-config", kwargs={"config_id": config_id}) + "#chat")


def _sse(event: str, data) -> str:
    return f"event: {event}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n"


def _pipeline_for_request(workspace, config_id):
    config = selectors.scoped(selectors.rag_configs(workspace=workspace), config_id, "RAG config")
    return services.pipeline_for(selectors.config_version(config))


async def config_chat_stream(request, config_id):
    """The studio chat: server-sent events `hits` (the cited chunks), `token`… and `done` (citations, usage)."""
    user = await request.auser()
    if not user.is_authenticated or request.workspace is None:
        return JsonResponse(error_body("unauthenticated", "Sign in to chat."), status=401)
    try:
        body = json.loads(request.body or b"{}")
        if not isinstance(body, dict):
            raise ValidationFailed("The body must be a JSON object: {\"query\", \"history\"?}.")
        if not isinstance(body.get("history") or [], list):
            raise ValidationFailed("'history' must be a list of {role, content} turns.")
        question = str(body.get("query", "")).strip()
        history = [t for t in body.get("history") or [] if isinstance(t, dict) and t.get("role") in
                   ("user", "assistant")]
        if not question:
            raise ValidationFailed("Type a question first.")
        pipeline = await sync_to_async(_pipeline_for_request)(request.workspace, config_id)
    except ValueError:  # not JSON, or an integer past Python's 4,300 digits
        return JsonResponse(error_body("invalid", "The body must be JSON."), status=400)
    except ApplicationError as exc:
        return JsonResponse(error_body(exc.code, exc.message), status=exc.status)

    async def events():
        try:
            async for kind, value in pipeline.astream(question, history):
                if kind == "hits":
                    yield _sse("hits", {"queries": value.queries, "hits": [
                        {"n": n, **hit.as_dict()} for n, hit in enumerate(value.hits, start=1)]})
                elif kind == "token":
                    yield _sse("token", {"text": value})
                else:
                    yield _sse("done", {"answer": value.answer, "citations": value.citations(),
                                        "usage": value.usage, "timings_ms": value.timings_ms})
        except ApplicationError as exc:
            yield _sse("error", {"message": exc.message})
        except Exception as exc:  # the stream has started: report in-band rather than cut the connection
            yield _sse("error", {"message": f"The answer failed: {exc}"})

    response = StreamingHttpResponse(events(), content_type="text/event-stream")
    response["Cache-Control"] = "no-cache"
    return response


@workspace_page
def evals_page(request):
    workspace, actor, post = request.workspace, gui_actor(request), request.POST
    if request.method == "POST":
        action = post.get("action")
        if action == "upload":
            kb = _kb(request, post.get("knowledge_base"))
            upload = request.FILES.get("file")
            if upload is None:
                raise ValidationFailed("Choose a CSV or JSONL file to upload.")
            eval_set = evaluation.upload_eval_set(actor=actor, kb=kb, name=post.get("name", ""),
                                                  filename=upload.name, content=upload.read())
            messages.success(request, _("Uploaded '%(name)s' with %(count)s questions.")
                             % {"name": eval_set.name, "count": eval_set.items.count()})
        elif action == "generate":
            kb = _kb(request, post.get("knowledge_base"))
            eval_set = evaluation.start_generation(actor=actor, kb=kb, name=post.get("name", ""),
                                                   generator=post.get("generator", ""),
                                                   count=_int(post.get("count", "10"), "count"))
            messages.success(request, _("Generating '%(name)s' in the background.") % {"name": eval_set.name})
        elif action == "run":
            eval_set = selectors.scoped(selectors.eval_sets(workspace=workspace), post.get("eval_set"), "Eval set")
            config = _config(request, post.get("config"))
            run = evaluation.start_run(actor=actor, eval_set=eval_set, version=selectors.config_version(config),
                                       judge=post.get("judge", ""), top_k=_int(post.get("top_k", "5"), "top_k"))
            messages.success(request, _("Eval run #%(id)s started.") % {"id": run.pk})
            return redirect(f"{reverse('rag-evals')}?set={eval_set.pk}")
        elif action == "cancel_set":
            eval_set = selectors.scoped(selectors.eval_sets(workspace=workspace), post.get("id"), "Eval set")
            evaluation.cancel_generation(actor=actor, eval_set=eval_set)
            messages.success(request, _("Cancelled; the questions written so far are kept."))
        elif action == "cancel_run":
            run = selectors.scoped(selectors.eval_runs(workspace=workspace), post.get("id"), "Eval run")
            evaluation.cancel_run(actor=actor, run=run)
            messages.success(request, _("Cancelled; the questions scored so far are kept."))
        elif action == "tune":
            eval_set = selectors.scoped(selectors.eval_sets(workspace=workspace), post.get("eval_set"), "Eval set")
            job = tuning.start_tuning(
                actor=actor, kb=eval_set.knowledge_base, eval_set=eval_set,
                config=_config(request, post["config"]) if post.get("config") else None,
                trials=_int(post.get("trials", "30"), "trials"), top_k=_int(post.get("top_k", "5"), "top_k"),
                rerank_model=post.get("rerank_model", ""), rewrite_model=post.get("rewrite_model", ""),
                objective=post.get("objective") or TuningObjective.HIT_AT_K)
            messages.success(request, _("Tuning job #%(id)s started.") % {"id": job.pk})
            return redirect("rag-tuning", tuning_id=job.pk)
        return redirect("rag-evals")
    eval_sets = selectors.eval_sets(workspace=workspace)
    runs = selectors.eval_runs(workspace=workspace)
    if request.GET.get("set"):
        runs = runs.filter(eval_set_id=_int(request.GET["set"], "set"))
    runs = list(runs[:50])
    eval_sets = list(eval_sets)
    line = queues.interactive_line()
    for run in runs:
        run.metric_values = [(name, run.metrics.get(name, {}).get("mean")) for name in METRIC_NAMES]
        run.place = _place_dict(jobs.place(line, EvalRun, jobs.RUN_TASK, run))
    for eval_set in eval_sets:
        eval_set.place = _place_dict(jobs.place(line, EvalSet, jobs.GENERATE_TASK, eval_set))
    busy = any(s.status in (JobStatus.QUEUED, JobStatus.RUNNING) for s in eval_sets) or any(
        r.status in (JobStatus.QUEUED, JobStatus.RUNNING) for r in runs)
    return render(request, "rag/evals.html", {
        "eval_sets": eval_sets, "runs": runs, "metric_names": METRIC_NAMES, "busy": busy,
        "knowledge_bases": selectors.knowledge_bases(workspace=workspace),
        "configs": selectors.rag_configs(workspace=workspace), "chat_deployments": _chat_deployments(workspace),
        "tunings": selectors.tunings(workspace=workspace)[:20], "tuning_objectives": TuningObjective.choices,
        "cross_encoders": _form_choices(workspace)["cross_encoders"],
        "chart": [{"label": f"#{r.pk} {r.config_version}", "metrics": dict(r.metric_values)} for r in runs
                  if r.status == JobStatus.DONE][:6],
        "selected_set": request.GET.get("set", "")})


@workspace_page
def eval_run_page(request, run_id):
    run = selectors.scoped(selectors.eval_runs(workspace=request.workspace), run_id, "Eval run")
    if request.method == "POST" and request.POST.get("action") == "cancel_run":
        evaluation.cancel_run(actor=gui_actor(request), run=run)
        messages.success(request, _("Cancelled; the questions scored so far are kept."))
        return redirect("rag-eval-run", run_id=run.pk)
    return render(request, "rag/eval_run.html", {
        "run": run, "results": run.results.select_related("item"), "metric_names": METRIC_NAMES,
        "place": _place_dict(jobs.place(queues.interactive_line(), EvalRun, jobs.RUN_TASK, run))})


def _place_dict(place) -> dict | None:
    return place.as_dict() if place else None


@workspace_page
def tuning_page(request, tuning_id):
    job = selectors.scoped(selectors.tunings(workspace=request.workspace), tuning_id, "Tuning job")
    if request.method == "POST":
        actor, action = gui_actor(request), request.POST.get("action")
        if action == "cancel":
            tuning.cancel_tuning(actor=actor, tuning=job)
            messages.success(request, _("Cancelled; the trials so far are kept. Resume it to run the rest."))
        elif action == "resume":
            tuning.resume_tuning(actor=actor, tuning=job)
            messages.success(request, _("Resumed: it keeps its trials and runs the rest."))
        elif action == "apply":
            trial = request.POST.get("trial")
            applied = tuning.apply_tuning(actor=actor, tuning=job,
                                          trial_number=_int(trial, "trial") if trial else None)
            messages.success(request, _("Applied: saved as a new version of %(target)s.") % {"target": applied})
        elif action == "rollback":
            restored = tuning.rollback_tuning(actor=actor, tuning=job)
            messages.success(request, _("Rolled back: the settings before it are in use again, saved as %(target)s.")
                             % {"target": restored})
        return redirect("rag-tuning", tuning_id=job.pk)
    trials = list(job.trials.all())
    for trial in trials:
        trial.summary = retrieval_summary(trial.settings)
        trial.tuning_hit, trial.holdout_hit = trial.tuning_metrics["hit@k"], trial.holdout_metrics["hit@k"]
    report, applied = job.report or {}, _applied(job)
    place = jobs.place(queues.interactive_line(), RetrievalTuning, jobs.TUNE_TASK, job)
    return render(request, "rag/tuning.html", {
        "job": job, "trials": trials, "report": report, "active": job.status in tuning.ACTIVE,
        "place": place.as_dict() if place else None,
        "baseline": trials[0] if trials else None,
        "best": next((t for t in trials if t.number == report.get("best")), None),
        "applied": applied,
        # Once applied (and not rolled back), the page offers the rollback instead of the same apply again.
        "offer_apply": report.get("suggested") and job.status == JobStatus.DONE and (
            not applied or applied.get("rolled_back") or applied.get("trial") != report.get("best")),
        "objective_name": {TuningObjective.MRR: "MRR", TuningObjective.MEAN: "(hit@k + MRR) / 2"}.get(
            job.objective, "hit@k"),
        "chart": [{"number": t.number, "tuning": tuning.ranking(t.tuning_metrics, job.objective)[0],
                   "held_back": tuning.ranking(t.holdout_metrics, job.objective)[0]} for t in trials]})


def _applied(job: RetrievalTuning) -> dict:
    """The last apply, for the page: its trial, the version it made (linked), and whether it was rolled back."""
    applied = dict(job.applied or {})
    if applied.get("target") == "config" and job.config_id:
        applied["url"] = reverse("rag-config", args=[job.config_id])
    elif applied.get("target") == "knowledge_base":
        applied["url"] = reverse("rag-kb", args=[job.knowledge_base_id])
    return applied


def retrieval_summary(settings: dict) -> str:
    """A trial's settings in a few words: what differs between trials, in the page's language."""
    retrieval = settings["retrieval"]
    parts = [retrieval["mode"]]
    if retrieval["mode"] == "hybrid":
        parts.append(_("RRF, k=%(k)s") % {"k": retrieval["rrf_k"]} if retrieval["fusion"] == "rrf" else
                     _("weighted (%(normalisation)s) %(dense)s dense / %(keyword)s keyword")
                     % {"normalisation": retrieval["normalisation"], "dense": retrieval["dense_weight"],
                        "keyword": retrieval["keyword_weight"]})
    parts.append(_("%(count)s candidates") % {"count": retrieval["candidates"]})
    if retrieval.get("max_per_document"):
        parts.append(_("at most %(count)s per document") % {"count": retrieval["max_per_document"]})
    if retrieval["rerank"]["kind"] != "none":
        parts.append(_("rerank by %(model)s from %(threshold)s")
                     % {"model": retrieval["rerank"]["model"], "threshold": retrieval["rerank"]["threshold"]})
    if settings.get("rewrite_model"):
        parts.append(_("query rewriting by %(model)s") % {"model": settings["rewrite_model"]})
    return " · ".join(parts)
