"""Issue 30, item 6: the privilege matrix, generated from the URL configuration like the tenancy matrix.

Every URL pattern has an entry in PRIVILEGES. An endpoint through which a user's input makes the host run, read or
load something is a HostAction: what it makes the host do, the least principal that may do it, and a request that
does it. The test sends each such request as every principal (a workspace key of each role, a platform
administrator signed in, the same administrator's ordinary workspace key, and their platform key) and asserts it is
allowed for exactly the principals at or above the least one, refused (403/404) for the rest. A GUI form that does
the same through the same service names the API row it shares (Gui). Every other endpoint says why it reaches no
further than the database. A new endpoint without an entry fails `test_every_endpoint_is_in_the_privilege_matrix`,
so whoever adds one decides what it lets a user do to the host.
"""

import ast
import io
import json
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from django.contrib.auth import get_user_model
from rest_framework.test import APIClient

from accounts.models import KeyScope, Role
from accounts.services import SYSTEM, Actor
from serving import services as serving_services
from serving.presets import GEMMA3, SMOLLM2, _smollm2_path
from tests.conftest import ROOT
from tests.rag_studio.conftest import presets  # noqa: F401  (the preset models, registered)
from tests.security.test_tenancy_matrix import _patterns
from workbridge import services as workbridge_services

pytestmark = pytest.mark.django_db

# Who may: a workspace role (and everyone above it, platform administrators included), a platform administrator
# (signed in, or through a platform key), or a platform administrator signed in only (a key may sit in any script).
PLATFORM, SIGNED_IN_PLATFORM = "platform", "signed-in platform administrator"
MEMBERS = [Role.VIEWER, Role.DEVELOPER, Role.ADMIN, Role.OWNER]
STAFF = ["staff signed in", "staff's workspace key", "platform key"]
PRINCIPALS = MEMBERS + STAFF


def allowed_principals(needs: str) -> set[str]:
    if needs == SIGNED_IN_PLATFORM:
        return {"staff signed in"}
    if needs == PLATFORM:
        return {"staff signed in", "platform key"}
    return set(MEMBERS[MEMBERS.index(needs):]) | set(STAFF)  # the staff principals own the workspace


@dataclass(frozen=True)
class HostAction:
    """What the endpoint makes the host do, who may, and `request(objects, suffix)` -> (method, path, body,
    format) doing it (suffix: a name no other principal's request uses)."""

    does: str
    needs: str
    request: object


@dataclass(frozen=True)
class Gui:
    """A GUI form or page doing what the named API row does, through the same service."""

    api: str


ROWS = "reads or writes the workspace's rows (or the caller's own), nothing of the host"
PUBLIC = "public or platform-wide by design, reads nothing a user names"
EDGE = "served by the edge (gateway, app API): calls engines the platform started, with the caller's key"


def _json(method, path, body=None):
    return method, path, body or {}, "json"


def _upload(path, filename, content, **fields):
    handle = io.BytesIO(content)
    handle.name = filename
    return "post", path, {"file": handle, **fields}, "multipart"


def _shared_deployment(objects, suffix):
    """A shared deployment of its own for each principal's delete, so that one allowed delete leaves the next
    principal something to be refused or allowed on."""
    return serving_services.create_deployment(actor=SYSTEM, workspace=None, model=objects["shared_model"],
                                              name=f"shared-{suffix}")


ALPACA = b'{"instruction": "Say hi", "output": "Hi"}\n' * 12
CODE_WORKFLOW = {"nodes": [{"id": "start", "kind": "start"},
                           {"id": "code", "kind": "code", "settings": {"code": "def run(args):\n    return 'ok'\n"}},
                           {"id": "end", "kind": "answer", "settings": {"answer": "{{code.output}}"}}],
                 "edges": [{"from": "start", "to": "code"}, {"from": "code", "to": "end"}]}

PRIVILEGES: dict[str, object] = {
    # Work Bridge: local MCP commands, python code, URLs fetched through the egress guard.
    "mcp-server-list": HostAction(
        "registers a local MCP command from the operator's catalogue (run sandboxed when used)", Role.ADMIN,
        lambda o, s: _json("post", "/api/workbridge/mcp-servers/",
                           {"name": f"catalogued-{s}", "transport": "stdio", "catalog_entry": "quick"})),
    "mcp-server-detail": HostAction(
        "changes a local MCP server to a free-form command (run sandboxed)", SIGNED_IN_PLATFORM,
        lambda o, s: _json("put", f"/api/workbridge/mcp-servers/{o['server'].pk}/",
                           {"name": "quick", "transport": "stdio", "command": [sys.executable, "-c", "import sys"]})),
    "mcp-server-tools": HostAction(
        "starts a registered local MCP server in the sandbox and lists its tools", Role.DEVELOPER,
        lambda o, s: _json("get", f"/api/workbridge/mcp-servers/{o['server'].pk}/tools/")),
    "mcp-server-import-tools": HostAction(
        "starts a registered local MCP server in the sandbox and imports its tools", Role.DEVELOPER,
        lambda o, s: _json("post", f"/api/workbridge/mcp-servers/{o['server'].pk}/import/", {"tools": []})),
    "tool-list": HostAction(
        "saves python code the sandbox will run", Role.DEVELOPER,
        lambda o, s: _json("post", "/api/workbridge/tools/", {
            "name": f"code_{s}", "description": "Code.", "binding": "python", "parameters": {"type": "object"},
            "config": {"code": "def run(args):\n    return 'ok'\n"}})),
    "tool-detail": HostAction(
        "changes python code the sandbox will run", Role.DEVELOPER,
        lambda o, s: _json("patch", f"/api/workbridge/tools/{o['tool'].pk}/",
                           {"config": {"code": f"def run(args):\n    return '{s}'\n"}})),
    "tool-invoke": HostAction(
        "runs python code in the sandbox (time, memory, processes and files limited; no network)", Role.DEVELOPER,
        lambda o, s: _json("post", f"/api/workbridge/tools/{o['tool'].pk}/invoke/", {"arguments": {}})),
    "api-spec-preview": HostAction(
        "fetches a spec from a URL through the egress guard", Role.DEVELOPER,
        lambda o, s: _json("post", "/api/workbridge/specs/preview/", {"url": "http://127.0.0.1:9/openapi.json"})),
    "api-spec-list": HostAction(
        "fetches and stores a spec from a URL through the egress guard", Role.DEVELOPER,
        lambda o, s: _json("post", "/api/workbridge/specs/", {"url": "http://127.0.0.1:9/openapi.json"})),
    # Serving: model files, chat templates (Jinja the engine renders), engine processes.
    "model-list": HostAction(
        "reads a model file on the server (its GGUF header by our own bounded reader), in FACTORY_MODEL_DIRS only",
        PLATFORM, lambda o, s: _json("post", "/api/serving/models/",
                                     {"name": f"file-{s}", "path": str(_smollm2_path())})),
    "model-chat-template": HostAction(
        "sets the chat template (Jinja the engine renders) of a model every workspace shares", PLATFORM,
        lambda o, s: _json("post", f"/api/serving/models/{o['shared_model'].pk}/chat-template/",
                           {"chat_template": "{{ messages[0].content }}"})),
    "model-deploy": HostAction(
        "starts an engine process on a node for the workspace's own model", Role.DEVELOPER,
        lambda o, s: _json("post", f"/api/serving/models/{o['own_model'].pk}/deploy/",
                           {"name": f"own-{s}", "start": False})),
    "deployment-list": HostAction(
        "starts an engine process on a node for the workspace", Role.DEVELOPER,
        lambda o, s: _json("post", "/api/serving/deployments/",
                           {"model": o["own_model"].name, "name": f"dep-{s}", "start": False})),
    "deployment-stop": HostAction(
        "stops the engine processes of a deployment every workspace shares", PLATFORM,
        lambda o, s: _json("post", f"/api/serving/deployments/{SMOLLM2}/stop/")),
    "deployment-start": HostAction(
        "starts the engine processes of a deployment every workspace shares", PLATFORM,
        lambda o, s: _json("post", f"/api/serving/deployments/{SMOLLM2}/start/")),
    "deployment-detail": HostAction(
        "stops the engine processes of a deployment every workspace shares and removes it (GET: reads its row)",
        PLATFORM, lambda o, s: _json("delete", f"/api/serving/deployments/{_shared_deployment(o, s).name}/")),
    "deployment-routing": HostAction(
        "changes how the gateway spreads every workspace's traffic over a shared deployment", PLATFORM,
        lambda o, s: _json("patch", f"/api/serving/deployments/{SMOLLM2}/routing/", {"cooldown_s": 7})),
    # Files a user sends that the host parses or unpacks.
    "knowledge-base-documents": HostAction(
        "stores and parses uploaded documents (pypdf, python-docx, openpyxl; hostile-file limits)", Role.DEVELOPER,
        lambda o, s: _upload(f"/api/rag/knowledge-bases/{o['kb'].pk}/documents/", f"note-{s}.md", b"# Hi\n")),
    "enhancement-dataset-list": HostAction(
        "stores and parses an uploaded training dataset", Role.DEVELOPER,
        lambda o, s: _upload("/api/enhancement/datasets/", f"data-{s}.jsonl", ALPACA, name=f"data-{s}")),
    "enhancement-job-list": HostAction(
        "starts a training process (transformers loads the base; trust_remote_code is never on)", Role.DEVELOPER,
        lambda o, s: _json("post", "/api/enhancement/jobs/", {
            "name": f"tune-{s}", "base_model": o["own_model"].name, "dataset": o["dataset"].pk,
            "hyperparameters": {"max_steps": 1}})),
    "api-asset-import": HostAction(
        "unpacks an uploaded bundle (signature checked first, size and paths limited)", Role.DEVELOPER,
        lambda o, s: _upload("/api/assets/import/", f"bundle-{s}.zip", b"PK\x05\x06" + b"\x00" * 18)),
    # GUI forms and pages doing what an API row does, through the same service.
    "mcp-server-add": Gui("mcp-server-list"), "mcp-server": Gui("mcp-server-tools"),
    "tool-new": Gui("tool-list"), "tool": Gui("tool-detail"), "tool-try": Gui("tool-invoke"),
    "tools-import-openapi": Gui("api-spec-list"), "tools-import-curl": Gui("tool-list"),
    "tool-from-curl": Gui("tool-list"),
    "serving": Gui("model-list"), "model-chat-template-gui": Gui("model-chat-template"),
    "deploy-model": Gui("model-deploy"), "create-deployment": Gui("deployment-list"),
    "deployment": Gui("deployment-stop"),
    "rag-kb-upload": Gui("knowledge-base-documents"), "rag-kb": Gui("knowledge-base-documents"),
    # The "create an app" wizard uploads its documents into a new knowledge base.
    "new-app": Gui("knowledge-base-documents"),
    "enhancement": Gui("enhancement-dataset-list"), "enhancement-new-job": Gui("enhancement-job-list"),
    "enhancement-job-quantize": Gui("enhancement-job-list"), "enhancement-job-prune": Gui("enhancement-job-list"),
    "enhancement-job-distill": Gui("enhancement-job-list"), "enhancement-job-deploy": Gui("model-deploy"),
    "assets-import": Gui("api-asset-import"),
    # Workflows: a code node's python runs in the sandbox, an http node's URL goes through the egress guard.
    "workflow-list": HostAction(
        "saves a workflow whose code node the sandbox will run", Role.DEVELOPER,
        lambda o, s: _json("post", "/api/workflows/", {"name": f"code-{s}", "graph": CODE_WORKFLOW})),
    "workflow-detail": HostAction(
        "changes a workflow whose code node the sandbox will run", Role.DEVELOPER,
        lambda o, s: _json("put", f"/api/workflows/{o['workflow'].pk}/", {"name": "flow", "graph": CODE_WORKFLOW})),
    "workflow-run": HostAction(
        "queues a run whose code nodes run in the sandbox and http nodes call URLs through the egress guard",
        Role.DEVELOPER, lambda o, s: _json("post", f"/api/workflows/{o['workflow'].pk}/run/", {"inputs": {}})),
    "workflow-template-list": HostAction(
        "makes a workflow from a shipped template, whose code nodes the sandbox will run", Role.DEVELOPER,
        lambda o, s: _json("post", "/api/workflows/templates/", {"template": "document-review", "name": f"review-{s}",
                                                                  "bindings": {"model": SMOLLM2}})),
    "workflow-evaluations": HostAction(
        "queues an evaluation whose runs execute the workflow's code nodes in the sandbox", Role.DEVELOPER,
        lambda o, s: _json("post", f"/api/workflows/{o['workflow'].pk}/evaluations/", {})),
    # The edge and public pages.
    "v1/^(?P<path>.*)$": EDGE, "api/apps/<slug:slug>/<path:endpoint>": EDGE, "app-chat": EDGE,
    "app-feedback": EDGE, "": PUBLIC,
    **dict.fromkeys("""healthz login logout api-login api-logout javascript-catalog choose-language schema api-docs
        api/^ metrics node-list node-detail api-instance-key app-embed-script app-widget mcp-server-catalogue
        """.split(), PUBLIC),
}
PRIVILEGES.update({key: ROWS for key in """
    dashboard model-detail api-me workspace-list workspace-detail member-list member-detail api-key-list api-key-detail
    api-key-revoke audit-list job-list job-detail job-cancel asset-list asset-detail
    deployment-engine deployment-events deployment-metrics deployment-requests request-record-detail
    model-group-list model-group-detail model-group-calibrate model-group-calibrations model-group-requests
    model-group-share calibration-run-detail calibration-run-pick egress-rule-list egress-rule-detail
    tool-invocations secret-list secret-detail api-spec-detail mcp-server-delete spec-delete tool-delete
    knowledge-base-list knowledge-base-detail knowledge-base-hit-test knowledge-base-reindex rag-document-list
    rag-document-detail rag-document-chunks rag-document-retry rag-document-cancel rag-config-list rag-config-detail
    rag-config-export rag-config-run rag-config-versions eval-set-list eval-set-detail eval-set-items eval-run-list
    eval-run-detail eval-run-results rag-tuning-list rag-tuning-detail rag-tuning-apply rag-tuning-cancel
    rag-tuning-resume rag-tuning-rollback
    eval-set-cancel eval-run-cancel calibration-run-cancel agent-evaluation-cancel
    enhancement-dataset-sample enhancement-dataset-detail enhancement-dataset-preview enhancement-job-detail
    enhancement-job-cancel enhancement-job-log enhancement-job-metrics enhancement-plan agent-run-detail
    agent-run-approve agent-run-cancel agent-run-events agent-thread-variables agent-scenario-detail
    agent-evaluation-detail agent-evaluation-export agent-list agent-detail agent-evaluations agent-runs
    agent-scenarios agent-suggest-strategy agent-versions agent-templates agent-run-list app-list app-detail app-export
    app-feedback-dataset app-keys app-monitoring app-publish app-releases app-revoke-key app-rollback
    app-rotate-widget-token app-to-eval app-traces switch-workspace create-workspace api-keys revoke-api-key
    settings remove-member cluster assets deployment-state delete-model create-model-group model-group playground
    playground-chat tools secret-set secret-delete egress-rule-add egress-rule-delete rag rag-kb-progress
    rag-kb-settings rag-hit-test rag-document rag-document-action rag-config-new rag-config rag-config-chat
    rag-config-export-gui rag-config-chat-stream rag-evals rag-eval-run rag-tuning enhancement-dataset
    enhancement-job enhancement-job-live agents agent agent-delete agent-chat agent-evaluation
    agent-evaluation-report agent-evaluation-export-gui agent-run apps app app-export-gui app-logs app-trace
    workflow-validate workflow-versions workflow-run-list workflow-run-detail workflow-run-events workflow-run-cancel
    workflow-scenarios workflow-delete-scenario workflow-evaluation-detail workflow-evaluation-cancel
    workflows workflow workflow-delete app-monitoring-gui app-monitoring-data new-app-indexing
    pool quota-list cluster-set-quota""".split()})


def test_every_endpoint_is_in_the_privilege_matrix():
    missing = sorted({f"{key}  ({route})" for key, _, route in _patterns() if key not in PRIVILEGES})
    assert not missing, "Endpoints without a privilege-matrix entry:\n" + "\n".join(missing)
    dangling = sorted(entry.api for entry in PRIVILEGES.values()
                      if isinstance(entry, Gui) and not isinstance(PRIVILEGES.get(entry.api), HostAction))
    assert not dangling, f"GUI rows naming no HostAction: {dangling}"


@pytest.fixture
def principals(make_workspace, presets, settings, tmp_path):  # noqa: F811
    """Acme with a member of every role and a staff user who owns it too; the objects the requests act on."""
    from agent_studio.workflows import services as workflow_services
    from cluster import inventory
    from cluster.services import register_node
    from enhancement import services as enhancement_services
    from rag_studio import services as rag_services

    settings.MODEL_DIRS = [_smollm2_path().parent]
    settings.MCP_COMMANDS_FILE = tmp_path / "mcp-commands.toml"
    # A server that exits at once: starting it costs nothing, and a 400 (it went away) is past the role check.
    settings.MCP_COMMANDS_FILE.write_text(f"[quick]\ncommand = [{json.dumps(sys.executable)}, '-c', 'import sys']\n")
    acme = make_workspace("Acme", owner="ann", vic=Role.VIEWER, dev=Role.DEVELOPER, ada=Role.ADMIN)
    users = get_user_model().objects
    users.create_user(username="sam", password="correct-horse-battery", is_staff=True)
    ann = Actor(user=users.get(username="ann"))
    from accounts.services import add_member, create_api_key
    add_member(actor=ann, workspace=acme, username="sam", role=Role.OWNER)

    def key(username, role, scope=KeyScope.WORKSPACE):
        issued = create_api_key(actor=Actor(user=users.get(username=username)), workspace=acme, name=f"{username}",
                                role=role, scope=scope)
        client = APIClient()
        client.credentials(HTTP_AUTHORIZATION=f"Bearer {issued.secret}")
        return client

    def session(username):
        client = APIClient()
        client.login(username=username, password="correct-horse-battery")
        client.credentials(HTTP_X_WORKSPACE=acme.slug)
        return client

    # A viewer may make no key: the viewer signs in.
    clients = {Role.VIEWER: session("vic"), Role.DEVELOPER: key("dev", Role.DEVELOPER),
               Role.ADMIN: key("ada", Role.ADMIN), Role.OWNER: key("ann", Role.OWNER),
               "staff signed in": session("sam"),
               "staff's workspace key": key("sam", Role.OWNER),
               "platform key": key("sam", Role.OWNER, KeyScope.PLATFORM)}
    node = register_node(name=settings.NODE_NAME, resources=inventory.probe())
    serving_services.create_deployment(actor=SYSTEM, workspace=None, model=presets[SMOLLM2], name=SMOLLM2,
                                       replicas=[(node, 1.0)])
    objects = {
        "server": workbridge_services.save_mcp_server(actor=ann, workspace=acme, name="quick", transport="stdio",
                                                      catalog_entry="quick"),
        "tool": workbridge_services.save_tool(actor=ann, workspace=acme, name="code", description="Code.",
                                              binding="python", parameters={"type": "object"},
                                              config={"code": "def run(args):\n    return 'ok'\n"}),
        "shared_model": presets[GEMMA3],
        "own_model": serving_services.register_model(actor=SYSTEM, workspace=acme, name="acme-smol",
                                                     path=str(_smollm2_path())),
        "kb": rag_services.create_knowledge_base(actor=ann, workspace=acme, name="Acme docs"),
        "dataset": enhancement_services.upload_dataset(actor=ann, workspace=acme, name="acme-data",
                                                       filename="data.jsonl", content=ALPACA),
        "workflow": workflow_services.save_workflow(actor=ann, workspace=acme, name="flow", graph=CODE_WORKFLOW),
    }
    return clients, objects


def _send(client: APIClient, method: str, path: str, body, format_: str) -> int:
    if format_ == "multipart":
        return getattr(client, method)(path, body, format="multipart").status_code
    return getattr(client, method)(path, body, format="json").status_code


def test_each_host_action_is_allowed_exactly_from_its_least_principal_up(principals):
    clients, objects = principals
    wrong = []
    for key, entry in PRIVILEGES.items():
        if not isinstance(entry, HostAction):
            continue
        allowed = allowed_principals(entry.needs)
        for number, principal in enumerate(PRINCIPALS):
            method, path, body, format_ = entry.request(objects, f"{number}")
            status = _send(clients[principal], method, path, body, format_)
            refused = status in (403, 404)
            if status == 401 or status >= 500 or refused == (principal in allowed):
                verdict = "refused" if refused else f"allowed ({status})"
                wrong.append(f"{key} as {principal}: {verdict}, but it {entry.does} and needs {entry.needs}")
    assert not wrong, "The privilege matrix does not hold:\n" + "\n".join(wrong)


def test_no_model_or_tokenizer_is_ever_loaded_with_remote_code():
    """transformers runs a model directory's own Python only with trust_remote_code; the platform never passes it
    (a user's model directory or a fine-tune's base would otherwise run its code on the host)."""
    offenders = []
    for path in ROOT.glob("*/**/*.py"):
        if path.parts[len(ROOT.parts)] in ("tests", ".venv", "bench", "node_modules") or ".venv" in path.parts:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.keyword) and node.arg == "trust_remote_code" and not (
                    isinstance(node.value, ast.Constant) and node.value.value is False):
                offenders.append(f"{Path(path).relative_to(ROOT)}:{node.value.lineno}")
    assert not offenders, f"trust_remote_code set to something but False: {offenders}"
