"""Every GUI page, crawled as a signed-in user would click through it, in English and in Chinese, over a workspace
holding an object of every kind in each state a user can reach (made through the services, as the product makes
them): no page answers 500, none is an unstyled error page, and no Chinese page leaves an English sentence
(tests/i18n/english.py, the detector of the Chromium walk, applied to every page). Every GUI URL pattern that
answers GET is reached, so a new page is crawled without anyone adding it here.

Left out of the English check: the values in event-log messages (.log-value: a worker, an address, an exception's
text; the words around them are the GUI's and are checked) and code (pre, code)."""

import io
import json
import os
import shutil
import sys
import time
from collections import deque
from urllib.parse import urldefrag, urlsplit

import pytest
from bs4 import BeautifulSoup
from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.files.uploadedfile import UploadedFile
from django.test import Client
from django.urls import Resolver404, resolve, reverse
from django.utils import translation

from accounts.services import SYSTEM, Actor, create_workspace
from agent_studio import demo, services as agents
from agent_studio.models import Scenario
from agent_studio.workflows.services import save_workflow
from cluster import inventory, log_messages as cluster_log
from cluster.models import JobState
from cluster.services import _transition, cancel_job as cancel_cluster_job, register_node, run_job
from enhancement import log_messages as enhancement_log, services as enhancement
from enhancement.runner import run_dir
from rag_studio import services as rag
from rag_studio.evals.evaluation import start_run, upload_eval_set
from rag_studio.evals.tuning import start_tuning
from rag_studio.pipeline.ingestion import ingest
from runtime.services import publish_app, start_rag_assistant
from serving import log_messages as serving_log, presets
from serving.groups import services as groups
from serving.models import Model, ServingState
from serving.services import _set_replica_state, create_deployment, register_model, stop_deployment
from tests.conftest import stop_engines_and_flush, tasks_to_unread_queue
from tests.i18n.english import english_sentences
from workbridge import services as workbridge

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("world")]
SAMPLES = settings.BASE_DIR / "rag_studio" / "samples"
# Content the product ships as data a user may edit (the demo agent, its tool and scenarios, the sample dataset's
# description): stored text, not GUI strings.
# The demo is made in the language active when the world is built: either language's texts are its data.
SHIPPED_DATA = [demo.TOOL_CODE, *(texts[field] for texts in demo.TEXTS.values()
                                  for field in ("tool_description", "description")),
                *(scenario[field] for texts in demo.TEXTS.values() for scenario in texts["scenarios"]
                  for field in ("name", "input")),
                "Short instruction/answer pairs shipped with AI Factory (English and Chinese)."]
# English that reaches a Chinese page from outside the GUI's strings, each with why it is still English (the work
# left, named): a test that meets any other English sentence fails.
KNOWN_ENGLISH = {
    # workbridge/mcp_client.py raises in its event-loop thread, where no request's language is active, and the
    # reason after the colon is the MCP SDK's own.
    "server could not be used": "the MCP client's failure message", "Connection closed": "the MCP SDK's reason",
}
# Where a user starts; every other page is reached by following links from these.
START_PAGES = ["/", "/dashboard/", "/rag/", "/rag/evals/", "/rag/configs/new/", "/agents/", "/tools/",
               "/tools/new/http/", "/tools/new/python/", "/tools/new/mcp/", "/tools/import/openapi/",
               "/tools/import/curl/", "/serving/", "/serving/playground/", "/serving/deployments/new/",
               "/serving/groups/new/", "/enhancement/", "/enhancement/jobs/new/", "/apps/", "/assets/", "/cluster/",
               "/keys/", "/settings/"]
# Pages reached from a link only once their object exists: build_world adds them (the wizard's indexing step).
DRAFT_PAGES: list[str] = []
# Addresses that are not GUI pages: the API and gateway, downloads, machine-read JSON, and leaving the session.
NOT_PAGES = ("/api/", "/v1/", "/static/", "/logout/", "/metrics", "/jsi18n/", "/healthz", "/language/")
# GUI URL patterns no GET reaches as a page, with why.
NOT_CRAWLED = {
    "logout": "ends the session", "choose-language": "POST only (the sidebar's language form)",
    "javascript-catalog": "JavaScript", "healthz": "a probe", "metrics": "Prometheus text",
    "revoke-api-key": "POST only", "remove-member": "POST only", "switch-workspace": "POST only",
    "deploy-model": "POST only", "delete-model": "POST only", "model-chat-template": "POST only",
    "deployment-state": "JSON the deployment page polls", "playground-chat": "POST only (streams)",
    "tool-try": "POST only", "tool-delete": "POST only", "spec-delete": "POST only", "secret-set": "POST only",
    "secret-delete": "POST only", "egress-rule-add": "POST only", "egress-rule-delete": "POST only",
    "mcp-server-add": "POST only", "mcp-server-delete": "POST only", "rag-kb-progress": "JSON the page polls",
    "rag-kb-upload": "POST only", "rag-kb-settings": "POST only", "rag-document-action": "POST only",
    "rag-config-chat-stream": "POST only (streams)", "rag-config-export": "a bundle download",
    "enhancement-job-live": "JSON the job page polls", "agent-delete": "POST only",
    "agent-evaluation-export": "a download", "cluster-set-quota": "POST only", "workflow-delete": "POST only",
    "app-export": "a bundle download",
    "app-monitoring-data": "JSON the monitoring page polls", "app-embed-script": "JavaScript",
    "assets-import": "POST only", "app-trace": "a conversation's trace: no conversation without a live model",
    "login": "signed in already (redirects)", "rag-config-chat": "redirects to the config page's chat",
    "create-workspace": "POST only (the sidebar's form)",
}


def _upload(name: str, content: bytes) -> UploadedFile:
    return UploadedFile(io.BytesIO(content), name=name, size=len(content))


def _finished_job(job, smollm2_path: str) -> None:
    """What a job's process leaves when it is done, taken up by the node's worker."""
    directory = run_dir(job)
    directory.mkdir(parents=True, exist_ok=True)
    output = directory / "model-q8_0.gguf"
    shutil.copyfile(smollm2_path, output)
    (directory / "result.json").write_text(json.dumps({
        "outputs": [{"quantization": "q8_0", "path": str(output), "size_bytes": os.path.getsize(output)}],
        "report": {"rows": [], "prompts": 0}}))
    run_job(job_id=job.cluster_job_id, worker="crawler")


@pytest.fixture(scope="module")
def world(django_db_setup, django_db_blocker, tmp_path_factory):
    """Made once for the module and committed (the crawls only read): emptied when the module ends."""
    with pytest.MonkeyPatch.context() as patch:
        # The MCP server's page reads the operator's catalogue, so it stays for the module.
        patch.setattr(settings, "MCP_COMMANDS_FILE", tmp_path_factory.mktemp("mcp") / "mcp-commands.toml")
        try:
            with django_db_blocker.unblock(), tasks_to_unread_queue():
                build_world()
            yield
        finally:
            with django_db_blocker.unblock():
                stop_engines_and_flush()


def build_world() -> None:
    """A workspace with an object of every kind, in every state the services lead to without a live model."""
    user = get_user_model().objects.create_user(username="ann", password="correct-horse-battery")
    owner = Actor(user=user)
    workspace = create_workspace(actor=owner, name="Acme")
    for name in (presets.MULTILINGUAL_E5, presets.MINILM, presets.SMOLLM2):  # MiniLM: the wizard's default
        locate, role, template = presets.PRESETS[name]
        register_model(actor=SYSTEM, workspace=None, name=name, path=str(locate()), role_hint=role,
                       chat_template=template)
    smollm2 = Model.objects.get(name=presets.SMOLLM2)
    node = register_node(name=settings.NODE_NAME, resources=inventory.probe())

    # Serving: a shared deployment, the workspace's in every state, a route and a cascade group (a speculative one
    # starts an engine of its own).
    shared = create_deployment(actor=SYSTEM, workspace=None, model=smollm2, name=presets.SMOLLM2)
    states = {}
    # What the engine's worker writes in each state's history.
    notes = {ServingState.READY: serving_log.ENGINE_ANSWERS(pid=4242, address="http://127.0.0.1:9", strategy="native"),
             ServingState.FAILED: serving_log.ENGINE_DIED(pid=4242, delay=2),
             ServingState.STOPPED: serving_log.ENGINE_STOPPED()}
    for state in (ServingState.PENDING, ServingState.READY, ServingState.FAILED, ServingState.STOPPED):
        deployment = create_deployment(actor=owner, workspace=workspace, model=smollm2, name=f"smol-{state}")
        replica = deployment.replicas.get()
        if state == ServingState.STOPPED:
            stop_deployment(actor=owner, deployment=deployment)
        if state != ServingState.PENDING:
            _set_replica_state(replica, state, notes[state], last_error="exit-status-1")
        states[state] = deployment
    groups.create_group(actor=owner, workspace=workspace, name="routed", policy="route", big=shared,
                        small=states[ServingState.READY])
    groups.create_group(actor=owner, workspace=workspace, name="cascaded", policy="cascade", big=shared,
                        small=states[ServingState.PENDING])

    # Tools: HTTP, Python (the demo agent's), a local MCP server from the operator's catalogue.
    workbridge.save_tool(actor=owner, workspace=workspace, name="weather", binding="http", description="查询天气",
                         parameters={"type": "object", "properties": {"city": {"type": "string",
                                                                               "description": "城市名"}},
                                     "required": ["city"]},
                         config={"method": "GET", "url": "https://weather.example.com/{city}"})
    settings.MCP_COMMANDS_FILE.write_text(f"[quick]\ncommand = [{json.dumps(sys.executable)}, '-c', 'pass']\n")
    workbridge.save_mcp_server(actor=owner, workspace=workspace, name="local", transport="stdio",
                               catalog_entry="quick")

    # RAG: an empty knowledge base, one with an indexed, a queued and a failed document, a config, an eval set.
    rag.create_knowledge_base(actor=owner, workspace=workspace, name="空库", embedding_model=presets.MULTILINGUAL_E5)
    kb = rag.create_knowledge_base(actor=owner, workspace=workspace, name="装置手册",
                                   embedding_model=presets.MULTILINGUAL_E5)
    samples = ["huadong-plant-handbook.md", "huadong-maintenance-rules.docx", "huadong-shift-handover.txt"]
    outcomes = rag.upload_documents(actor=owner, kb=kb, uploads=[
        *[_upload(name, (SAMPLES / name).read_bytes()) for name in samples],
        _upload("broken.pdf", b"%PDF-1.4 not really a pdf"),
        _upload("later.txt", "仍在排队的文档。".encode())])
    for outcome in outcomes[:4]:
        ingest(outcome.document.pk, "crawler")
    config = rag.save_rag_config(actor=owner, workspace=workspace, name="客服", knowledge_base=kb,
                                 template="citations", model=presets.SMOLLM2)
    # The create-app wizard's assistant, its document still being indexed.
    draft = start_rag_assistant(actor=owner, workspace=workspace, name="向导助手", model=presets.SMOLLM2,
                                uploads=[_upload("向导.txt", "向导上传的文档。".encode())])
    DRAFT_PAGES[:] = [reverse("new-app-indexing", kwargs={"config_id": draft.pk})]
    eval_set = upload_eval_set(actor=owner, kb=kb, name="questions", filename="huadong-eval.jsonl",
                               content=(SAMPLES / "huadong-eval.jsonl").read_bytes())
    start_run(actor=owner, eval_set=eval_set, version=config.versions.get())
    start_tuning(actor=owner, kb=kb, eval_set=eval_set, config=config, trials=5)

    # Agents: the demo agent, a scenario of every check kind, an evaluation queued and one cancelled.
    agent = demo.create_demo_agent(actor=owner, workspace=workspace, model=presets.SMOLLM2)
    for kind, check in {"not_contains": {"value": "error"}, "regex": {"value": r"\d+"},
                        "json_field": {"path": "words", "value": 4}, "judge": {"value": "Says a number"}}.items():
        agents.save_scenario(actor=owner, agent=agent, name=f"{kind} 检查", input="数一数“a b”。",
                             checks=[{"kind": kind, **check}])
    agents.start_run(actor=owner, agent=agent, input="数一数“a b c”。")  # its page, from the debug chat's list
    agents.start_evaluation(actor=owner, agent=agent)
    cancelled = agents.start_evaluation(actor=owner, agent=agent)
    agents.cancel_evaluation(actor=owner, evaluation=cancelled)
    agents.save_agent(actor=owner, workspace=workspace, name="planner", template="plan_execute",
                      settings={"model": presets.SMOLLM2})
    agents.save_agent(actor=owner, workspace=workspace, name="team", template="team",
                      settings={"model": presets.SMOLLM2, "sub_agents": [agent.pk]})
    assert Scenario.objects.filter(agent=agent).count() >= 8
    # Workflows: one with a branch, drawn on the canvas page.
    save_workflow(actor=owner, workspace=workspace, name="分流", graph={
        "inputs": [{"name": "ticket", "type": "string"}],
        "nodes": [{"id": "start", "kind": "start"},
                  {"id": "has_order", "kind": "condition", "settings": {"cases": [{"branch": "order", "rules": [
                      {"variable": "start.ticket", "op": "contains", "value": "订单"}]}]}},
                  {"id": "reply", "kind": "answer", "settings": {"answer": "{{start.ticket}}"}}],
        "edges": [{"from": "start", "to": "has_order"}, {"from": "has_order", "to": "reply", "branch": "order"},
                  {"from": "has_order", "to": "reply", "branch": "else"}]})

    # Apps: one on the RAG config, one on the agent.
    with translation.override("zh-hans"):  # published from the Chinese GUI: its first release note is Chinese
        publish_app(actor=owner, config=config, name="客服台", slug="support")
        publish_app(actor=owner, agent=agent, name="数词", slug="words")

    # Enhancement: the sample dataset; jobs queued, running, failed, cancelled and done, of every kind.
    dataset = enhancement.import_sample_dataset(actor=owner, workspace=workspace)
    tune = {"actor": owner, "workspace": workspace, "base_model": smollm2, "dataset": dataset, "node": node,
            "hyperparameters": {"max_steps": 2}, "quantizations": ["q8_0"]}
    enhancement.create_finetune_job(name="queued", **tune)
    running = enhancement.create_finetune_job(name="running", **tune)
    _transition(running.cluster_job, JobState.RUNNING, cluster_log.STARTED_ON(worker="crawler"))
    failed = enhancement.create_finetune_job(name="failed", **tune)
    _transition(failed.cluster_job, JobState.FAILED,
                enhancement_log.STOPPED_WITHOUT_FINISHING(log="RuntimeError: the base model could not be loaded"))
    cancelled_job = enhancement.create_finetune_job(name="cancelled", **tune)
    cancel_cluster_job(actor=owner, job=cancelled_job.cluster_job)
    _finished_job(enhancement.create_finetune_job(name="done", **tune), smollm2.path)
    enhancement.create_quantize_job(actor=owner, workspace=workspace, name="squeeze", base_model=smollm2, node=node,
                                    quantizations=["q4_k_m"])
    enhancement.create_prune_job(actor=owner, workspace=workspace, name="trim", base_model=smollm2, node=node,
                                 method="magnitude", sparsity=0.25)


def english_left(soup: BeautifulSoup) -> list[str]:
    """The English sentences a person reads: in each text node (the words of two elements side by side are not one
    sentence) and the attributes people read; event-log values, code and the shipped data aside."""
    for element in soup.select(".log-value, pre, code, script, style, textarea, template"):
        element.decompose()
    texts = list(soup.stripped_strings) + [element[name] for name in ("placeholder", "title", "aria-label", "alt")
                                           for element in soup.find_all(attrs={name: True})]
    found = []
    for text in texts:
        for data in SHIPPED_DATA:
            text = text.replace(data, "")
        found += [sentence for sentence in english_sentences(text) if sentence not in KNOWN_ENGLISH]
    return found


def _links(soup: BeautifulSoup) -> list[str]:
    found = []
    for anchor in soup.find_all("a", href=True):
        href, _ = urldefrag(anchor["href"])
        parts = urlsplit(href)
        if parts.scheme or parts.netloc or not parts.path.startswith("/") or parts.path.startswith(NOT_PAGES):
            continue
        found.append(href)
    return found


def crawl(client: Client) -> tuple[dict[str, list[str]], set[str], int]:
    """Every page reachable from the start pages: its problems by address, the URL patterns reached and the number
    of pages."""
    problems: dict[str, list[str]] = {}
    reached: set[str] = set()
    queue, seen = deque([*START_PAGES, *DRAFT_PAGES]), {*START_PAGES, *DRAFT_PAGES}
    while queue:
        path = queue.popleft()
        answer = client.get(path)
        try:
            reached.add(resolve(urlsplit(path).path).url_name)
        except Resolver404:
            pass
        found = []
        if answer.status_code >= 500:
            found.append(f"answered {answer.status_code}")
        if answer.status_code in (301, 302):
            target = answer["Location"]
            if target not in seen and not urlsplit(target).path.startswith(NOT_PAGES):
                seen.add(target)
                queue.append(target)
            continue
        if "text/html" in answer.get("Content-Type", ""):
            soup = BeautifulSoup(answer.content, "lxml")
            if not soup.find("link", rel="stylesheet"):
                found.append(f"an unstyled page ({answer.status_code})")
            for link in _links(soup):
                if link not in seen:
                    seen.add(link)
                    queue.append(link)
            if client.defaults.get("HTTP_ACCEPT_LANGUAGE") == "zh-hans":
                found += english_left(soup)
        if found:
            problems[path] = found
    return problems, reached, len(seen)


@pytest.mark.parametrize("language", ["en", "zh-hans"])
def test_every_page_answers_styled_and_the_chinese_pages_read_in_chinese(language):
    client = Client(HTTP_ACCEPT_LANGUAGE=language)
    client.login(username="ann", password="correct-horse-battery")

    began = time.monotonic()
    problems, reached, pages = crawl(client)
    print(f"\n{language}: {pages} pages of {len(reached)} URL patterns in {time.monotonic() - began:.1f} s")

    assert problems == {}, "\n".join(f"{path}: {found}" for path, found in problems.items())
    gui = {name for name, route in _gui_patterns()}
    missed = sorted(gui - reached - set(NOT_CRAWLED))
    assert not missed, f"GUI pages no link reached: {missed}"


def test_an_unknown_page_is_a_styled_404_in_both_languages():
    for language, words in (("en", "Page not found"), ("zh-hans", "页面")):
        client = Client(HTTP_ACCEPT_LANGUAGE=language)
        client.login(username="ann", password="correct-horse-battery")
        answer = client.get("/no-such-page/")
        soup = BeautifulSoup(answer.content, "lxml")
        assert answer.status_code == 404 and soup.find("link", rel="stylesheet")
        if language == "zh-hans":
            assert english_left(soup) == []


def _gui_patterns():
    from tests.security.test_tenancy_matrix import _patterns

    return [(name, route) for _key, name, route in _patterns() if name and not route.startswith(("api/", "v1/"))]
