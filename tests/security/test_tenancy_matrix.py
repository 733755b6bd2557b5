"""Issue 13, "Prove it": the tenancy matrix, generated from the URL configuration.

Every URL pattern must have an entry in MATRIX. An endpoint that takes an object id names the kind of object and
how its URL is filled from it; the test then makes one object of every kind in workspace A and, as a member of
workspace B (a session on GUI pages, an API key on the API), reads, updates and deletes A's object on every such
endpoint: each answer must be 404 (or 405 where the method is not served), A's objects must be unchanged, and B's
lists must not show them. A viewer of A cannot write through the API. Endpoints without an object say why (a list, a
page of one's own, a public or shared resource). A new endpoint without an entry fails `test_every_endpoint_is_in
_the_matrix`, so whoever adds one decides how it is scoped.
"""

import re
import uuid
from dataclasses import dataclass

import pytest
from django.forms.models import model_to_dict
from django.test import Client
from django.urls import get_resolver
from django.urls.resolvers import URLResolver
from rest_framework.test import APIClient

from accounts.models import ApiKey, Membership
from accounts.services import SYSTEM, Actor, create_api_key
from tests.rag_studio.conftest import presets, sample  # noqa: F401  (the preset models, registered)

pytestmark = pytest.mark.django_db


@dataclass(frozen=True)
class Scoped:
    """An endpoint reaching one object of `kind`; `kwargs` fills its URL from the objects of workspace A."""

    kind: str
    kwargs: object  # Callable[[dict], dict]


# Endpoints without an object of a workspace in their URL, and why that is safe.
LIST = "a list of the caller's own workspace's objects (checked below not to show another's)"
OWN = "acts on the caller's own workspace or account only"
PUBLIC = "public or platform-wide by design (health, sign-in, docs, shared pool, static)"
LEAN = "served by the edge's own routing (gateway, app API): covered by the gateway and app-key tests"


def _pk(kind: str, name: str = "pk") -> Scoped:
    return Scoped(kind, lambda o, kind=kind, name=name: {name: o[kind].pk})


MATRIX: dict[str, object] = {
    # factory and accounts
    "dashboard": OWN, "coming": PUBLIC, "healthz": PUBLIC, "schema": PUBLIC, "api-docs": PUBLIC,
    "login": PUBLIC, "logout": OWN, "api-login": PUBLIC, "api-logout": OWN, "api-me": OWN,
    "choose-language": OWN, "javascript-catalog": PUBLIC, "switch-workspace": OWN, "create-workspace": OWN,
    "api-keys": LIST, "settings": LIST,
    "workspace-list": LIST, "workspace-detail": _pk("workspace"),
    "member-list": LIST, "member-detail": _pk("membership"),
    "api-key-list": LIST, "api-key-detail": _pk("api_key"), "api-key-revoke": _pk("api_key"),
    "revoke-api-key": _pk("api_key", "key_id"), "remove-member": _pk("membership", "membership_id"),
    "audit-list": LIST,
    # cluster
    "node-list": PUBLIC, "node-detail": PUBLIC, "cluster": OWN,
    # the pool: one's own jobs and queue (others' counted, never named); quotas by platform administrators only
    "pool": OWN, "quota-list": PUBLIC, "cluster-set-quota": PUBLIC,
    "job-list": LIST, "job-detail": _pk("job"), "job-cancel": _pk("job"),
    # assets
    "assets": LIST, "assets-import": OWN, "api-asset-import": OWN, "api-instance-key": PUBLIC,
    "asset-list": LIST, "asset-detail": _pk("asset"),
    # serving
    "metrics": PUBLIC, "serving": LIST, "playground": LIST, "playground-chat": OWN, "create-deployment": OWN,
    "model-list": LIST, "model-detail": _pk("model"), "model-chat-template": _pk("model"),
    "model-deploy": _pk("model"),
    "deploy-model": _pk("model", "model_id"), "model-chat-template-gui": _pk("model", "model_id"),
    "delete-model": _pk("model", "model_id"),
    "deployment-list": LIST,
    **{name: Scoped("deployment", lambda o: {"name": o["deployment"].name}) for name in (
        "deployment-detail", "deployment-engine", "deployment-events", "deployment-metrics", "deployment-requests",
        "deployment-routing", "deployment-start", "deployment-stop", "deployment", "deployment-state")},
    "request-record-detail": Scoped("request_record", lambda o: {"request_id": o["request_record"].request_id}),
    "create-model-group": OWN, "model-group-list": LIST,
    **{name: Scoped("model_group", lambda o: {"name": o["model_group"].name}) for name in (
        "model-group", "model-group-detail", "model-group-requests", "model-group-share", "model-group-calibrate",
        "model-group-calibrations")},
    "calibration-run-detail": _pk("calibration_run"), "calibration-run-pick": _pk("calibration_run"),
    "calibration-run-cancel": _pk("calibration_run"),
    # workbridge
    "tools": LIST, "tool-new": OWN, "tools-import-openapi": OWN, "tools-import-curl": OWN, "secret-set": OWN,
    "egress-rule-add": OWN, "mcp-server-add": OWN,
    "egress-rule-list": LIST, "egress-rule-detail": _pk("egress_rule"),
    "tool-list": LIST, "tool-from-curl": OWN, "tool-detail": _pk("tool"), "tool-invocations": _pk("tool"),
    "tool-invoke": _pk("tool"), "tool": _pk("tool", "tool_id"), "tool-try": _pk("tool", "tool_id"),
    "tool-delete": _pk("tool", "tool_id"),
    "secret-list": LIST, "secret-detail": _pk("secret"), "secret-delete": _pk("secret", "secret_id"),
    "api-spec-list": LIST, "api-spec-preview": OWN, "api-spec-detail": _pk("spec"),
    "spec-delete": _pk("spec", "spec_id"), "egress-rule-delete": _pk("egress_rule", "rule_id"),
    "mcp-server-list": LIST, "mcp-server-detail": _pk("mcp_server"), "mcp-server-import-tools": _pk("mcp_server"),
    "mcp-server-tools": _pk("mcp_server"), "mcp-server": _pk("mcp_server", "server_id"),
    "mcp-server-delete": _pk("mcp_server", "server_id"),
    # The operator's catalogue of local MCP commands: the same for every workspace.
    "mcp-server-catalogue": PUBLIC,
    # rag_studio
    "rag": LIST, "rag-config-new": OWN, "rag-evals": LIST,
    "knowledge-base-list": LIST, "knowledge-base-detail": _pk("kb"), "knowledge-base-documents": _pk("kb"),
    "knowledge-base-hit-test": _pk("kb"), "knowledge-base-reindex": _pk("kb"),
    **{name: _pk("kb", "kb_id") for name in ("rag-kb", "rag-kb-progress", "rag-kb-upload", "rag-kb-settings",
                                             "rag-hit-test")},
    "rag-document-list": LIST, "rag-document-detail": _pk("document"), "rag-document-chunks": _pk("document"),
    "rag-document-retry": _pk("document"), "rag-document-cancel": _pk("document"),
    "rag-document": _pk("document", "document_id"),
    "rag-document-action": _pk("document", "document_id"),
    "rag-config-list": LIST, "rag-config-detail": _pk("config"), "rag-config-export": _pk("config"),
    "rag-config-run": _pk("config"), "rag-config-versions": _pk("config"),
    **{name: _pk("config", "config_id") for name in ("rag-config", "rag-config-chat", "rag-config-export-gui",
                                                     "rag-config-chat-stream")},
    "eval-set-list": LIST, "eval-set-detail": _pk("eval_set"), "eval-set-items": _pk("eval_set"),
    "eval-set-cancel": _pk("eval_set"),
    "eval-run-list": LIST, "eval-run-detail": _pk("eval_run"), "eval-run-results": _pk("eval_run"),
    "eval-run-cancel": _pk("eval_run"),
    "rag-eval-run": _pk("eval_run", "run_id"),
    "rag-tuning-list": LIST, "rag-tuning-detail": _pk("tuning"), "rag-tuning-apply": _pk("tuning"),
    "rag-tuning-cancel": _pk("tuning"), "rag-tuning-resume": _pk("tuning"),
    "rag-tuning-rollback": _pk("tuning"), "rag-tuning": _pk("tuning", "tuning_id"),
    # runtime
    "apps": LIST, "app-list": LIST, "new-app": LIST, "new-app-indexing": _pk("config", "config_id"),
    **{name: Scoped("app", lambda o: {"slug": o["app"].slug}) for name in (
        "app-detail", "app-export", "app-feedback-dataset", "app-keys", "app-monitoring", "app-publish", "app-releases",
        "app-rotate-widget-token", "app-traces", "app", "app-export-gui", "app-logs", "app-monitoring-gui",
        "app-monitoring-data", "app-widget")},
    # The script other sites load to mount the web chat: public by design, it holds only the chat page's address.
    "app-embed-script": PUBLIC,
    # The apps' public API takes app keys, not workspace keys: covered by the app-key tests (tests/runtime).
    "app-chat": LEAN, "app-feedback": LEAN,
    "app-revoke-key": Scoped("app_key", lambda o: {"slug": o["app"].slug, "key_id": o["app_key"].pk}),
    "app-rollback": Scoped("app", lambda o: {"slug": o["app"].slug, "number": 1}),
    "app-to-eval": Scoped("trace", lambda o: {"slug": o["app"].slug, "message_id": o["trace"].public_id}),
    "app-trace": Scoped("trace", lambda o: {"slug": o["app"].slug, "message_id": o["trace"].public_id}),
    # the lean paths and the API's catch-all
    "v1/^(?P<path>.*)$": LEAN, "api/apps/<slug:slug>/<path:endpoint>": LEAN, "api/^": PUBLIC, "": PUBLIC,
    # agent_studio
    "agents": LIST, "agent-list": LIST, "agent-run-list": LIST,
    # The templates agents are made from, and the settings each takes: the same for every workspace.
    "agent-templates": PUBLIC,
    **{name: _pk("agent") for name in ("agent-detail", "agent-evaluations", "agent-runs", "agent-scenarios",
                                       "agent-suggest-strategy", "agent-versions")},
    **{name: _pk("agent", "agent_id") for name in ("agent", "agent-delete", "agent-chat", "agent-evaluation")},
    **{name: Scoped("agent_run", lambda o: {"public_id": o["agent_run"].public_id}) for name in (
        "agent-run-detail", "agent-run-approve", "agent-run-cancel", "agent-run-events")},
    "agent-run": Scoped("agent_run", lambda o: {"run_id": o["agent_run"].public_id}),
    "agent-thread-variables": Scoped("agent_thread", lambda o: {"public_id": o["agent_thread"].public_id}),
    "agent-scenario-detail": _pk("scenario"), "agent-evaluation-detail": _pk("agent_eval"),
    "agent-evaluation-export": _pk("agent_eval"), "agent-evaluation-cancel": _pk("agent_eval"),
    "agent-evaluation-report": _pk("agent_eval", "evaluation_id"),
    "agent-evaluation-export-gui": _pk("agent_eval", "evaluation_id"),
    # agent_studio.workflows
    "workflow-list": LIST, "workflow-run-list": LIST, "workflow-validate": OWN, "workflows": LIST,
    **{name: _pk("workflow", "workflow_id") for name in ("workflow", "workflow-delete")},
    # The shipped templates (the same for every workspace); POST makes a workflow in the caller's own.
    "workflow-template-list": OWN,
    **{name: _pk("workflow") for name in ("workflow-detail", "workflow-run", "workflow-versions",
                                          "workflow-scenarios", "workflow-evaluations")},
    "workflow-delete-scenario": Scoped("workflow_scenario", lambda o: {"pk": o["workflow"].pk,
                                                                       "scenario_id": o["workflow_scenario"].pk}),
    **{name: _pk("workflow_eval") for name in ("workflow-evaluation-detail", "workflow-evaluation-cancel")},
    **{name: Scoped("workflow_run", lambda o: {"public_id": o["workflow_run"].public_id}) for name in (
        "workflow-run-detail", "workflow-run-cancel", "workflow-run-events")},
    # enhancement
    "enhancement": LIST, "enhancement-new-job": OWN, "enhancement-plan": OWN,
    "enhancement-dataset-list": LIST, "enhancement-dataset-sample": OWN,
    "enhancement-dataset-detail": _pk("dataset"), "enhancement-dataset-preview": _pk("dataset"),
    "enhancement-dataset": _pk("dataset", "dataset_id"),
    "enhancement-job-list": LIST, "enhancement-job-quantize": OWN,
    "enhancement-job-prune": OWN, "enhancement-job-distill": OWN,
    **{name: _pk("enhancement_job") for name in ("enhancement-job-detail", "enhancement-job-cancel",
                                                 "enhancement-job-deploy", "enhancement-job-log",
                                                 "enhancement-job-metrics")},
    **{name: _pk("enhancement_job", "job_id") for name in ("enhancement-job", "enhancement-job-live")},
}


def _patterns():
    """(key, name, route, callback) of every URL pattern but the admin's; a pattern without a name is keyed by its
    route. Two patterns sharing a name (a GUI page and an API route) are told apart by their route's first part."""

    def walk(patterns, prefix=""):
        for pattern in patterns:
            if isinstance(pattern, URLResolver):
                yield from walk(pattern.url_patterns, prefix + str(pattern.pattern))
            else:
                yield prefix + str(pattern.pattern), pattern

    seen = set()
    for route, pattern in walk(get_resolver().url_patterns):
        if route.startswith("admin/"):
            continue
        key = pattern.name or route
        if key in seen or (pattern.name and not route.startswith("api/") and f"{key}-gui" in MATRIX):
            key = f"{key}-gui"
        seen.add(key)
        yield key, pattern.name, route


def test_every_endpoint_is_in_the_matrix():
    missing = sorted({f"{key}  ({route})" for key, _, route in _patterns() if key not in MATRIX})
    assert not missing, "Endpoints without a tenancy-matrix entry:\n" + "\n".join(missing)


def _by_name() -> dict[str, tuple[str, str]]:
    return {key: (name, route) for key, name, route in _patterns()}


def _path(route: str, kwargs: dict) -> str:
    """The route filled in: a GUI page and an API route may share a URL name, so names cannot be reversed."""
    path = re.sub(r"\(\?P<(\w+)>[^)]*\)", lambda m: str(kwargs[m.group(1)]), route)
    path = re.sub(r"<(?:\w+:)?(\w+)>", lambda m: str(kwargs[m.group(1)]), path)
    return "/" + path.replace("^", "").replace("$", "")


@pytest.fixture
def tenancy(make_workspace, presets, settings):  # noqa: F811
    """Workspace A with one object of every kind, a member of B, and a viewer of A."""
    from agent_studio import services as agent_services
    from agent_studio.models import AgentEvalRun, AgentRun, AgentThread, Scenario
    from cluster import inventory
    from cluster.services import dispatch_job, register_node
    from enhancement import services as enhancement_services
    from enhancement.models import EnhancementJob
    from rag_studio import services as rag_services
    from rag_studio.models import EvalRun, EvalSet, RetrievalTuning
    from rag_studio.pipeline.ingestion import ingest
    from runtime import services as runtime_services
    from runtime.models import Channel, Trace
    from serving import services as serving_services
    from serving.groups import services as group_services
    from serving.models import CalibrationRun, RequestRecord
    from workbridge import services as workbridge_services
    from workbridge.models import ApiSpec, McpServer

    acme = make_workspace("Acme", owner="ann", vic="viewer")
    make_workspace("Globex", owner="bob")
    ann = Actor(user=acme.memberships.get(role="owner").user)
    node = register_node(name=settings.NODE_NAME, resources=inventory.probe())
    shared_smollm2 = serving_services.create_deployment(
        actor=SYSTEM, workspace=None, model=presets["smollm2-135m-instruct"], name="smollm2-135m-instruct",
        replicas=[(node, 1.0)])
    o = {"workspace": acme, "membership": acme.memberships.get(user__username="vic"),
         "api_key": create_api_key(actor=ann, workspace=acme, name="acme-key").api_key,
         "job": dispatch_job(actor=ann, workspace=acme, kind="node.inventory", node=node),
         "model": serving_services.register_model(actor=SYSTEM, workspace=acme, name="acme-smol",
                                                  path=str(presets["smollm2-135m-instruct"].path))}
    o["deployment"] = serving_services.create_deployment(actor=ann, workspace=acme, model=o["model"],
                                                         name="acme-chat", replicas=[(node, 1.0)])
    o["model_group"] = group_services.create_group(actor=ann, workspace=acme, name="acme-group", policy="route",
                                                   big=o["deployment"], small=shared_smollm2)
    o["calibration_run"] = CalibrationRun.objects.create(group=o["model_group"], workspace=acme, source="acme-prompts",
                                                         metric="token_f1", items=[{"prompt": "p", "reference": "r"}])
    o["request_record"] = RequestRecord.objects.create(deployment=o["deployment"], workspace=acme,
                                                       request_id=uuid.uuid4().hex, endpoint="chat/completions",
                                                       status=200)
    o["egress_rule"] = workbridge_services.add_egress_rule(actor=ann, workspace=acme, entry="10.9.0.0/16")
    o["secret"] = workbridge_services.set_secret(actor=ann, workspace=acme, name="acme_token", value="s3cret")
    o["tool"] = workbridge_services.save_tool(
        actor=ann, workspace=acme, name="lookup", description="Look a thing up.",
        parameters={"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]},
        config={"method": "GET", "url": "https://api.example.com/{q}"})
    o["spec"] = ApiSpec.objects.create(workspace=acme, title="acme-spec", source="upload",
                                       base_url="https://api.example.com", document={"openapi": "3.0.0"})
    o["mcp_server"] = McpServer.objects.create(workspace=acme, name="acme-mcp", transport="http",
                                               url="https://mcp.example.com/mcp")
    o["kb"] = rag_services.create_knowledge_base(actor=ann, workspace=acme, name="Acme docs")
    o["document"] = rag_services.upload_documents(actor=ann, kb=o["kb"], uploads=[
        sample("northwind-support-faq.md")])[0].document
    ingest(o["document"].pk, "pytest")
    o["config"] = rag_services.save_rag_config(actor=ann, workspace=acme, name="Acme QA", knowledge_base=o["kb"],
                                               template="citations", model="smollm2-135m-instruct")
    o["eval_set"] = EvalSet.objects.create(workspace=acme, knowledge_base=o["kb"], name="acme-set", source="upload")
    o["eval_run"] = EvalRun.objects.create(eval_set=o["eval_set"], config_version=o["config"].versions.first())
    o["tuning"] = RetrievalTuning.objects.create(workspace=acme, knowledge_base=o["kb"], eval_set=o["eval_set"],
                                                 status="done")
    o["app"] = runtime_services.publish_app(actor=ann, config=o["config"], slug="acme-app")
    o["app_key"] = runtime_services.create_app_key(actor=ann, app=o["app"], name="acme-app-key").app_key
    o["trace"] = Trace.objects.create(app=o["app"], release=o["app"].current_release, channel=Channel.CHAT,
                                      query="q", answer="a")
    o["asset"] = o["kb"].workspace.assets.first() if hasattr(acme, "assets") else None
    o["agent"] = agent_services.save_agent(actor=ann, workspace=acme, name="Acme agent", template="tool_calling",
                                           settings={"model": "smollm2-135m-instruct"})
    o["agent_thread"] = AgentThread.objects.create(agent=o["agent"], end_user="ann")
    o["agent_run"] = AgentRun.objects.create(workspace=acme, agent=o["agent"], version=o["agent"].versions.first(),
                                             thread=o["agent_thread"], caller="debug", input="hi")
    o["scenario"] = Scenario.objects.create(agent=o["agent"], name="acme-scenario", input="hi")
    o["agent_eval"] = AgentEvalRun.objects.create(agent=o["agent"], version=o["agent"].versions.first())
    from agent_studio.workflows import services as workflow_services
    from agent_studio.workflows.models import WorkflowRun
    o["workflow"] = workflow_services.save_workflow(actor=ann, workspace=acme, name="acme-flow", graph={
        "nodes": [{"id": "start", "kind": "start"}, {"id": "end", "kind": "answer", "settings": {"answer": "hi"}}],
        "edges": [{"from": "start", "to": "end"}]})
    o["workflow_run"] = WorkflowRun.objects.create(workspace=acme, workflow=o["workflow"], workflow_name="acme-flow",
                                                   version=o["workflow"].versions.first(), caller="debug")
    from agent_studio.workflows.models import WorkflowEvalRun, WorkflowScenario
    o["workflow_scenario"] = WorkflowScenario.objects.create(workflow=o["workflow"], name="acme-case")
    o["workflow_eval"] = WorkflowEvalRun.objects.create(workflow=o["workflow"],
                                                        version=o["workflow"].versions.first())
    o["dataset"] = enhancement_services.upload_dataset(
        actor=ann, workspace=acme, name="acme-data", filename="data.jsonl",
        content=b'{"instruction": "Say hi", "output": "Hi"}\n' * 12)
    o["enhancement_job"] = EnhancementJob.objects.create(workspace=acme, name="acme-job", kind="quantize", node=node,
                                                         base_model=o["model"])
    from assets.models import Asset
    o["asset"] = Asset.objects.filter(workspace=acme).first()
    return o


def _snapshot(objects: dict) -> dict:
    fresh = {}
    for kind, obj in objects.items():
        row = type(obj).objects.filter(pk=obj.pk).first()
        fresh[kind] = row and {k: v for k, v in model_to_dict(row).items() if k not in ("last_used_at",)}
    return fresh


def _clients(tenancy) -> tuple[APIClient, Client]:
    bob = Membership.objects.get(user__username="bob").user
    issued = create_api_key(actor=Actor(user=bob), workspace=bob.memberships.get().workspace, name="bob-key",
                            role="owner")
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Bearer {issued.secret}")
    gui = Client()
    gui.login(username="bob", password="correct-horse-battery")
    return api, gui


def _missing(kwargs: dict) -> dict:
    """The same URL for an object that does not exist."""
    def absent(value):
        if isinstance(value, uuid.UUID):
            return uuid.uuid4()
        return 987654321 if isinstance(value, int) else "no-such-object"

    return {name: absent(value) for name, value in kwargs.items()}


def _answer(client, method: str, path: str):
    response = getattr(client, method)(path, {}, format="json") if isinstance(client, APIClient) else \
        getattr(client, method)(path)
    return response.status_code, response.content if response.status_code < 500 else b""


def test_another_workspace_gets_404_for_every_object_on_every_endpoint(tenancy):
    """404 (or 405), or exactly what the same request gets for an object that does not exist (a body refused
    before the lookup): nothing tells A's object from a missing one."""
    api, gui = _clients(tenancy)
    before = _snapshot(tenancy)
    names, failures = _by_name(), []
    for key, entry in MATRIX.items():
        if not isinstance(entry, Scoped) or key not in names:
            continue
        _, route = names[key]
        kwargs = entry.kwargs(tenancy)
        path, missing = _path(route, kwargs), _path(route, _missing(kwargs))
        client = api if route.startswith("api/") else gui
        for method in ("get", "post", "put", "patch", "delete"):
            status, body = _answer(client, method, path)
            if status in (404, 405):
                continue
            if (status, body.replace(path.encode(), b"")) != tuple(
                    (s, b.replace(missing.encode(), b"")) for s, b in [_answer(client, method, missing)])[0]:
                failures.append(f"{method.upper()} {path} ({key}): {status}")
    assert not failures, "Another workspace reached A's objects:\n" + "\n".join(failures)
    assert _snapshot(tenancy) == before


def test_another_workspaces_lists_do_not_show_its_objects(tenancy):
    api, _ = _clients(tenancy)
    names = _by_name()
    leaked = []
    for key, entry in MATRIX.items():
        if entry is not LIST or key not in names or not names[key][1].startswith("api/"):
            continue
        body = api.get(_path(names[key][1], {})).content.decode()
        for marker in ("acme-key", "acme-chat", "acme-smol", "Acme docs", "Acme QA", "acme-app", "lookup",
                       "acme_token", "10.9.0.0", "Acme agent", "acme-data", "acme-job", "acme-spec", "acme-mcp",
                       "acme-group", "acme-prompts", "acme-flow"):
            if marker in body:
                leaked.append(f"{key}: {marker}")
    assert not leaked, "Another workspace's list showed A's objects:\n" + "\n".join(leaked)


def test_a_viewer_cannot_write_through_the_api(tenancy):
    owner = Membership.objects.get(user__username="ann").user
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION="Bearer " + create_api_key(
        actor=Actor(user=owner), workspace=tenancy["workspace"], name="viewer-key", role="viewer").secret)
    before = _snapshot(tenancy)
    names, failures = _by_name(), []
    for key, entry in MATRIX.items():
        if not isinstance(entry, Scoped) or key not in names or not names[key][1].startswith("api/"):
            continue
        path = _path(names[key][1], entry.kwargs(tenancy))
        for method in ("patch", "put", "delete"):
            status = getattr(api, method)(path, {}, format="json").status_code
            if status not in (403, 405):
                failures.append(f"{method.upper()} {path} ({key}): {status}")
    assert not failures, "A viewer wrote:\n" + "\n".join(failures)
    assert _snapshot(tenancy) == before


def test_a_removed_members_key_is_refused_everywhere(tenancy):
    owner = Actor(user=Membership.objects.get(user__username="ann").user)
    from accounts.services import remove_member
    vic = Membership.objects.get(user__username="vic")
    Membership.objects.filter(pk=vic.pk).update(role="developer")
    key = create_api_key(actor=Actor(user=vic.user), workspace=tenancy["workspace"], name="vic", role="viewer")
    remove_member(actor=owner, membership=vic)
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Bearer {key.secret}")
    assert ApiKey.objects.get(pk=key.api_key.pk).revoked_at is not None
    for path in ("/api/auth/me/", "/api/rag/knowledge-bases/", f"/api/rag/knowledge-bases/{tenancy['kb'].pk}/"):
        assert api.get(path).status_code == 401
