"""Publishing apps and managing their keys, releases, web chat and feedback."""

import re
import secrets
import uuid
from dataclasses import dataclass
from urllib.parse import urlsplit

from django.db import IntegrityError, transaction
from django.utils import timezone
from django.utils.text import slugify
from django.utils.translation import gettext

from accounts.errors import Conflict, NotFound, ValidationFailed
from accounts.models import Role
from accounts.services import Actor, hash_secret, issue_secret, record_audit, require_role
from agent_studio import services as agent_services
from agent_studio.models import Agent, Scenario
from agent_studio.services import agent_version, save_scenario
from agent_studio.workflows import services as workflow_services
from agent_studio.workflows.models import Workflow, WorkflowScenario
from assets.models import AssetKind, AssetVersion
from assets.services import forget_asset, register_asset
from enhancement.models import Dataset
from enhancement.services import dataset_from_pairs
from rag_studio import services as rag_services
from rag_studio.evals.evaluation import add_corrected_item
from rag_studio.models import DocumentStatus, EvalItem, EvalSet, RagConfig
from rag_studio.selectors import config_version
from rag_studio.services import register_kb_asset
from runtime.models import App, AppKey, Feedback, Release, Trace, TraceStatus

APP_KEY_TAG = "afa_"
WIDGET_TOKEN_TAG = "afw_"
SLUG = re.compile(r"^[a-z0-9][a-z0-9-]{1,62}$")
MAX_RATE_LIMIT = 100_000


def _slug(value: str, name: str) -> str:
    slug = (value or slugify(name)).strip().lower()
    if not SLUG.match(slug):
        raise ValidationFailed("The slug must be 2-63 lowercase letters, digits or dashes, starting with a letter "
                               "or digit; it becomes part of the app's URL.", fields={"slug": ["Invalid slug."]})
    return slug


def _rate_limit(value, field: str = "rate_limit") -> int:
    try:
        limit = int(value)
    except (TypeError, ValueError):
        limit = 0
    if not 1 <= limit <= MAX_RATE_LIMIT:
        raise ValidationFailed(gettext("The rate limit is in requests per minute, 1 to %(limit)s.")
                               % {"limit": MAX_RATE_LIMIT},
                               fields={field: ["Out of range."]})
    return limit


def _origins(values) -> list[str]:
    """Normalise to scheme://host[:port]; a browser's Origin header is compared with these as they are."""
    origins = []
    for value in values or []:
        value = str(value).strip().rstrip("/")
        if not value:
            continue
        parts = urlsplit(value)
        if parts.scheme not in ("http", "https") or not parts.netloc or parts.path or parts.query:
            raise ValidationFailed(gettext("'%(origin)s' is not an origin; write it as https://intranet.example.com "
                                           "(scheme, host and port, no path).") % {"origin": value},
                                   fields={"allowed_origins": ["Invalid."]})
        origin = f"{parts.scheme}://{parts.netloc.lower()}"
        if origin not in origins:
            origins.append(origin)
    return origins


def register_app_asset(app: App, *, actor: Actor | None = None) -> AssetVersion:
    """Record what the app serves and how it is exposed; a new asset version whenever either changes."""
    version = app.current_release.version
    kind = "agent" if app.is_agent else "workflow" if app.is_workflow else "rag_config"
    payload = {"slug": app.slug, "name": app.name, kind: app.source.pk, f"{kind}_version": version.number,
               f"{kind}_checksum": version.checksum, "enabled": app.enabled,
               "default_rate_limit": app.default_rate_limit, "allowed_origins": app.allowed_origins}
    return register_asset(workspace=app.workspace, kind=AssetKind.APP, ref_id=app.pk, name=app.name,
                          payload=payload, actor=actor,
                          summary={"release": app.current_release.number, f"{kind}_version": version.number})


def _release(*, actor: Actor, app: App, note: str = "", config_version_=None, agent_version_=None,
             workflow_version_=None) -> Release:
    """A new release serving the given version (by default the studio's latest), made current."""
    if app.is_agent:
        agent_version_ = agent_version_ or agent_version(app.agent)
    elif app.is_workflow:
        workflow_version_ = workflow_version_ or workflow_services.workflow_version(app.workflow)
    else:
        config_version_ = config_version_ or config_version(app.rag_config)
    number = (app.releases.order_by("-number").values_list("number", flat=True).first() or 0) + 1
    release = Release.objects.create(app=app, number=number, config_version=config_version_,
                                     agent_version=agent_version_, workflow_version=workflow_version_,
                                     published_by=actor.user, note=note[:200])
    App.objects.filter(pk=app.pk).update(current_release=release, updated_at=timezone.now())
    app.current_release = release
    if not app.is_agent and not app.is_workflow:
        register_kb_asset(app.rag_config.knowledge_base, actor=actor)
    register_app_asset(app, actor=actor)
    return release


def publish_app(*, actor: Actor, config: RagConfig | None = None, agent: Agent | None = None,
                workflow: Workflow | None = None, name: str = "", slug: str = "", rate_limit: int = 60) -> App:
    """A new app serving the latest version of a RAG config, of an agent or of a workflow."""
    if sum(source is not None for source in (config, agent, workflow)) != 1:
        raise ValidationFailed("Publish a RAG config, an agent or a workflow: one of them.",
                               fields={"source": ["One of three."]})
    source = config or agent or workflow
    require_role(actor=actor, workspace=source.workspace, role=Role.DEVELOPER)
    name = (name or source.name).strip()
    slug = _slug(slug, name)
    try:
        with transaction.atomic():
            app = App.objects.create(workspace=source.workspace, slug=slug, name=name, rag_config=config, agent=agent,
                                     workflow=workflow,
                                     default_rate_limit=_rate_limit(rate_limit),
                                     widget_token=f"{WIDGET_TOKEN_TAG}{secrets.token_urlsafe(24)}")
            release = _release(actor=actor, app=app, note=gettext("First release"))
            record_audit(actor=actor, workspace=source.workspace, action="app.publish", target=app,
                         detail={"slug": slug, "serves": "agent" if agent else "workflow" if workflow
                                 else "rag_config",
                                 "version": release.version.number})
    except IntegrityError:
        raise Conflict(gettext("The slug '%(slug)s' is taken; choose another.") % {"slug": slug},
                       fields={"slug": ["Already in use."]})
    return app


def republish(*, actor: Actor, app: App, note: str = "") -> Release:
    """Serve the studio's latest saved version. One update of the app's pointer, so a call in flight finishes on
    the release it started with and the next one gets the new release."""
    require_role(actor=actor, workspace=app.workspace, role=Role.DEVELOPER)
    with transaction.atomic():
        app = App.objects.select_for_update().select_related("rag_config", "agent", "workflow").get(pk=app.pk)
        release = _release(actor=actor, app=app, note=note)
        record_audit(actor=actor, workspace=app.workspace, action="app.republish", target=app,
                     detail={"release": release.number, "version": release.version.number})
    return release


def roll_back(*, actor: Actor, app: App, number: int) -> Release:
    """Serve an earlier release again, as a new release, so the history says what happened and when."""
    require_role(actor=actor, workspace=app.workspace, role=Role.DEVELOPER)
    with transaction.atomic():
        app = App.objects.select_for_update().select_related("rag_config", "agent", "workflow").get(pk=app.pk)
        earlier = app.releases.filter(number=number).select_related("config_version", "agent_version",
                                                                     "workflow_version").first()
        if earlier is None:
            raise NotFound(gettext("Release %(number)s of '%(app)s' not found.") % {"number": number, "app": app.slug})
        release = _release(actor=actor, app=app, note=gettext("Rollback to release %(number)s") % {"number": number},
                           config_version_=earlier.config_version, agent_version_=earlier.agent_version,
                           workflow_version_=earlier.workflow_version)
        record_audit(actor=actor, workspace=app.workspace, action="app.rollback", target=app,
                     detail={"release": release.number, "to": number})
    return release


MAX_SUGGESTED_QUESTIONS = 5
MAX_SUGGESTED_QUESTION_CHARS = 200
MAX_OPENER_CHARS = 2000


def _opener(value) -> str:
    opener = str(value).strip()
    if len(opener) > MAX_OPENER_CHARS:
        raise ValidationFailed(gettext("The opener is %(length)s characters; keep it to %(limit)s.")
                               % {"length": len(opener), "limit": MAX_OPENER_CHARS},
                               fields={"opener": ["Too long."]})
    return opener


def _suggested_questions(values) -> list[str]:
    if not isinstance(values, list) or not all(isinstance(value, str) for value in values):
        raise ValidationFailed("'suggested_questions' must be a list of questions.",
                               fields={"suggested_questions": ["Invalid."]})
    questions = [value.strip() for value in values if value.strip()]
    if len(questions) > MAX_SUGGESTED_QUESTIONS:
        raise ValidationFailed(gettext("%(count)s suggested questions; the web chat shows at most %(limit)s.")
                               % {"count": len(questions), "limit": MAX_SUGGESTED_QUESTIONS},
                               fields={"suggested_questions": ["Too many."]})
    for question in questions:
        if len(question) > MAX_SUGGESTED_QUESTION_CHARS:
            raise ValidationFailed(gettext("The suggested question '%(question)s…' is longer than %(limit)s "
                                           "characters.")
                                   % {"question": question[:40], "limit": MAX_SUGGESTED_QUESTION_CHARS},
                                   fields={"suggested_questions": ["Too long."]})
    return questions


def update_app(*, actor: Actor, app: App, name: str | None = None, enabled: bool | None = None,
               rate_limit: int | None = None, allowed_origins: list[str] | None = None, opener: str | None = None,
               suggested_questions: list[str] | None = None) -> App:
    require_role(actor=actor, workspace=app.workspace, role=Role.DEVELOPER)
    changed = {}
    if opener is not None:
        changed["opener"] = _opener(opener)
    if suggested_questions is not None:
        changed["suggested_questions"] = _suggested_questions(suggested_questions)
    if name is not None:
        if not name.strip():
            raise ValidationFailed("The app needs a name.", fields={"name": ["This field may not be blank."]})
        changed["name"] = name.strip()
    if enabled is not None:
        changed["enabled"] = bool(enabled)
    if rate_limit is not None:
        changed["default_rate_limit"] = _rate_limit(rate_limit)
    if allowed_origins is not None:
        changed["allowed_origins"] = _origins(allowed_origins)
    for field, value in changed.items():
        setattr(app, field, value)
    app.save()
    register_app_asset(app, actor=actor)
    record_audit(actor=actor, workspace=app.workspace, action="app.update", target=app, detail=changed)
    return app


def rotate_widget_token(*, actor: Actor, app: App) -> App:
    require_role(actor=actor, workspace=app.workspace, role=Role.DEVELOPER)
    app.widget_token = f"{WIDGET_TOKEN_TAG}{secrets.token_urlsafe(24)}"
    app.save(update_fields=["widget_token", "updated_at"])
    record_audit(actor=actor, workspace=app.workspace, action="app.widget_token.rotate", target=app)
    return app


def delete_app(*, actor: Actor, app: App) -> None:
    require_role(actor=actor, workspace=app.workspace, role=Role.DEVELOPER)
    record_audit(actor=actor, workspace=app.workspace, action="app.delete", target=app, detail={"slug": app.slug})
    with transaction.atomic():
        forget_asset(workspace=app.workspace, kind=AssetKind.APP, ref_id=app.pk)
        App.objects.filter(pk=app.pk).update(current_release=None)
        app.delete()


@dataclass(frozen=True)
class IssuedAppKey:
    app_key: AppKey
    secret: str  # shown once, never stored


def create_app_key(*, actor: Actor, app: App, name: str, rate_limit: int | None = None) -> IssuedAppKey:
    require_role(actor=actor, workspace=app.workspace, role=Role.DEVELOPER)
    name = name.strip()
    if not name:
        raise ValidationFailed("Give the key a name, such as the system that will use it.",
                               fields={"name": ["This field may not be blank."]})
    prefix, secret = issue_secret(APP_KEY_TAG)
    app_key = AppKey.objects.create(app=app, name=name, prefix=prefix, key_hash=hash_secret(secret),
                                    rate_limit=_rate_limit(rate_limit) if rate_limit else None,
                                    created_by=actor.user)
    record_audit(actor=actor, workspace=app.workspace, action="app.key.create", target=app_key,
                 detail={"app": app.slug, "name": name})
    return IssuedAppKey(app_key=app_key, secret=secret)


@dataclass
class StartedApp:
    app: App
    key: IssuedAppKey


def start_rag_assistant(*, actor: Actor, workspace, name: str, uploads, model: str) -> RagConfig:
    """The wizard's RAG path, first step: a knowledge base of the uploaded documents (indexed in the background)
    and a config that answers from them with citations; `publish_rag_assistant` publishes it once they are
    indexed. All or nothing: a refused name or model leaves no half-made knowledge base behind."""
    if not uploads:
        raise ValidationFailed(gettext("Choose the documents the assistant answers from."),
                               fields={"files": [gettext("Required.")]})
    with transaction.atomic():
        kb = rag_services.create_knowledge_base(actor=actor, workspace=workspace, name=name)
        config = rag_services.save_rag_config(actor=actor, workspace=workspace, name=name, knowledge_base=kb,
                                              template="citations", model=model)
        rag_services.upload_documents(actor=actor, kb=kb, uploads=uploads)
    return config


def publish_rag_assistant(*, actor: Actor, config: RagConfig) -> StartedApp:
    """The wizard's RAG path, last step: the app and its first key, once indexing has ended with at least one
    document indexed (as Dify shows a dataset's indexing before it can be used), never while an app would answer
    from a half-built knowledge base."""
    documents = config.knowledge_base.documents
    pending = documents.filter(status__in=[DocumentStatus.QUEUED, DocumentStatus.PROCESSING]).count()
    if pending:
        raise Conflict(gettext("%(pending)s of %(total)s documents are still being indexed; publish once they are "
                               "done.") % {"pending": pending, "total": documents.count()})
    if not documents.filter(status=DocumentStatus.INDEXED).exists():
        raise Conflict(gettext("None of the documents could be indexed, so the assistant would have nothing to "
                               "answer from; add documents it can read."))
    with transaction.atomic():
        app = publish_app(actor=actor, config=config, name=config.name)
        key = create_app_key(actor=actor, app=app, name="first key")
    return StartedApp(app=app, key=key)


def start_agent_app(*, actor: Actor, workspace, name: str, template: str, model: str) -> StartedApp:
    """The wizard's agent path: an agent of a template on a chat model, published with its first key."""
    with transaction.atomic():
        agent = agent_services.save_agent(actor=actor, workspace=workspace, name=name, template=template,
                                          settings={"model": model})
        app = publish_app(actor=actor, agent=agent, name=name)
        key = create_app_key(actor=actor, app=app, name="first key")
    return StartedApp(app=app, key=key)


def revoke_app_key(*, actor: Actor, app_key: AppKey) -> AppKey:
    require_role(actor=actor, workspace=app_key.app.workspace, role=Role.DEVELOPER)
    if app_key.revoked_at is None:
        app_key.revoked_at = timezone.now()
        app_key.save(update_fields=["revoked_at"])
        record_audit(actor=actor, workspace=app_key.app.workspace, action="app.key.revoke", target=app_key)
    return app_key


RATINGS = {"up": 1, "down": -1, 1: 1, -1: -1, "1": 1, "-1": -1}


def record_feedback(*, app: App, message_id: str, rating, comment: str = "") -> Feedback:
    """An end user's thumbs up or down on one answer; a second vote on the same answer replaces the first."""
    if rating not in RATINGS:
        raise ValidationFailed("'rating' must be \"up\" or \"down\".", fields={"rating": ["Invalid."]})
    trace = Trace.objects.filter(app=app, public_id=message_id).first() if _is_uuid(message_id) else None
    if trace is None:
        raise NotFound(gettext("No message '%(message)s' in the app '%(app)s'.")
                       % {"message": message_id, "app": app.slug})
    feedback, _ = Feedback.objects.update_or_create(
        trace=trace, defaults={"rating": RATINGS[rating], "comment": str(comment or "")[:4000]})
    return feedback


def _is_uuid(value) -> bool:
    try:
        uuid.UUID(str(value))
    except ValueError:
        return False
    return True


def cited_documents(trace: Trace) -> list[str]:
    return sorted({citation["document"] for citation in trace.citations if citation.get("document")})


def feedback_to_eval_item(*, actor: Actor, feedback: Feedback, expected_answer: str,
                          expected_sources: list[str] | None = None, eval_set: EvalSet | None = None) -> EvalItem:
    """Turn a down-voted answer into an eval item of the app's knowledge base: the question with the corrected
    answer, and the documents it should come from (by default, those the answer cited)."""
    trace = feedback.trace
    if trace.app.is_agent or trace.app.is_workflow:
        raise ValidationFailed("An agent or workflow app's corrections become evaluation scenarios of its agent "
                               "or workflow.")
    kb = trace.app.rag_config.knowledge_base
    sources = cited_documents(trace) if expected_sources is None else [s.strip() for s in expected_sources
                                                                        if s.strip()]
    item = add_corrected_item(actor=actor, kb=kb, eval_set=eval_set, question=trace.query,
                              expected_answer=expected_answer, expected_sources=sources)
    feedback.eval_item = item
    feedback.save(update_fields=["eval_item", "updated_at"])
    return item


def feedback_to_scenario(*, actor: Actor, feedback: Feedback, expected_answer: str) -> Scenario | WorkflowScenario:
    """Turn a down-voted answer of an agent or workflow app into a scenario of its agent or workflow: the question
    (a workflow's run inputs), judged against the corrected answer, so that the next evaluation shows whether a new
    version gets it right."""
    trace = feedback.trace
    if not trace.app.is_agent and not trace.app.is_workflow:
        raise ValidationFailed("A RAG app's corrections become eval items of its knowledge base.")
    if not expected_answer.strip():
        raise ValidationFailed("Write the answer the agent should have given.",
                               fields={"expected_answer": ["Required."]})
    judged = [{"kind": "judge", "value": f"The answer says what this answer says: {expected_answer.strip()}"}]
    if trace.app.is_workflow:
        if trace.workflow_run is None:
            raise ValidationFailed("This call started no workflow run, so there are no inputs to replay.")
        return workflow_services.save_scenario(actor=actor, workflow=trace.app.workflow,
                                               name=f"feedback {trace.public_id.hex[:8]}",
                                               inputs=trace.workflow_run.inputs, checks=judged)
    return save_scenario(actor=actor, agent=trace.app.agent, name=f"feedback {trace.public_id.hex[:8]}",
                         input=trace.query, checks=judged)


def feedback_to_dataset(*, actor: Actor, app: App, name: str = "") -> Dataset:
    """The app's up-voted answers, each with its question, as an instruction dataset of the app's workspace (a
    new version when the name exists), for a fine-tune job in Model enhancement."""
    pairs = [(trace.query, trace.answer) for trace in Trace.objects.filter(
        app=app, feedback__rating__gt=0, status=TraceStatus.OK).exclude(answer="").order_by("created_at")]
    if not pairs:
        raise ValidationFailed(gettext("No up-voted answer of '%(app)s' to export yet.") % {"app": app.slug})
    return dataset_from_pairs(actor=actor, workspace=app.workspace, name=name.strip() or f"{app.slug}-feedback",
                              pairs=pairs)

