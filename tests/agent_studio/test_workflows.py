"""Workflows built and run through the API: a support-triage flow on the scripted model with a real Work Bridge
tool in the sandbox, every validation error as a 400 naming the node, node failures recorded (a code node that
times out or returns 10 MB, a condition on a variable that has no value, an iteration over too many items), the
error policies, a run taken over after its worker died, and cancel."""

import pytest
from django.utils import timezone
from langchain_core.messages import AIMessage

from accounts.cancellation import Cancellation
from agent_studio.models import AgentRun
from agent_studio.runs import leases
from agent_studio.runs.fields import RunStatus
from agent_studio.workflows import nodes, runner
from agent_studio.workflows.models import NodeRun, WorkflowRun
from tests.agent_studio.conftest import MODEL, Script, ScriptedModel
from tests.rag_studio.conftest import presets  # noqa: F401  (the preset models, registered)
from workbridge.models import Invocation

pytestmark = pytest.mark.django_db(transaction=True)
WORKFLOWS = "/api/workflows/"


@pytest.fixture
def replies(monkeypatch):
    script = Script()
    monkeypatch.setattr(nodes, "gateway_model", lambda **kwargs: ScriptedModel(
        script=script, prompts=script.prompts, offered=script.offered))
    return script


@pytest.fixture
def handbook(acme, ann, presets):  # noqa: F811
    from rag_studio import services as rag_services

    return rag_services.create_knowledge_base(actor=ann, workspace=acme, name="Handbook")


def _graph(nodes_, edges, inputs=None) -> dict:
    return {"inputs": inputs if inputs is not None else [{"name": "question", "type": "string"}],
            "nodes": [{"id": "start", "kind": "start"}, *nodes_], "edges": edges}


def _chain(*node_ids) -> list[dict]:
    return [{"from": a, "to": b} for a, b in zip(node_ids, node_ids[1:])]


def _answer(text="{{start.question}}", node_id="reply") -> dict:
    return {"id": node_id, "kind": "answer", "settings": {"answer": text}}


def _save(dev, graph, name="flow"):
    return dev.post(WORKFLOWS, {"name": name, "graph": graph}, format="json")


def _run(dev, workflow: dict, **inputs) -> WorkflowRun:
    response = dev.post(f"{WORKFLOWS}{workflow['id']}/run/", {"inputs": inputs}, format="json")
    assert response.status_code == 202, response.json()
    return run_inline(response.json()["run_id"])


def run_inline(run_id, owner="test-worker") -> WorkflowRun:
    pk = WorkflowRun.objects.get(public_id=run_id).pk
    runner.execute(pk, owner=owner)
    return WorkflowRun.objects.get(pk=pk)


def _statuses(run) -> dict:
    return {row.node_id: row.status for row in NodeRun.objects.filter(run=run)}


def _triage(word_count: dict, handbook) -> dict:
    return _graph([
        {"id": "triage", "kind": "classifier", "settings": {"model": MODEL, "query": "{{start.question}}",
                                                            "classes": ["order", "policy"]}},
        {"id": "lookup", "kind": "tool", "settings": {"tool": word_count["id"],
                                                      "arguments": {"text": "{{start.question}}"}}},
        {"id": "order_reply", "kind": "llm", "settings": {"model": MODEL,
                                                          "prompt": "The ticket has {{lookup.output.words}} words."}},
        {"id": "handbook", "kind": "knowledge", "settings": {"knowledge_base": handbook.pk,
                                                            "query": "{{start.question}}"}},
        {"id": "policy_reply", "kind": "llm", "settings": {"model": MODEL, "prompt": "{{handbook.output}}"}},
        {"id": "merge", "kind": "aggregator", "settings": {"variables": ["order_reply.output",
                                                                         "policy_reply.output"]}},
        _answer("{{merge.output}}")],
        [{"from": "start", "to": "triage"}, {"from": "triage", "to": "lookup", "branch": "order"},
         {"from": "triage", "to": "handbook", "branch": "policy"}, *_chain("lookup", "order_reply", "merge"),
         *_chain("handbook", "policy_reply", "merge"), {"from": "merge", "to": "reply"}])


def test_a_support_triage_flow_classifies_calls_the_tool_and_answers_with_a_trace_per_node(dev, word_count,
                                                                                           handbook, replies):
    saved = _save(dev, _triage(word_count, handbook), name="triage")
    assert saved.status_code == 201, saved.json()
    replies.extend(['{"class": "order"}', "Your ticket has 5 words."])

    run = _run(dev, saved.json(), question="Where is my order 42?")

    assert (run.status, run.answer) == (RunStatus.DONE, "Your ticket has 5 words."), run.error
    assert _statuses(run) == {"start": "done", "triage": "done", "lookup": "done", "order_reply": "done",
                              "handbook": "skipped", "policy_reply": "skipped", "merge": "done", "reply": "done"}
    assert replies.prompts[1][-1].content == "The ticket has 5 words."
    assert Invocation.objects.get().caller == "workflow:triage"
    detail = dev.get(f"{WORKFLOWS}runs/{run.public_id}/").json()
    lookup = next(node for node in detail["nodes"] if node["node"] == "lookup")
    assert lookup["outputs"] == {"output": {"words": 5}} and lookup["latency_ms"] > 0
    assert lookup["inputs"]["arguments"] == {"text": "Where is my order 42?"}
    body = b"".join(dev.get(f"{WORKFLOWS}runs/{run.public_id}/events/")).decode()
    events = [line[len("event: "):] for line in body.splitlines() if line.startswith("event: ")]
    # Each node that ran: its start and its record; each skipped node: its record; and the tokens of the model
    # whose text is the answer (through the aggregator), as it wrote them.
    assert [event for event in events if event != "token"] == ["status", "status", *["node"] * (6 * 2 + 2), "done"]
    assert events.count("token") == 5
    assert '"answer": "Your ticket has 5 words."' in body.split("event: done")[1]


def test_every_save_that_changes_the_graph_is_a_version(dev):
    graph = _graph([_answer()], _chain("start", "reply"))
    first = _save(dev, graph).json()
    again = dev.put(f"{WORKFLOWS}{first['id']}/", {"name": "flow", "graph": graph}, format="json").json()
    graph["nodes"][1]["settings"]["answer"] = "Hi {{start.question}}"
    changed = dev.put(f"{WORKFLOWS}{first['id']}/", {"name": "flow", "graph": graph}, format="json").json()
    assert (first["version"], again["version"], changed["version"]) == (1, 1, 2)
    assert [v["number"] for v in dev.get(f"{WORKFLOWS}{first['id']}/versions/").json()] == [2, 1]


def test_where_the_nodes_are_drawn_is_kept_for_everyone_without_making_a_version(dev):
    graph = _graph([_answer()], _chain("start", "reply"))
    first = _save(dev, graph).json()
    assert first["layout"] == {}
    url = f"{WORKFLOWS}{first['id']}/"

    moved = dev.put(url, {"layout": {"start": {"x": 40, "y": 60}, "reply": {"x": 320.25, "y": 60}}}, format="json")

    assert moved.status_code == 200, moved.json()
    assert (moved.json()["version"], moved.json()["layout"]["reply"]) == (1, {"x": 320.2, "y": 60})
    assert dev.get(url).json()["layout"] == moved.json()["layout"]
    assert [v["number"] for v in dev.get(f"{WORKFLOWS}{first['id']}/versions/").json()] == [1]
    # Saving the graph without a layout keeps it; with one, the places of nodes the graph lost are dropped.
    graph["nodes"][1]["settings"]["answer"] = "Hi {{start.question}}"
    assert dev.put(url, {"name": "flow", "graph": graph}, format="json").json()["layout"] == moved.json()["layout"]
    saved = dev.put(url, {"name": "flow", "graph": graph, "layout": {"start": {"x": 0, "y": 0},
                                                                     "gone": {"x": 9, "y": 9}}}, format="json")
    assert saved.json()["layout"] == {"start": {"x": 0, "y": 0}}


@pytest.mark.parametrize(("layout", "problem"), [
    ([1, 2], "'layout' must be an object of node id"),
    ({"start": {"x": "left", "y": 0}}, "'layout': the place of start must be"),
    ({"start": [10, 20]}, "'layout': the place of start must be"),
])
def test_a_bad_layout_is_a_400_naming_the_node(dev, layout, problem):
    first = _save(dev, _graph([_answer()], _chain("start", "reply"))).json()
    refused = dev.put(f"{WORKFLOWS}{first['id']}/", {"layout": layout}, format="json")
    assert refused.status_code == 400 and problem in refused.json()["error"]["message"]


@pytest.mark.parametrize(("nodes_", "edges", "problem"), [
    ([_answer("{{ghost.output}}")], _chain("start", "reply"), "Node 'reply': 'ghost.output' refers to node 'ghost', "
                                                              "which the workflow does not have."),
    ([_answer("{{later.output}}"), {"id": "later", "kind": "template", "settings": {"template": "x"}}],
     _chain("start", "reply", "later"), "Node 'reply': 'later.output' refers to node 'later', which is not upstream"),
    ([_answer("{{start.missing}}")], _chain("start", "reply"), "Node 'reply': 'start.missing' is not an input"),
    ([{"id": "t", "kind": "template", "settings": {"template": "x"}}, _answer("{{t.output.field}}")],
     _chain("start", "t", "reply"), "Node 'reply': 't.output' is a string; it has no field 'field'."),
    ([{"id": "each", "kind": "iteration", "settings": {"items": "start.question", "do": {
        "kind": "template", "settings": {"template": "{{item.value}}"}}}}, _answer()],
     _chain("start", "each", "reply"), "Node 'each': iterates over 'start.question', a string, not a list."),
    ([{"id": "a", "kind": "template", "settings": {"template": "x"}},
      {"id": "b", "kind": "template", "settings": {"template": "y"}}, _answer()],
     [*_chain("start", "a", "b", "a"), {"from": "b", "to": "reply"}], "the edges form a cycle"),
    ([_answer(), {"id": "island", "kind": "template", "settings": {"template": "x"}}], _chain("start", "reply"),
     "Node 'island': no path from the start node reaches it."),
    ([{"id": "t", "kind": "template", "settings": {"template": "x"}}], _chain("start", "t"),
     "a workflow needs an answer node"),
    ([_answer()], [], "Node 'reply': no path from the start node reaches it."),
    ([{"id": "look", "kind": "tool", "settings": {"tool": 999999}}, _answer()], _chain("start", "look", "reply"),
     "Node 'look': tool 999999 does not exist in this workspace"),
    ([{"id": "kb", "kind": "knowledge", "settings": {"knowledge_base": 999999, "query": "q"}}, _answer()],
     _chain("start", "kb", "reply"), "Node 'kb': knowledge base 999999 does not exist"),
    ([{"id": "think", "kind": "llm", "settings": {"model": "no-such-model", "prompt": "hi"}}, _answer()],
     _chain("start", "think", "reply"), "Node 'think': No deployment named 'no-such-model'"),
    ([{"id": "if", "kind": "condition", "settings": {"cases": [{"branch": "yes", "rules": [
        {"variable": "start.question", "op": "eq", "value": "x"}]}]}}, _answer()],
     [{"from": "start", "to": "if"}, {"from": "if", "to": "reply"}], "Node 'if': each edge from a condition names"),
    ([{"id": "run", "kind": "code", "settings": {"code": "print(1)"}}, _answer()], _chain("start", "run", "reply"),
     "Node 'run': The code must define a function run(args)"),
    ([{"id": "helper", "kind": "agent", "settings": {"agent": 999999, "input": "hi"}}, _answer()],
     _chain("start", "helper", "reply"), "Node 'helper': agent 999999 does not exist in this workspace."),
])
def test_a_graph_that_could_not_run_is_a_400_naming_the_node(dev, nodes_, edges, problem):
    validated = dev.post(f"{WORKFLOWS}validate/", {"graph": _graph(nodes_, edges)}, format="json")
    saved = _save(dev, _graph(nodes_, edges))
    assert validated.status_code == saved.status_code == 400
    assert problem in validated.json()["error"]["message"] and problem in saved.json()["error"]["message"]


def test_a_graph_referring_to_a_deleted_tool_is_refused_on_save_and_fails_its_node_at_run_time(dev, word_count):
    graph = _graph([{"id": "count", "kind": "tool", "settings": {"tool": word_count["id"],
                                                                 "arguments": {"text": "{{start.question}}"}}},
                    _answer("{{count.output}}")], _chain("start", "count", "reply"))
    workflow = _save(dev, graph).json()
    assert dev.delete(f"/api/workbridge/tools/{word_count['id']}/").status_code == 204

    assert "does not exist in this workspace" in _save(dev, graph, name="again").json()["error"]["message"]
    run = _run(dev, workflow, question="a b")
    assert run.status == RunStatus.FAILED
    assert run.error == f"Node 'count' failed: Tool {word_count['id']} no longer exists."


def _code_flow(dev, name: str, code: str, **settings) -> dict:
    return _save(dev, name=name, graph=_graph(
        [{"id": "compute", "kind": "code", "settings": {"code": code, **settings}}, _answer("{{compute.output}}")],
        _chain("start", "compute", "reply"), inputs=[])).json()


def test_a_code_node_that_runs_too_long_or_returns_10_mb_is_a_recorded_failure(dev):
    slow = _code_flow(dev, "slow", "def run(args):\n    while True:\n        pass\n", timeout_s=1)
    huge = _code_flow(dev, "huge", "def run(args):\n    print('x' * 10_000_000)\n    return 'y' * 10_000_000\n")
    for workflow, reason in ((slow, "ran longer than its timeout of 1 s"), (huge, "larger than the tool's output cap")):
        response = dev.post(f"{WORKFLOWS}{workflow['id']}/run/", {}, format="json")
        run = run_inline(response.json()["run_id"])
        assert run.status == RunStatus.FAILED and reason in run.error
        row = NodeRun.objects.get(run=run, node_id="compute")
        assert row.status == "failed" and reason in row.error
    # What it prints is kept cut, as a python tool's is: the node still gives its result.
    chatty = _code_flow(dev, "chatty", "def run(args):\n    print('x' * 10_000_000)\n    return 'done'\n")
    run = run_inline(dev.post(f"{WORKFLOWS}{chatty['id']}/run/", {}, format="json").json()["run_id"])
    assert (run.status, run.answer) == (RunStatus.DONE, "done")
    assert NodeRun.objects.get(run=run, node_id="compute").inputs["stdout"].endswith("… (cut)")


def test_a_code_node_runs_in_the_sandbox_and_its_result_feeds_a_jinja_template(dev):
    workflow = _save(dev, _graph([
        {"id": "compute", "kind": "code", "settings": {"code": "def run(args):\n    return {'n': len(args['q'])}\n",
                                                       "arguments": {"q": "{{start.question}}"}}},
        {"id": "say", "kind": "template", "settings": {"template": "{{ start.question | upper }} has "
                                                                   "{{ compute.output.n }} letters"}},
        _answer("{{say.output}}")], _chain("start", "compute", "say", "reply"))).json()
    assert _run(dev, workflow, question="abc").answer == "ABC has 3 letters"


def test_an_http_node_goes_through_the_egress_guard(dev):
    workflow = _save(dev, _graph([
        {"id": "fetch", "kind": "http", "settings": {"url": "http://127.0.0.1:9/orders/{{start.question}}"}},
        _answer("{{fetch.output}}")], _chain("start", "fetch", "reply"))).json()
    run = _run(dev, workflow, question="42")
    assert run.status == RunStatus.FAILED
    assert "Node 'fetch' failed:" in run.error and "not a public address" in run.error
    assert NodeRun.objects.get(run=run, node_id="fetch").inputs["url"] == "http://127.0.0.1:9/orders/42"


def test_parallel_branches_join_once_both_have_run(dev):
    workflow = _save(dev, _graph([
        {"id": "short", "kind": "template", "settings": {"template": "S"}},
        {"id": "long1", "kind": "template", "settings": {"template": "L"}},
        {"id": "long2", "kind": "template", "settings": {"template": "{{ long1.output }}L"}},
        {"id": "join", "kind": "template", "settings": {"template": "{{ short.output }}+{{ long2.output }}"}},
        _answer("{{join.output}}")],
        [*_chain("start", "short", "join"), *_chain("start", "long1", "long2", "join"), {"from": "join", "to": "reply"}]
    )).json()
    run = _run(dev, workflow, question="q")
    assert (run.status, run.answer) == (RunStatus.DONE, "S+LL"), run.error
    assert NodeRun.objects.filter(run=run).count() == 6


def test_a_condition_on_a_variable_without_a_value_fails_its_node_unless_it_has_a_default(dev):
    def flow(name, on_error):
        return _save(dev, _graph([
            {"id": "gate", "kind": "condition", "settings": {"cases": [{"branch": "high", "rules": [
                {"variable": "start.order.total", "op": "gt", "value": 100}]}]}, "on_error": on_error},
            _answer("big", "big"), _answer("small", "small")],
            [*_chain("start", "gate"), {"from": "gate", "to": "big", "branch": "high"},
             {"from": "gate", "to": "small", "branch": "else"}], inputs=[{"name": "order", "type": "object"}]),
            name=name).json()

    failed = _run(dev, flow("strict", None), order={"id": 1})
    assert failed.status == RunStatus.FAILED
    assert "'start.order.total' has no value: there is no 'total'" in failed.error
    defaulted = _run(dev, flow("lenient", {"policy": "default", "default": "else"}), order={"id": 1})
    assert (defaulted.status, defaulted.answer) == (RunStatus.DONE, "small")
    assert NodeRun.objects.get(run=defaulted, node_id="gate").error.startswith("'start.order.total' has no value")
    assert _run(dev, flow("strict2", None), order={"total": 250}).answer == "big"


def test_an_iteration_goes_through_its_list_and_refuses_more_items_than_the_operator_allows(dev, settings):
    settings.WORKFLOW_MAX_ITERATIONS = 3
    workflow = _save(dev, _graph([
        {"id": "names", "kind": "code", "settings": {
            "code": "def run(args):\n    return {'all': list(range(args['n']))}\n", "arguments": {"n": "{{start.n}}"},
            "max_output_bytes": 1_000_000}},
        {"id": "each", "kind": "iteration", "settings": {"items": "names.output.all", "do": {
            "kind": "template", "settings": {"template": "{{ item.index }}:{{ item.value * 10 }}"}}}},
        _answer("{{each.output}}")], _chain("start", "names", "each", "reply"),
        inputs=[{"name": "n", "type": "number"}])).json()
    listed = _run(dev, workflow, n=2)
    assert listed.answer == '["0:0", "1:10"]', listed.error
    refused = _run(dev, workflow, n=100_000)
    assert refused.status == RunStatus.FAILED
    assert "has 100000 items; an iteration goes through at most 3" in refused.error


def test_a_node_with_a_retry_policy_is_tried_again_with_backoff(dev, replies):
    workflow = _save(dev, _graph([
        {"id": "extract", "kind": "llm", "settings": {"model": MODEL, "prompt": "{{start.question}}", "json_schema": {
            "type": "object", "required": ["city"], "properties": {"city": {"type": "string"}}}},
         "on_error": {"policy": "retry", "retries": 2, "backoff_s": 0.01}},
        _answer("{{extract.output.city}}")], _chain("start", "extract", "reply"))).json()
    replies.extend(["not json", '{"town": "x"}', '{"city": "Lyon"}'])
    run = _run(dev, workflow, question="I live in Lyon")
    assert (run.status, run.answer) == (RunStatus.DONE, "Lyon")
    assert NodeRun.objects.get(run=run, node_id="extract").attempts == 3


def test_a_run_whose_worker_died_goes_on_elsewhere_without_running_its_finished_nodes_again(dev, word_count):
    workflow = _save(dev, _graph([
        {"id": "count", "kind": "tool", "settings": {"tool": word_count["id"],
                                                     "arguments": {"text": "{{start.question}}"}}},
        _answer("{{count.output.words}} words")], _chain("start", "count", "reply"))).json()
    response = dev.post(f"{WORKFLOWS}{workflow['id']}/run/", {"inputs": {"question": "one two"}}, format="json")
    run = WorkflowRun.objects.get(public_id=response.json()["run_id"])
    # The first worker ran start and count, then died before the answer: its rows stay, its lease runs out.
    with runner.RunEvents(run.public_id) as live:
        first = runner.Execution(leases.claim(WorkflowRun, run.pk, "dead-worker"), "dead-worker", live, Cancellation())
        state = {"outputs": {}, "settled": {}}
        for node in first.graph["nodes"][:2]:
            update = first.step(node, state)
            state = {key: {**state[key], **update.get(key, {})} for key in state}
    WorkflowRun.objects.filter(pk=run.pk).update(lease_until=timezone.now())

    from agent_studio.workflows import tasks
    assert tasks.resume_stalled_workflow_runs() == 1
    resumed = run_inline(run.public_id, owner="second-worker")
    assert (resumed.status, resumed.answer, resumed.attempts) == (RunStatus.DONE, "2 words", 2)
    assert Invocation.objects.count() == 1


def test_cancel_stops_a_queued_run_and_a_running_one_before_its_next_node(dev):
    workflow = _save(dev, _graph([_answer()], _chain("start", "reply"))).json()
    queued = dev.post(f"{WORKFLOWS}{workflow['id']}/run/", {"inputs": {"question": "hi"}}, format="json").json()
    cancelled = dev.post(f"{WORKFLOWS}runs/{queued['run_id']}/cancel/").json()
    assert cancelled["status"] == RunStatus.CANCELLED
    assert dev.post(f"{WORKFLOWS}runs/{queued['run_id']}/cancel/").status_code == 409

    running = dev.post(f"{WORKFLOWS}{workflow['id']}/run/", {"inputs": {"question": "hi"}}, format="json").json()
    WorkflowRun.objects.filter(public_id=running["run_id"]).update(cancel_requested=True)
    run = run_inline(running["run_id"])
    assert run.status == RunStatus.CANCELLED and not NodeRun.objects.filter(run=run).exists()


def test_an_agent_node_runs_the_agent_and_passes_its_answer_on(dev, script):
    agent = dev.post("/api/agents/", {"name": "helper", "template": "tool_calling", "settings": {"model": MODEL}},
                     format="json").json()
    workflow = _save(dev, _graph([{"id": "ask", "kind": "agent", "settings": {"agent": agent["id"],
                                                                              "input": "{{start.question}}"}},
                                  _answer("Agent says: {{ask.output}}")], _chain("start", "ask", "reply"))).json()
    script.append("Hello there.")
    run = _run(dev, workflow, question="Hi agent")
    assert (run.status, run.answer) == (RunStatus.DONE, "Agent says: Hello there."), run.error
    agent_run = AgentRun.objects.get(public_id=NodeRun.objects.get(run=run, node_id="ask").outputs["run_id"])
    assert (agent_run.input, agent_run.answer) == ("Hi agent", "Hello there.")


def test_bad_inputs_are_a_400_naming_the_input(dev):
    workflow = _save(dev, _graph([_answer()], _chain("start", "reply"))).json()
    for inputs, problem in (({}, "The input 'question' is required."), ({"question": 3}, "must be a string"),
                            ({"question": "a", "extra": 1}, "has no input extra")):
        response = dev.post(f"{WORKFLOWS}{workflow['id']}/run/", {"inputs": inputs}, format="json")
        assert response.status_code == 400 and problem in response.json()["error"]["message"]


def test_a_refused_graph_and_layout_read_in_chinese(dev):
    graph = _graph([_answer("{{ghost.output}}")], _chain("start", "reply"))
    refused = dev.post(WORKFLOWS, {"name": "flow", "graph": graph}, format="json", HTTP_ACCEPT_LANGUAGE="zh-hans")
    assert refused.status_code == 400
    assert refused.json()["error"]["message"] == "节点“reply”：“ghost.output”引用了节点“ghost”，但工作流中没有该节点。"

    first = _save(dev, _graph([_answer()], _chain("start", "reply"))).json()
    layout = dev.put(f"{WORKFLOWS}{first['id']}/", {"layout": {"start": "left"}}, format="json",
                     HTTP_ACCEPT_LANGUAGE="zh-hans")
    assert layout.json()["error"]["message"] == "“layout”：start 的位置必须是 {\"x\": 数字, \"y\": 数字}。"


def test_a_run_counts_the_tokens_of_every_model_call_in_it(dev, replies):
    def used(text, tokens_in, tokens_out):
        return AIMessage(content=text, usage_metadata={"input_tokens": tokens_in, "output_tokens": tokens_out,
                                                       "total_tokens": tokens_in + tokens_out})

    workflow = _save(dev, _graph([
        {"id": "first", "kind": "llm", "settings": {"model": MODEL, "prompt": "{{start.question}}"}},
        {"id": "second", "kind": "llm", "settings": {"model": MODEL, "prompt": "{{first.output}}"}},
        _answer("Result: {{second.output}}")], _chain("start", "first", "second", "reply"))).json()
    replies.extend([used("one", 10, 3), used("two", 20, 4)])

    run = _run(dev, workflow, question="hi")

    assert (run.status, run.answer) == (RunStatus.DONE, "Result: two"), run.error
    assert (run.input_tokens, run.output_tokens) == (30, 7)
    assert dev.get(f"{WORKFLOWS}runs/{run.public_id}/").json()["usage"] == {"input_tokens": 30, "output_tokens": 7}
