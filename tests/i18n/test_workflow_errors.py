"""A workflow run's errors (a node's, the run's) are stored once, in English, by the worker that ran it, and read in
the reader's language: on the app's call trace and in the run's API record (`error_text`, next to the stored
`error`), with the values they carry (a node's id, a tool's name) as written.

The same fixtures as tests/runtime/test_workflow_apps.py: a real worker thread, the ASGI app API, the sandbox the
tool runs in."""

import pytest
from bs4 import BeautifulSoup
from django.test import Client

from agent_studio.workflows.models import NodeRun
from runtime.models import Trace
from tests.agent_studio import conftest as studio
from tests.i18n.english import english_sentences
from tests.runtime.test_workflow_apps import call, publish, worker  # noqa: F401  (worker: a fixture)

pytestmark = pytest.mark.django_db(transaction=True)
chat_deployment, acme, ann, dev, word_count = (studio.chat_deployment, studio.acme, studio.ann, studio.dev,
                                               studio.word_count)


def gated_graph(word_count_id: int) -> dict:
    """Count the question's words with the tool, then branch on an output the tool does not give."""
    return {"inputs": [{"name": "question", "type": "string"}],
            "nodes": [{"id": "start", "kind": "start"},
                      {"id": "count", "kind": "tool", "settings": {"tool": word_count_id,
                                                                   "arguments": {"text": "{{start.question}}"}}},
                      {"id": "gate", "kind": "condition", "settings": {"cases": [{"branch": "long", "rules": [
                          {"variable": "count.output.total", "op": "gt", "value": 3}]}]}},
                      {"id": "long", "kind": "answer", "settings": {"answer": "long"}},
                      {"id": "short", "kind": "answer", "settings": {"answer": "short"}}],
            "edges": [{"from": "start", "to": "count"}, {"from": "count", "to": "gate"},
                      {"from": "gate", "to": "long", "branch": "long"},
                      {"from": "gate", "to": "short", "branch": "else"}]}


def test_a_failed_nodes_error_reads_in_chinese_on_the_call_trace_and_in_the_run_record(dev, ann, word_count,
                                                                                      worker):  # noqa: F811
    key = publish(dev, gated_graph(word_count["id"]), "gated")
    assert call("/api/apps/gated/chat", {"query": "Where is order 42?"}, key).status_code == 502
    trace = Trace.objects.get()
    node_error = NodeRun.objects.get(run=trace.workflow_run, node_id="gate").error
    assert node_error == "'count.output.total' has no value: there is no 'total' in {\"words\": 4}."
    assert trace.error == f"Node 'gate' failed: {node_error}"
    in_chinese = "“count.output.total”没有值：{\"words\": 4} 中没有“total”。"

    reader = Client(HTTP_ACCEPT_LANGUAGE="zh-hans")
    reader.force_login(ann.user)
    page = BeautifulSoup(reader.get(f"/apps/gated/logs/{trace.public_id}/").content.decode(), "lxml")

    assert page.select_one(".msg.error").get_text() == f"节点“gate”失败：{in_chinese}"
    assert page.select("tr.node.failed td code")[-1].get_text() == in_chinese
    assert not english_sentences(page.select_one(".msg.error").get_text())
    record = dev.get(f"/api/workflows/runs/{trace.workflow_run.public_id}/", HTTP_ACCEPT_LANGUAGE="zh-hans").json()
    assert record["error"] == trace.error
    assert record["error_text"] == f"节点“gate”失败：{in_chinese}"
    assert [node["error_text"] for node in record["nodes"] if node["error"]] == [in_chinese]
