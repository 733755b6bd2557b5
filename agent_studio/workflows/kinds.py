"""Every kind of workflow node, one record each (`NodeKind`) in `KINDS`: what the canvas calls it, its outputs, the
check of its settings on save, the function that runs it (nodes.py), the branches it labels its edges with, whether
an iteration may run it, the variables its settings read, what an evaluation counts it as and the workspace asset
it names. graph.py checks a whole graph with these records, runner.py runs each node by its kind's, evaluation.py
counts calls by them, views.py tells the canvas of them, and a published app's bundle finds a graph's assets by
them (runtime/workflow_bundles.py). A new kind is one record here, and its side-panel editor on the canvas
(static/js/workflow_canvas.js)."""

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from django.utils.functional import Promise
from django.utils.translation import gettext as _, pgettext_lazy
from jinja2 import TemplateSyntaxError, meta
from jinja2.sandbox import SandboxedEnvironment

from accounts.models import Workspace
from agent_studio.models import Agent
from agent_studio.workflows import checks, nodes
from agent_studio.workflows.checks import BRANCH_NAME, ELSE, Reference, refused
from rag_studio.models import KnowledgeBase
from workbridge import sandbox
from workbridge.models import Tool

HTTP_METHODS = {"GET", "POST", "PUT", "PATCH", "DELETE"}
RULE_OPS = {"eq", "ne", "contains", "not_contains", "starts_with", "ends_with", "gt", "ge", "lt", "le", "empty",
            "not_empty", "in"}
MAX_CODE_TIMEOUT_S = 60
MAX_CODE_OUTPUT = 1024 * 1024
jinja = SandboxedEnvironment(autoescape=False)


def _text_references(value) -> list[Reference]:
    if isinstance(value, str):
        return checks.references(value)
    items = value.values() if isinstance(value, dict) else value if isinstance(value, list) else []
    return [reference for item in items for reference in _text_references(item)]


def references_in_texts(*skipped: str) -> Callable[[dict], list[Reference]]:
    """What a kind reads whose settings hold variables only as `{{node.field}}` in their texts, at any depth: every
    such reference, the settings named in `skipped` (code, a JSON schema) aside."""
    return lambda settings: _text_references({key: value for key, value in settings.items() if key not in skipped})


@dataclass(frozen=True)
class NodeKind:
    name: str
    label: Promise  # translated where it is shown
    # Each output's type by field: the type a reference to it has.
    outputs: Mapping[str, str]
    # (node id, settings, workspace) -> the settings checked and with their defaults, or a refusal naming the node.
    check: Callable[[str, dict, Workspace], dict]
    # What it does; none for the start node, whose outputs are the run's inputs.
    run: nodes.Runner | None
    # (settings, the graph's inputs) -> the outputs' types, where they depend on either.
    typed_outputs: Callable[[dict, list[dict]], Mapping[str, str]] | None = None
    # The label of each outgoing edge, in the order of the node's outputs on the canvas; none if it does not branch.
    branches: Callable[[dict], list[str]] = lambda settings: []
    # Whether an iteration may run it for each item.
    iterable: bool = False
    # The variable holding the list a looping kind goes through; its settings may read the item (checks.ITEM).
    loops_over: Callable[[dict], str] | None = None
    # The variables its settings read.
    reads: Callable[[dict], list[Reference]] = references_in_texts()
    # What an evaluation counts a run of it as (evaluation.py).
    calls_model: bool = False
    calls_tool: bool = False
    # The setting holding the id of the workspace asset it uses, named as the asset's kind (tool, knowledge_base,
    # agent); a published app's bundle carries that asset.
    asset: str = ""

    def output_types(self, settings: dict, inputs: list[dict]) -> Mapping[str, str]:
        return self.typed_outputs(settings, inputs) if self.typed_outputs else self.outputs

    def canvas(self) -> dict:
        """What the canvas needs of the kind: its palette entry's label, the outputs its variable picker offers,
        whether an iteration's body may be one, and whether its settings may read the item."""
        return {"label": str(self.label), "outputs": sorted(self.outputs), "iterable": self.iterable,
                "loops": self.loops_over is not None}


def _asset(node_id: str, settings: dict, key: str, model, workspace: Workspace, missing: str) -> int:
    """The id in `settings[key]`, if one of the workspace's `model` rows has it; else `missing` names the node."""
    value = settings.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or not model.objects.filter(
            workspace=workspace, pk=value).exists():
        raise refused(node_id, missing % {"id": value})
    return value


def _check_start(node_id: str, settings: dict, workspace: Workspace) -> dict:
    return {}


def _check_llm(node_id: str, settings: dict, workspace: Workspace) -> dict:
    schema = settings.get("json_schema")
    if schema is not None and (not isinstance(schema, dict) or schema.get("type") != "object"):
        raise refused(node_id, _("'json_schema' must be a JSON Schema of type object, or absent."))
    return {"model": checks.model(node_id, workspace, settings), "prompt": checks.text(node_id, settings, "prompt"),
            "system": checks.text(node_id, settings, "system", required=False), "json_schema": schema,
            "temperature": checks.number(node_id, settings, "temperature", 0.2, 0, 2),
            "max_tokens": checks.number(node_id, settings, "max_tokens", 512, 16, 8192, int)}


def _check_classifier(node_id: str, settings: dict, workspace: Workspace) -> dict:
    classes = settings.get("classes")
    if (not isinstance(classes, list) or len(classes) < 2 or len(set(classes)) != len(classes)
            or not all(isinstance(c, str) and BRANCH_NAME.fullmatch(c) for c in classes)):
        raise refused(node_id, _("'classes' must be at least two distinct names (letters, digits and '_')."))
    return {"model": checks.model(node_id, workspace, settings), "query": checks.text(node_id, settings, "query"),
            "classes": classes, "instructions": checks.text(node_id, settings, "instructions", required=False)}


def _check_knowledge(node_id: str, settings: dict, workspace: Workspace) -> dict:
    return {"knowledge_base": _asset(node_id, settings, "knowledge_base", KnowledgeBase, workspace,
                                     _("knowledge base %(id)r does not exist in this workspace.")),
            "query": checks.text(node_id, settings, "query")}


def _check_tool(node_id: str, settings: dict, workspace: Workspace) -> dict:
    return {"tool": _asset(node_id, settings, "tool", Tool, workspace,
                           _("tool %(id)r does not exist in this workspace (deleted?).")),
            "arguments": checks.arguments(node_id, settings)}


def _check_code(node_id: str, settings: dict, workspace: Workspace) -> dict:
    try:
        sandbox.check_code(settings.get("code"))
    except sandbox.SandboxCodeInvalid as exc:
        raise refused(node_id, str(exc))
    return {"code": settings["code"], "arguments": checks.arguments(node_id, settings),
            "timeout_s": checks.number(node_id, settings, "timeout_s", 10, 0.1, MAX_CODE_TIMEOUT_S),
            "max_output_bytes": checks.number(node_id, settings, "max_output_bytes", 65536, 1, MAX_CODE_OUTPUT, int)}


def _check_condition(node_id: str, settings: dict, workspace: Workspace) -> dict:
    cases = settings.get("cases")
    if not isinstance(cases, list) or not cases:
        raise refused(node_id, _("'cases' must be a list of {branch, match: all|any, rules: [...]}."))
    checked = []
    for case in cases:
        branch = case.get("branch") if isinstance(case, dict) else None
        rules = case.get("rules") if isinstance(case, dict) else None
        if not isinstance(branch, str) or not BRANCH_NAME.fullmatch(branch) or branch == ELSE:
            raise refused(node_id, _("each case needs a branch name (letters, digits, '_'; not '%(else)s').")
                          % {"else": ELSE})
        if case.get("match", "all") not in ("all", "any") or not isinstance(rules, list) or not rules:
            raise refused(node_id, _("case '%(branch)s' needs match all|any and a list of rules.")
                          % {"branch": branch})
        for rule in rules:
            if not isinstance(rule, dict) or rule.get("op") not in RULE_OPS:
                raise refused(node_id, _("a rule of case '%(branch)s' needs an op, one of %(ops)s.")
                              % {"branch": branch, "ops": ", ".join(sorted(RULE_OPS))})
            checks.variable(node_id, rule.get("variable"), "variable")
        checked.append({"branch": branch, "match": case.get("match", "all"), "rules": rules})
    if len({case["branch"] for case in checked}) != len(checked):
        raise refused(node_id, _("two cases have the same branch name."))
    return {"cases": checked}


def _check_template(node_id: str, settings: dict, workspace: Workspace) -> dict:
    text = settings.get("template")
    if not isinstance(text, str) or len(text) > checks.MAX_TEXT:
        raise refused(node_id, _("'template' must be a Jinja text of at most %(limit)d characters.")
                      % {"limit": checks.MAX_TEXT})
    try:
        jinja.parse(text)
    except TemplateSyntaxError as exc:
        raise refused(node_id, _("the template does not parse: %(error)s (line %(line)s).")
                      % {"error": exc.message, "line": exc.lineno})
    return {"template": text}


def _check_http(node_id: str, settings: dict, workspace: Workspace) -> dict:
    method = str(settings.get("method", "GET")).upper()
    if method not in HTTP_METHODS:
        raise refused(node_id, _("'method' must be one of %(methods)s.")
                      % {"methods": ", ".join(sorted(HTTP_METHODS))})
    headers = settings.get("headers", {})
    if not isinstance(headers, dict) or not all(isinstance(v, str) for v in headers.values()):
        raise refused(node_id, _("'headers' must be an object of name: text."))
    for name in headers:
        checks.text(node_id, headers, name, required=False)
    return {"method": method, "url": checks.text(node_id, settings, "url"), "headers": headers,
            "body": checks.text(node_id, settings, "body", required=False),
            "timeout_s": checks.number(node_id, settings, "timeout_s", 10, 0.1, 60)}


def _check_iteration(node_id: str, settings: dict, workspace: Workspace) -> dict:
    body = settings.get("do")
    iterable = sorted(name for name, kind in KINDS.items() if kind.iterable)
    if not isinstance(body, dict) or body.get("kind") not in iterable:
        raise refused(node_id, _("'do' must be a node {kind, settings} run for each item, kind one of "
                                 "%(kinds)s.") % {"kinds": ", ".join(iterable)})
    inner = body.get("settings", {})
    if not isinstance(inner, dict):
        raise refused(node_id, _("'do.settings' must be an object."))
    return {"items": checks.variable(node_id, settings.get("items"), "items"),
            "do": {"kind": body["kind"], "settings": KINDS[body["kind"]].check(node_id, inner, workspace)}}


def _check_aggregator(node_id: str, settings: dict, workspace: Workspace) -> dict:
    variables = settings.get("variables")
    if not isinstance(variables, list) or not variables:
        raise refused(node_id, _("'variables' must list the variables to take the first value of (node.field)."))
    return {"variables": [checks.variable(node_id, value, "variables") for value in variables]}


def _check_agent(node_id: str, settings: dict, workspace: Workspace) -> dict:
    return {"agent": _asset(node_id, settings, "agent", Agent, workspace,
                            _("agent %(id)r does not exist in this workspace.")),
            "input": checks.text(node_id, settings, "input")}


def _check_answer(node_id: str, settings: dict, workspace: Workspace) -> dict:
    return {"answer": checks.text(node_id, settings, "answer")}


def _run_iteration(context: nodes.Context, settings: dict) -> dict:
    return nodes.iteration(context, settings, KINDS[settings["do"]["kind"]].run)


def _iteration_reads(settings: dict) -> list[Reference]:
    body = settings["do"]
    return [checks.parsed(settings["items"]), *KINDS[body["kind"]].reads(body["settings"])]


# The labels have a context of their own: the GUI's catalogue has some of these words in other senses (to "Start" a
# replica).
KINDS: dict[str, NodeKind] = {kind.name: kind for kind in (
    NodeKind(name="start", label=pgettext_lazy("workflow node kind", "Start"), outputs={}, check=_check_start,
             run=None, typed_outputs=lambda settings, inputs: {item["name"]: item["type"] for item in inputs}),
    NodeKind(name="llm", label=pgettext_lazy("workflow node kind", "LLM"), outputs={"output": "string"},
             check=_check_llm, run=nodes.llm,
             typed_outputs=lambda settings, inputs: {"output": "object" if settings.get("json_schema") else "string"},
             iterable=True, reads=references_in_texts("json_schema"), calls_model=True),
    NodeKind(name="classifier", label=pgettext_lazy("workflow node kind", "Question classifier"),
             outputs={"output": "string"}, check=_check_classifier, run=nodes.classifier,
             branches=lambda settings: list(settings["classes"]), calls_model=True),
    NodeKind(name="knowledge", label=pgettext_lazy("workflow node kind", "Knowledge retrieval"),
             outputs={"output": "string", "hits": "array"}, check=_check_knowledge, run=nodes.knowledge,
             iterable=True, asset="knowledge_base"),
    NodeKind(name="tool", label=pgettext_lazy("workflow node kind", "Tool"), outputs={"output": "any"},
             check=_check_tool, run=nodes.tool, iterable=True, calls_tool=True, asset="tool"),
    NodeKind(name="code", label=pgettext_lazy("workflow node kind", "Code"), outputs={"output": "any"},
             check=_check_code, run=nodes.code, iterable=True, reads=references_in_texts("code")),
    NodeKind(name="condition", label=pgettext_lazy("workflow node kind", "Condition"), outputs={"output": "string"},
             check=_check_condition, run=nodes.condition,
             branches=lambda settings: [case["branch"] for case in settings["cases"]] + [ELSE],
             reads=lambda settings: [checks.parsed(rule["variable"]) for case in settings["cases"]
                                     for rule in case["rules"]]),
    NodeKind(name="template", label=pgettext_lazy("workflow node kind", "Template"), outputs={"output": "string"},
             check=_check_template, run=nodes.template, iterable=True,
             reads=lambda settings: [(name, "", []) for name in
                                     meta.find_undeclared_variables(jinja.parse(settings["template"]))]),
    NodeKind(name="http", label=pgettext_lazy("workflow node kind", "HTTP request"),
             outputs={"output": "any", "status": "number"}, check=_check_http, run=nodes.http, iterable=True,
             calls_tool=True),
    NodeKind(name="iteration", label=pgettext_lazy("workflow node kind", "Iteration"), outputs={"output": "array"},
             check=_check_iteration, run=_run_iteration, loops_over=lambda settings: settings["items"],
             reads=_iteration_reads),
    NodeKind(name="aggregator", label=pgettext_lazy("workflow node kind", "Variable aggregator"),
             outputs={"output": "any"}, check=_check_aggregator, run=nodes.aggregator,
             reads=lambda settings: [checks.parsed(name) for name in settings["variables"]]),
    NodeKind(name="agent", label=pgettext_lazy("workflow node kind", "Agent"),
             outputs={"output": "string", "run_id": "string"}, check=_check_agent, run=nodes.agent, calls_tool=True,
             asset="agent"),
    NodeKind(name="answer", label=pgettext_lazy("workflow node kind", "Answer"), outputs={"output": "string"},
             check=_check_answer, run=nodes.answer),
)}
