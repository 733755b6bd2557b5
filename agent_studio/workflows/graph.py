"""A workflow's graph, and the check that refuses on save what could not run (a 400 naming the node).

    {"inputs": [{"name": "question", "type": "string", "required": true}],
     "nodes": [{"id": "start", "kind": "start"},
               {"id": "triage", "kind": "classifier",
                "settings": {"model": "smollm2-135m-instruct", "query": "{{start.question}}",
                             "classes": ["order", "policy"]}},
               {"id": "lookup", "kind": "tool", "settings": {"tool": 7, "arguments": {"text": "{{start.question}}"}},
                "on_error": {"policy": "retry", "retries": 2, "backoff_s": 0.5}},
               {"id": "reply", "kind": "answer", "settings": {"answer": "{{lookup.output}}"}}],
     "edges": [{"from": "start", "to": "triage"}, {"from": "triage", "to": "lookup", "branch": "order"}, ...]}

A node's outputs are referenced as `{{node_id.field}}` (a path may go on into a JSON value: `{{lookup.output.id}}`);
the start node's fields are the inputs (`{{start.question}}`). Condition rules, aggregators and iterations name a
variable without braces (`lookup.output`). Inside an iteration's body, `item.value` and `item.index` are the item.
A node may reference only nodes upstream of it. Branching nodes (condition, classifier) label each outgoing edge
with a branch; a node whose every incoming edge is on a branch not taken is skipped. Edges never form a cycle: an
iteration loops over its list inside one node.

Error policy (`on_error`): fail (the run fails), default (the node's output becomes `default`), retry (`retries`
more tries, `backoff_s` doubling between them, then fail).
"""

import re
from graphlib import CycleError, TopologicalSorter

from django.utils.translation import gettext as _
from jinja2 import TemplateSyntaxError, meta
from jinja2.sandbox import SandboxedEnvironment

from accounts.errors import ValidationFailed
from accounts.models import Workspace
from agent_studio.models import Agent
from rag_studio.models import KnowledgeBase
from serving.selectors import chat_model_problem
from workbridge import sandbox
from workbridge.models import Tool

NODE_ID = re.compile(r"[A-Za-z][A-Za-z0-9_]{0,63}")
# `{{node.field}}` or `{{node.field.path.into.json}}`, spaces allowed inside the braces.
REFERENCE = re.compile(r"\{\{\s*([A-Za-z_]\w*)\.(\w+)((?:\.\w+)*)\s*\}\}")
BRACES = re.compile(r"\{\{(.*?)\}\}", re.S)
VARIABLE = re.compile(r"([A-Za-z_]\w*)\.(\w+)((?:\.\w+)*)")
ITEM = "item"
# The item of an iteration, and the run state's own keys (agent_studio/workflows/runner.py).
RESERVED_IDS = {ITEM, "outputs", "settled"}
INPUT_TYPES = {"string", "number", "boolean", "object", "array"}
HTTP_METHODS = {"GET", "POST", "PUT", "PATCH", "DELETE"}
POLICIES = {"fail", "default", "retry"}
RULE_OPS = {"eq", "ne", "contains", "not_contains", "starts_with", "ends_with", "gt", "ge", "lt", "le", "empty",
            "not_empty", "in"}
ELSE = "else"
MAX_NODES = 200
MAX_TEXT = 20_000
MAX_CODE_TIMEOUT_S = 60
MAX_CODE_OUTPUT = 1024 * 1024
# What each kind's outputs are, by field: the type a reference to it has.
OUTPUTS = {
    "start": {}, "llm": {"output": "string"}, "classifier": {"output": "string"},
    "knowledge": {"output": "string", "hits": "array"}, "tool": {"output": "any"}, "code": {"output": "any"},
    "condition": {"output": "string"}, "template": {"output": "string"},
    "http": {"output": "any", "status": "number"}, "iteration": {"output": "array"},
    "aggregator": {"output": "any"}, "agent": {"output": "string", "run_id": "string"},
    "answer": {"output": "string"},
}
BRANCHING = {"condition", "classifier"}
# The kinds an iteration may run for each item.
ITERABLE = {"llm", "template", "code", "tool", "http", "knowledge"}
jinja = SandboxedEnvironment(autoescape=False)


def refused(node_id: str | None, message: str) -> ValidationFailed:
    text = _("Node '%(node)s': %(problem)s") % {"node": node_id, "problem": message} if node_id else message
    return ValidationFailed(text, fields={"graph": [text], **({"node": [node_id]} if node_id else {})})


def references(text: str) -> list[tuple[str, str, list[str]]]:
    """Every `{{node.field.path}}` in `text`, as (node, field, path)."""
    return [(node, field, [part for part in path.split(".") if part]) for node, field, path in
            REFERENCE.findall(text)]


def _text(node_id, settings: dict, key: str, *, required: bool = True) -> str:
    value = settings.get(key, "")
    if not isinstance(value, str) or (required and not value.strip()) or len(value) > MAX_TEXT:
        message = (_("'%(key)s' must be a non-empty text of at most %(limit)d characters.") if required
                   else _("'%(key)s' must be a text of at most %(limit)d characters."))
        raise refused(node_id, message % {"key": key, "limit": MAX_TEXT})
    for inside in BRACES.findall(value):
        if not VARIABLE.fullmatch(inside.strip()):
            raise refused(node_id, _("'{{%(inside)s}}' in '%(key)s' is not a reference; write {{node.field}}.")
                          % {"inside": inside, "key": key})
    return value


def _number(node_id, settings: dict, key: str, default, low, high, kind=float):
    value = settings.get(key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value <= high:
        raise refused(node_id, _("'%(key)s' must be a number from %(low)s to %(high)s.")
                      % {"key": key, "low": low, "high": high})
    return kind(value)


def _variable(node_id, value, key: str) -> str:
    if not isinstance(value, str) or not VARIABLE.fullmatch(value.strip()):
        raise refused(node_id, _("'%(key)s' must name a variable as node.field (e.g. start.question).") % {"key": key})
    return value.strip()


def _arguments(node_id, settings: dict) -> dict:
    arguments = settings.get("arguments", {})
    if not isinstance(arguments, dict):
        raise refused(node_id, _("'arguments' must be an object of name: value (text values may hold references)."))
    for name, value in arguments.items():
        if isinstance(value, str):
            _text(node_id, arguments, name, required=False)
    return arguments


def _model(node_id, workspace: Workspace, settings: dict) -> str:
    name = settings.get("model")
    problem = chat_model_problem(workspace=workspace, name=name)
    if problem:
        raise refused(node_id, problem)
    return name


def _settings(node_id: str, kind: str, settings: dict, workspace: Workspace) -> dict:  # noqa: C901 (one per kind)
    """The node's settings, checked and with their defaults."""
    if kind == "llm":
        schema = settings.get("json_schema")
        if schema is not None and (not isinstance(schema, dict) or schema.get("type") != "object"):
            raise refused(node_id, _("'json_schema' must be a JSON Schema of type object, or absent."))
        return {"model": _model(node_id, workspace, settings), "prompt": _text(node_id, settings, "prompt"),
                "system": _text(node_id, settings, "system", required=False), "json_schema": schema,
                "temperature": _number(node_id, settings, "temperature", 0.2, 0, 2),
                "max_tokens": _number(node_id, settings, "max_tokens", 512, 16, 8192, int)}
    if kind == "classifier":
        classes = settings.get("classes")
        if (not isinstance(classes, list) or len(classes) < 2 or len(set(classes)) != len(classes)
                or not all(isinstance(c, str) and NODE_ID.fullmatch(c) for c in classes)):
            raise refused(node_id, _("'classes' must be at least two distinct names (letters, digits and '_')."))
        return {"model": _model(node_id, workspace, settings), "query": _text(node_id, settings, "query"),
                "classes": classes, "instructions": _text(node_id, settings, "instructions", required=False)}
    if kind == "knowledge":
        kb = settings.get("knowledge_base")
        if isinstance(kb, bool) or not isinstance(kb, int) or not KnowledgeBase.objects.filter(
                workspace=workspace, pk=kb).exists():
            raise refused(node_id, _("knowledge base %(id)r does not exist in this workspace.") % {"id": kb})
        return {"knowledge_base": kb, "query": _text(node_id, settings, "query")}
    if kind == "tool":
        tool = settings.get("tool")
        if isinstance(tool, bool) or not isinstance(tool, int) or not Tool.objects.filter(
                workspace=workspace, pk=tool).exists():
            raise refused(node_id, _("tool %(id)r does not exist in this workspace (deleted?).") % {"id": tool})
        return {"tool": tool, "arguments": _arguments(node_id, settings)}
    if kind == "code":
        try:
            sandbox.check_code(settings.get("code"))
        except sandbox.SandboxCodeInvalid as exc:
            raise refused(node_id, str(exc))
        return {"code": settings["code"], "arguments": _arguments(node_id, settings),
                "timeout_s": _number(node_id, settings, "timeout_s", 10, 0.1, MAX_CODE_TIMEOUT_S),
                "max_output_bytes": _number(node_id, settings, "max_output_bytes", 65536, 1, MAX_CODE_OUTPUT, int)}
    if kind == "condition":
        cases = settings.get("cases")
        if not isinstance(cases, list) or not cases:
            raise refused(node_id, _("'cases' must be a list of {branch, match: all|any, rules: [...]}."))
        checked = []
        for case in cases:
            branch = case.get("branch") if isinstance(case, dict) else None
            rules = case.get("rules") if isinstance(case, dict) else None
            if not isinstance(branch, str) or not NODE_ID.fullmatch(branch) or branch == ELSE:
                raise refused(node_id, _("each case needs a branch name (letters, digits, '_'; not '%(else)s').")
                              % {"else": ELSE})
            if case.get("match", "all") not in ("all", "any") or not isinstance(rules, list) or not rules:
                raise refused(node_id, _("case '%(branch)s' needs match all|any and a list of rules.")
                              % {"branch": branch})
            for rule in rules:
                if not isinstance(rule, dict) or rule.get("op") not in RULE_OPS:
                    raise refused(node_id, _("a rule of case '%(branch)s' needs an op, one of %(ops)s.")
                                  % {"branch": branch, "ops": ", ".join(sorted(RULE_OPS))})
                _variable(node_id, rule.get("variable"), "variable")
            checked.append({"branch": branch, "match": case.get("match", "all"), "rules": rules})
        if len({case["branch"] for case in checked}) != len(checked):
            raise refused(node_id, _("two cases have the same branch name."))
        return {"cases": checked}
    if kind == "template":
        text = settings.get("template")
        if not isinstance(text, str) or len(text) > MAX_TEXT:
            raise refused(node_id, _("'template' must be a Jinja text of at most %(limit)d characters.")
                          % {"limit": MAX_TEXT})
        try:
            jinja.parse(text)
        except TemplateSyntaxError as exc:
            raise refused(node_id, _("the template does not parse: %(error)s (line %(line)s).")
                          % {"error": exc.message, "line": exc.lineno})
        return {"template": text}
    if kind == "http":
        method = str(settings.get("method", "GET")).upper()
        if method not in HTTP_METHODS:
            raise refused(node_id, _("'method' must be one of %(methods)s.")
                          % {"methods": ", ".join(sorted(HTTP_METHODS))})
        headers = settings.get("headers", {})
        if not isinstance(headers, dict) or not all(isinstance(v, str) for v in headers.values()):
            raise refused(node_id, _("'headers' must be an object of name: text."))
        for name in headers:
            _text(node_id, headers, name, required=False)
        return {"method": method, "url": _text(node_id, settings, "url"), "headers": headers,
                "body": _text(node_id, settings, "body", required=False),
                "timeout_s": _number(node_id, settings, "timeout_s", 10, 0.1, 60)}
    if kind == "iteration":
        body = settings.get("do")
        if not isinstance(body, dict) or body.get("kind") not in ITERABLE:
            raise refused(node_id, _("'do' must be a node {kind, settings} run for each item, kind one of "
                                     "%(kinds)s.") % {"kinds": ", ".join(sorted(ITERABLE))})
        inner = body.get("settings", {})
        if not isinstance(inner, dict):
            raise refused(node_id, _("'do.settings' must be an object."))
        return {"items": _variable(node_id, settings.get("items"), "items"),
                "do": {"kind": body["kind"], "settings": _settings(node_id, body["kind"], inner, workspace)}}
    if kind == "aggregator":
        variables = settings.get("variables")
        if not isinstance(variables, list) or not variables:
            raise refused(node_id, _("'variables' must list the variables to take the first value of "
                                     "(node.field)."))
        return {"variables": [_variable(node_id, value, "variables") for value in variables]}
    if kind == "agent":
        agent = settings.get("agent")
        if isinstance(agent, bool) or not isinstance(agent, int) or not Agent.objects.filter(
                workspace=workspace, pk=agent).exists():
            raise refused(node_id, _("agent %(id)r does not exist in this workspace.") % {"id": agent})
        return {"agent": agent, "input": _text(node_id, settings, "input")}
    if kind == "answer":
        return {"answer": _text(node_id, settings, "answer")}
    return {}


def _used(kind: str, settings: dict) -> list[tuple[str, str, list[str]]]:
    """The variables a node's settings read, as (node, field, path)."""
    found = []

    def texts(value):
        if isinstance(value, str):
            found.extend(references(value))
        elif isinstance(value, dict):
            for item in value.values():
                texts(item)
        elif isinstance(value, list):
            for item in value:
                texts(item)

    def variable(value: str):
        node, field, path = VARIABLE.fullmatch(value).groups()
        found.append((node, field, [part for part in path.split(".") if part]))

    if kind == "template":
        found.extend((name, "", []) for name in meta.find_undeclared_variables(jinja.parse(settings["template"])))
    elif kind == "condition":
        for case in settings["cases"]:
            for rule in case["rules"]:
                variable(rule["variable"])
    elif kind == "aggregator":
        for value in settings["variables"]:
            variable(value)
    elif kind == "iteration":
        variable(settings["items"])
        found.extend(_used(settings["do"]["kind"], settings["do"]["settings"]))
    else:
        texts({key: value for key, value in settings.items() if key not in ("code", "json_schema")})
    return found


def output_types(node: dict, inputs: list[dict]) -> dict[str, str]:
    if node["kind"] == "start":
        return {item["name"]: item["type"] for item in inputs}
    if node["kind"] == "llm" and node["settings"].get("json_schema"):
        return {"output": "object"}
    return OUTPUTS[node["kind"]]


def branches(node: dict) -> set[str]:
    if node["kind"] == "condition":
        return {case["branch"] for case in node["settings"]["cases"]} | {ELSE}
    if node["kind"] == "classifier":
        return set(node["settings"]["classes"])
    return set()


def _inputs(raw) -> list[dict]:
    if not isinstance(raw, list):
        raise refused(None, _("'inputs' must be a list of {name, type, required}."))
    checked = []
    for item in raw:
        if not isinstance(item, dict) or not isinstance(item.get("name"), str) or not NODE_ID.fullmatch(item["name"]):
            raise refused("start", _("each input needs a name (letters, digits and '_')."))
        if item.get("type", "string") not in INPUT_TYPES:
            raise refused("start", _("input '%(name)s' has type %(type)r; one of %(types)s.")
                          % {"name": item["name"], "type": item.get("type"), "types": ", ".join(sorted(INPUT_TYPES))})
        checked.append({"name": item["name"], "type": item.get("type", "string"),
                        "required": bool(item.get("required", True))})
    if len({item["name"] for item in checked}) != len(checked):
        raise refused("start", _("two inputs have the same name."))
    return checked


def _nodes(raw, workspace: Workspace) -> list[dict]:
    if not isinstance(raw, list) or not raw or len(raw) > MAX_NODES:
        raise refused(None, _("'nodes' must be a list of 1 to %(limit)d nodes.") % {"limit": MAX_NODES})
    nodes, seen = [], set()
    for node in raw:
        node_id = node.get("id") if isinstance(node, dict) else None
        if not isinstance(node_id, str) or not NODE_ID.fullmatch(node_id) or node_id in RESERVED_IDS:
            raise refused(None, _("a node's id must be a name (letters, digits and '_'; not %(reserved)s); %(id)r "
                                  "is not.") % {"reserved": ", ".join(sorted(RESERVED_IDS)), "id": node_id})
        if node_id in seen:
            raise refused(node_id, _("two nodes have this id."))
        seen.add(node_id)
        kind = node.get("kind")
        if kind not in OUTPUTS:
            raise refused(node_id, _("unknown kind %(kind)r; one of %(kinds)s.")
                          % {"kind": kind, "kinds": ", ".join(sorted(OUTPUTS))})
        settings = node.get("settings", {})
        if not isinstance(settings, dict):
            raise refused(node_id, _("'settings' must be an object."))
        nodes.append({"id": node_id, "kind": kind, "settings": _settings(node_id, kind, settings, workspace),
                      "on_error": _policy(node_id, node.get("on_error"))})
    starts = [node for node in nodes if node["kind"] == "start"]
    if len(starts) != 1 or starts[0]["id"] != "start":
        raise refused(None, _("a workflow needs exactly one start node, with the id 'start'."))
    if not any(node["kind"] == "answer" for node in nodes):
        raise refused(None, _("a workflow needs an answer node (its end)."))
    return nodes


def _policy(node_id: str, raw) -> dict:
    raw = raw or {"policy": "fail"}
    if not isinstance(raw, dict) or raw.get("policy", "fail") not in POLICIES:
        raise refused(node_id, _("'on_error.policy' must be one of %(policies)s.")
                      % {"policies": ", ".join(sorted(POLICIES))})
    policy = {"policy": raw.get("policy", "fail")}
    if policy["policy"] == "default":
        policy["default"] = raw.get("default")
    if policy["policy"] == "retry":
        policy["retries"] = _number(node_id, raw, "retries", 2, 1, 5, int)
        policy["backoff_s"] = _number(node_id, raw, "backoff_s", 0.5, 0, 30)
    return policy


def _edges(raw, nodes: dict[str, dict]) -> list[dict]:
    if not isinstance(raw, list):
        raise refused(None, _("'edges' must be a list of {from, to, branch?}."))
    edges, seen = [], set()
    for edge in raw:
        source, target = (edge.get("from"), edge.get("to")) if isinstance(edge, dict) else (None, None)
        for end in (source, target):
            if end not in nodes:
                raise refused(None, _("an edge names node %(id)r, which the workflow does not have.") % {"id": end})
        if target == "start":
            raise refused(source, _("no edge may lead into the start node."))
        branch = edge.get("branch")
        labels = branches(nodes[source])
        if labels and branch not in labels:
            raise refused(source, _("each edge from a %(kind)s names its branch, one of %(branches)s; the edge to "
                                    "'%(target)s' has %(branch)r.") % {
                "kind": nodes[source]["kind"], "branches": ", ".join(sorted(labels)), "target": target,
                "branch": branch})
        if not labels and branch is not None:
            raise refused(source, _("a %(kind)s node does not branch; the edge to '%(target)s' has a branch label.")
                          % {"kind": nodes[source]["kind"], "target": target})
        if (source, target, branch) in seen:
            raise refused(source, _("the edge to '%(target)s' is given twice.") % {"target": target})
        seen.add((source, target, branch))
        edges.append({"from": source, "to": target, **({"branch": branch} if branch is not None else {})})
    return edges


def upstream_of(edges: list[dict]) -> dict[str, set[str]]:
    """Each node's ancestors."""
    parents: dict[str, set[str]] = {}
    for edge in edges:
        parents.setdefault(edge["to"], set()).add(edge["from"])
    found: dict[str, set[str]] = {}

    def ancestors(node_id: str) -> set[str]:
        if node_id not in found:
            found[node_id] = set()
            for parent in parents.get(node_id, ()):
                found[node_id] |= {parent} | ancestors(parent)
        return found[node_id]

    return {node_id: ancestors(node_id) for node_id in {e["to"] for e in edges} | {e["from"] for e in edges}}


def _check_shape(nodes: dict[str, dict], edges: list[dict]) -> None:
    sorter = TopologicalSorter({node_id: set() for node_id in nodes})
    for edge in edges:
        sorter.add(edge["to"], edge["from"])
    try:
        sorter.prepare()
    except CycleError as exc:
        cycle = exc.args[1]
        raise refused(cycle[0], _("the edges form a cycle (%(cycle)s); loop over a list with an iteration node "
                                  "instead.") % {"cycle": " → ".join(cycle)})
    reached, frontier = {"start"}, ["start"]
    while frontier:
        current = frontier.pop()
        for edge in edges:
            if edge["from"] == current and edge["to"] not in reached:
                reached.add(edge["to"])
                frontier.append(edge["to"])
    for node_id in nodes:
        if node_id not in reached:
            raise refused(node_id, _("no path from the start node reaches it."))


def _check_references(nodes: dict[str, dict], edges: list[dict], inputs: list[dict]) -> None:
    upstream = upstream_of(edges)
    for node in nodes.values():
        allowed = upstream.get(node["id"], set())
        for source, field, path in _used(node["kind"], node["settings"]):
            name = f"{source}.{field}" if field else source
            if source == ITEM and node["kind"] == "iteration":
                if field and field not in ("value", "index"):
                    raise refused(node["id"], _("'%(name)s' is not an item's field (item.value, item.index).")
                                  % {"name": name})
                continue
            if source not in nodes:
                raise refused(node["id"], _("'%(name)s' refers to node '%(source)s', which the workflow does not "
                                            "have.") % {"name": name, "source": source})
            if source not in allowed:
                raise refused(node["id"], _("'%(name)s' refers to node '%(source)s', which is not upstream of it.")
                              % {"name": name, "source": source})
            if not field:
                continue
            types = output_types(nodes[source], inputs)
            if field not in types:
                has = {"name": name, "kind": nodes[source]["kind"], "fields": ", ".join(sorted(types)) or "none"}
                raise refused(node["id"], (_("'%(name)s' is not an input (it has %(fields)s).") if source == "start"
                                           else _("'%(name)s' is not an output of a %(kind)s node (it has "
                                                  "%(fields)s).")) % has)
            if path and types[field] not in ("object", "any"):
                raise refused(node["id"], _("'%(name)s' is a %(type)s; it has no field '%(field)s'.")
                              % {"name": name, "type": types[field], "field": path[0]})
        if node["kind"] == "iteration":
            source, field, _path = VARIABLE.fullmatch(node["settings"]["items"]).groups()
            kind = output_types(nodes[source], inputs).get(field)
            if kind not in ("array", "any") and not _path:
                raise refused(node["id"], _("iterates over '%(variable)s', a %(type)s, not a list.")
                              % {"variable": f"{source}.{field}", "type": kind})


def check_graph(*, workspace: Workspace, raw) -> dict:
    """The graph as it will run, or a ValidationFailed naming the node at fault."""
    if not isinstance(raw, dict):
        raise refused(None, _("'graph' must be an object with inputs, nodes and edges."))
    inputs = _inputs(raw.get("inputs", []))
    nodes = _nodes(raw.get("nodes"), workspace)
    by_id = {node["id"]: node for node in nodes}
    edges = _edges(raw.get("edges", []), by_id)
    _check_shape(by_id, edges)
    _check_references(by_id, edges, inputs)
    return {"inputs": inputs, "nodes": nodes, "edges": edges}
