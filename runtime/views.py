import json
from urllib.parse import urlsplit

from django.contrib import messages
from django.http import HttpResponse, JsonResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils import timezone
from django.utils.translation import gettext as _
from django.views.decorators.clickjacking import xframe_options_exempt
from django.views.decorators.http import require_GET

from accounts.errors import ApplicationError, NotFound, ValidationFailed
from accounts.gui import gui_actor, workspace_page
from agent_studio import selectors as agent_selectors
from agent_studio.models import AgentTemplate
from agent_studio.workflows import selectors as workflow_selectors
from agent_studio.workflows.models import NodeStatus
from agent_studio.workflows.nodes import as_text
from assets.views import bundle_download
from rag_studio import selectors as rag_selectors
from rag_studio.models import DocumentStatus, EvalSet
from runtime import selectors, services
from runtime.bundles import export_app_bundle
from runtime.models import App, Feedback, TraceStatus
from serving import selectors as serving_selectors

LOG_PAGE_SIZE = 50


@workspace_page
def apps_page(request):
    workspace = request.workspace
    if request.method == "POST":
        source = request.POST.get("source", "")
        kind, _separator, pk = source.partition(":")
        config = agent = workflow = None
        if kind == "agent":
            agent = agent_selectors.agents(workspace=workspace).filter(pk=pk if pk.isdigit() else None).first()
            if agent is None:
                raise NotFound("That agent is not in this workspace.")
        elif kind == "workflow":
            workflow = workflow_selectors.workflows(workspace=workspace).filter(
                pk=pk if pk.isdigit() else None).first()
            if workflow is None:
                raise NotFound("That workflow is not in this workspace.")
        else:
            config = rag_selectors.scoped(rag_selectors.rag_configs(workspace=workspace), pk or
                                          request.POST.get("rag_config"), "RAG config")
        app = services.publish_app(actor=gui_actor(request), config=config, agent=agent, workflow=workflow,
                                   name=request.POST.get("name", ""), slug=request.POST.get("slug", ""))
        messages.success(request, _("Published '%(name)s' at %(url)s (release 1, %(source)s v%(version)s).") % {
            "name": app.name, "url": f"/api/apps/{app.slug}/", "source": app.source.name,
            "version": app.current_release.version.number})
        return redirect("app", slug=app.slug)
    # "Publish as an app" on an agent's or a config's page preselects that source here.
    return render(request, "runtime/apps.html", {
        "apps": selectors.apps(workspace=workspace),
        "configs": rag_selectors.rag_configs(workspace=workspace),
        "agents": agent_selectors.agents(workspace=workspace),
        "workflows": workflow_selectors.workflows(workspace=workspace).filter(version__gt=0),
        "selected_agent": _id_param(request, "agent"), "selected_config": _id_param(request, "config"),
        "selected_workflow": _id_param(request, "workflow")})


WIZARD_PATHS = ("rag", "agent", "bundle")


@workspace_page
def new_app(request):
    """The "create an app" wizard: a RAG assistant from documents (published from the indexing step that follows)
    or an agent from a template, published with its key in one form; or the import of a bundle (on the Assets
    page)."""
    post = request.POST
    path = (post or request.GET).get("path", "")
    status = 200
    if request.method == "POST":
        try:
            if path == "rag":
                config = services.start_rag_assistant(
                    actor=gui_actor(request), workspace=request.workspace, name=post.get("name", ""),
                    uploads=request.FILES.getlist("files"), model=post.get("model", ""))
                return redirect("new-app-indexing", config_id=config.pk)
            if path == "agent":
                started = services.start_agent_app(
                    actor=gui_actor(request), workspace=request.workspace, name=post.get("name", ""),
                    template=post.get("template", ""), model=post.get("model", ""))
            else:
                raise ValidationFailed(_("Choose what to build: a RAG assistant or an agent."))
        except NotFound:
            raise
        except ApplicationError as exc:
            # Shown on the form, with what was typed kept (files have to be chosen again: browsers forbid that).
            messages.error(request, exc.message)
            status = 400
        else:
            return _published_with_key(request, started)
    return render(request, "runtime/new_app.html", {
        "path": path if path in WIZARD_PATHS else "", "form": post,
        "chat_models": serving_selectors.chat_models(workspace=request.workspace),
        "agent_templates": AgentTemplate.choices}, status=status)


# A key just made, held in the session across the redirect to its app's page, which shows it once with a Copy
# button (as accounts/views.py does for API keys) and forgets it.
ISSUED_APP_KEY_SESSION = "issued_app_key"


def _show_key_once(request, app: App, issued: services.IssuedAppKey) -> None:
    request.session[ISSUED_APP_KEY_SESSION] = {"app": app.slug, "name": issued.app_key.name,
                                               "secret": issued.secret}


def _published_with_key(request, started: services.StartedApp):
    messages.success(request, _("Published '%(name)s'.") % {"name": started.app.name})
    _show_key_once(request, started.app, started.key)
    return redirect("app", slug=started.app.slug)


@workspace_page
def new_app_indexing(request, config_id):
    """The RAG path's second step: each document's indexing, then Publish once indexing has ended (the page
    reloads itself meanwhile); failures are named, and an assistant with nothing indexed is not published."""
    config = rag_selectors.scoped(rag_selectors.rag_configs(workspace=request.workspace), config_id, "RAG config")
    if (app := App.objects.filter(rag_config=config).first()) is not None:
        return redirect("app", slug=app.slug)
    status = 200
    if request.method == "POST":
        try:
            return _published_with_key(request, services.publish_rag_assistant(actor=gui_actor(request),
                                                                               config=config))
        except ApplicationError as exc:
            messages.error(request, exc.message)
            status = 409
    documents = rag_selectors.document_progress(kb=config.knowledge_base)
    indexed = sum(d["status"] == DocumentStatus.INDEXED for d in documents)
    failed = [d for d in documents if d["status"] == DocumentStatus.FAILED]
    return render(request, "runtime/new_app_indexing.html", {
        "config": config, "documents": documents, "indexed": indexed, "failed": failed, "total": len(documents),
        "busy": indexed + len(failed) < len(documents)}, status=status)


def _id_param(request, name: str) -> int | None:
    value = request.GET.get(name, "")
    return int(value) if value.isdigit() else None


def _app_action(request, app: App) -> None:
    actor, post, action = gui_actor(request), request.POST, request.POST.get("action")
    if action == "republish":
        release = services.republish(actor=actor, app=app, note=post.get("note", ""))
        messages.success(request, _("Release %(release)s is live: %(source)s v%(version)s.") % {
            "release": release.number, "source": app.source.name, "version": release.version.number})
    elif action == "rollback":
        release = services.roll_back(actor=actor, app=app, number=int(post.get("release", "0") or 0))
        messages.success(request, _("Rolled back: release %(release)s serves v%(version)s again.") % {
            "release": release.number, "version": release.version.number})
    elif action in ("enable", "disable"):
        services.update_app(actor=actor, app=app, enabled=action == "enable")
        messages.success(request, (_("'%(name)s' is enabled.") if action == "enable" else _("'%(name)s' is disabled."))
                         % {"name": app.name})
    elif action == "settings":
        services.update_app(actor=actor, app=app, name=post.get("name"), rate_limit=post.get("rate_limit"),
                            allowed_origins=post.get("allowed_origins", "").split(),
                            opener=post.get("opener", app.opener),
                            suggested_questions=post.get("suggested_questions",
                                                         "\n".join(app.suggested_questions)).splitlines())
        messages.success(request, _("Saved."))
    elif action == "create_key":
        issued = services.create_app_key(actor=actor, app=app, name=post.get("key_name", ""),
                                         rate_limit=post.get("key_rate_limit") or None)
        messages.success(request, _("Key '%(name)s' created.") % {"name": issued.app_key.name})
        _show_key_once(request, app, issued)
    elif action == "revoke_key":
        app_key = app.keys.filter(pk=post.get("key")).first()
        if app_key is None:
            raise NotFound("That key does not exist.")
        services.revoke_app_key(actor=actor, app_key=app_key)
        messages.success(request, _("Key '%(name)s' revoked.") % {"name": app_key.name})
    elif action == "rotate_widget_token":
        services.rotate_widget_token(actor=actor, app=app)
        messages.success(request, _("The web chat token was rotated; update the snippet on your sites."))
    elif action == "delete":
        services.delete_app(actor=actor, app=app)
        messages.success(request, _("Deleted '%(name)s'.") % {"name": app.name})
    else:
        raise ValidationFailed(f"Unknown action '{action}'.")


@workspace_page
def app_page(request, slug):
    app = selectors.app_by_slug(workspace=request.workspace, slug=slug)
    if request.method == "POST":
        _app_action(request, app)
        if request.POST.get("action") == "delete":
            return redirect("apps")
        return redirect("app", slug=app.slug)
    base = request.build_absolute_uri("/").rstrip("/")
    latest = app.source.versions.first()
    issued = request.session.pop(ISSUED_APP_KEY_SESSION, None)
    return render(request, "runtime/app.html", {
        "app": app, "base": base, "latest_version": latest,
        "issued": issued if issued and issued["app"] == app.slug else None,
        "releases": app.releases.select_related("config_version", "agent_version", "published_by"),
        "workflow_inputs_example": json.dumps({item["name"]: "…" for item in app.current_release.version.graph[
            "inputs"]}, ensure_ascii=False) if app.is_workflow else "",
        "keys": app.keys.all(), "origins": "\n".join(app.allowed_origins),
        "suggested_questions": "\n".join(app.suggested_questions)})


@workspace_page
def app_export(request, slug):
    app = selectors.app_by_slug(workspace=request.workspace, slug=slug)
    exported = export_app_bundle(actor=gui_actor(request), app=app,
                                 include_indexes=request.GET.get("include_indexes") == "on")
    return bundle_download(exported.path, exported.filename)


def _since(period: str):
    span = selectors.PERIODS.get(period, (None,))[0]
    return timezone.now() - span if span else None


@workspace_page
def logs_page(request, slug):
    app = selectors.app_by_slug(workspace=request.workspace, slug=slug)
    if request.method == "POST":
        return _export_feedback_dataset(request, app)
    period, feedback, status = (request.GET.get(name, "") for name in ("period", "feedback", "status"))
    found = selectors.traces(app=app, since=_since(period), feedback=feedback, status=status)
    return render(request, "runtime/logs.html", {
        "app": app, "traces": found[:LOG_PAGE_SIZE], "total": found.count(), "period": period,
        "feedback": feedback, "status": status, "periods": list(selectors.PERIODS),
        "statuses": TraceStatus.choices})


def _export_feedback_dataset(request, app):
    """The logs page's export button: the up-voted answers become a dataset, shown in Model enhancement."""
    dataset = services.feedback_to_dataset(actor=gui_actor(request), app=app,
                                           name=request.POST.get("dataset_name", ""))
    messages.success(request, _("Exported %(count)s up-voted answer(s) of '%(app)s' as dataset '%(dataset)s'.")
                     % {"count": dataset.sample_count, "app": app.slug, "dataset": dataset.name})
    return redirect("enhancement-dataset", dataset_id=dataset.pk)


@workspace_page
def trace_page(request, slug, message_id):
    app = selectors.app_by_slug(workspace=request.workspace, slug=slug)
    trace = selectors.traces(app=app).filter(public_id=message_id).select_related("conversation").first()
    if trace is None:
        raise NotFound("That call is not in this app's log.")
    feedback = Feedback.objects.filter(trace=trace).first()
    if request.method == "POST" and feedback is not None and (app.is_agent or app.is_workflow):
        scenario = services.feedback_to_scenario(actor=gui_actor(request), feedback=feedback,
                                                 expected_answer=request.POST.get("expected_answer", ""))
        messages.success(request, _("Added the scenario '%(scenario)s' to the evaluation of %(agent)s.")
                         % {"scenario": scenario.name, "agent": app.source.name})
        return redirect("app-trace", slug=slug, message_id=message_id)
    if request.method == "POST" and feedback is not None:
        eval_set = (rag_selectors.scoped(rag_selectors.eval_sets(workspace=request.workspace),
                                         request.POST.get("eval_set"), "Eval set")
                    if request.POST.get("eval_set") else None)
        item = services.feedback_to_eval_item(
            actor=gui_actor(request), feedback=feedback, expected_answer=request.POST.get("expected_answer", ""),
            expected_sources=request.POST.get("expected_sources", "").split("\n"), eval_set=eval_set)
        messages.success(request, _("Added to the eval set '%(name)s'.") % {"name": item.eval_set.name})
        return redirect("app-trace", slug=slug, message_id=message_id)
    conversation = (trace.conversation.traces.filter(created_at__lte=trace.created_at).order_by("created_at")
                    if trace.conversation else [])
    return render(request, "runtime/trace.html", {
        "app": app, "trace": trace, "feedback": feedback, "conversation": conversation,
        "steps": agent_selectors.run_steps(trace.agent_run) if trace.agent_run_id else [],
        "nodes": [node | {"status_label": NodeStatus(node["status"]).label,
                          "output_text": as_text((node["outputs"] or {}).get("output", node["outputs"] or ""))}
                  for node in workflow_selectors.node_trace(trace.workflow_run)] if trace.workflow_run_id else [],
        "eval_sets": EvalSet.objects.filter(knowledge_base=app.rag_config.knowledge_base).exclude(status="failed")
        if app.rag_config_id else [],
        "cited_documents": "\n".join(services.cited_documents(trace))})


@workspace_page
def monitoring_page(request, slug):
    app = selectors.app_by_slug(workspace=request.workspace, slug=slug)
    period = request.GET.get("period", "24h")
    run = selectors.latest_eval(app)
    return render(request, "runtime/monitoring.html", {
        "app": app, "period": period, "periods": list(selectors.PERIODS), "eval_run": run,
        "eval_headline": selectors.eval_headline(run)})


@workspace_page
def monitoring_data(request, slug):
    app = selectors.app_by_slug(workspace=request.workspace, slug=slug)
    return JsonResponse(selectors.monitoring(app=app, period=request.GET.get("period", "24h")))


def _widget_app(slug: str, token: str) -> App | None:
    return App.objects.filter(slug=slug, widget_token=token or "-", enabled=True).first()


def _origin(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc.lower()}" if parts.scheme in ("http", "https") and parts.netloc else ""


def _own_origin(request) -> str:
    return _origin(request.build_absolute_uri("/"))


def _embedding_site(request) -> str:
    """The origin of the page framing the web chat ('' when not framed): embed.js names it, and the Referer tells
    it where that page's referrer policy allows. Only used to explain a refusal; the browser enforces
    frame-ancestors either way. A link opened in its own tab (Sec-Fetch-Dest: document) is no embed."""
    destination = request.headers.get("Sec-Fetch-Dest")
    if destination not in ("iframe", "frame") and (destination is not None or "site" not in request.GET):
        return ""
    return _origin(request.GET.get("site", "")) or _origin(request.headers.get("Referer", ""))


@require_GET
@xframe_options_exempt
def widget(request, slug):
    """The standalone web chat. Only the app's own allowed origins may frame it (CSP frame-ancestors); the
    token is checked again, with the Origin, on every chat call."""
    app = _widget_app(slug, request.GET.get("token", ""))
    if app is None:
        return render(request, "runtime/widget_unavailable.html", status=403)
    site = _embedding_site(request)
    if site and site != _own_origin(request) and site not in app.allowed_origins:
        # The browser would only say "refused to connect"; this page says why, and may be framed anywhere: it
        # holds neither the token nor the chat.
        response = render(request, "runtime/widget_refused.html", {
            "app": app, "site": site, "app_url": request.build_absolute_uri(reverse("app", args=[app.slug]))},
            status=403)
        response["Content-Security-Policy"] = "frame-ancestors *"
        return response
    response = render(request, "runtime/widget.html", {"app": app, "token": app.widget_token,
                                                       "chat_url": reverse("app-chat", args=[app.slug]),
                                                       "feedback_url": reverse("app-feedback", args=[app.slug])})
    response["Content-Security-Policy"] = "frame-ancestors " + " ".join(["'self'", *app.allowed_origins])
    return response


@require_GET
def embed_script(request, slug):
    """`<script src=".../embed.js" data-token="…">` mounts a chat button and the web chat in an iframe."""
    widget_url = request.build_absolute_uri(reverse("app-widget", args=[slug]))
    script = render(request, "runtime/embed.js", {"widget_url": widget_url}).content
    response = HttpResponse(script, content_type="text/javascript; charset=utf-8")
    response["Cache-Control"] = "max-age=300"
    return response
