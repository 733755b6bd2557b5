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
iteration loops over its list inside one node. What each kind's settings are, what it outputs, reads and branches on
is its record's (kinds.py); this module checks the graph as a whole.

Error policy (`on_error`): fail (the run fails), default (the node's output becomes `default`), retry (`retries`
more tries, `backoff_s` doubling between them, then fail).
"""

from graphlib import CycleError, TopologicalSorter

from django.utils.translation import gettext as _

from accounts.models import Workspace
from agent_studio.workflows.checks import ITEM, NODE_ID, number, parsed, refused
from agent_studio.workflows.kinds import KINDS

# The item of an iteration, and the run state's own keys (agent_studio/workflows/runner.py).
RESERVED_IDS = {ITEM, "outputs", "settled"}
INPUT_TYPES = {"string", "number", "boolean", "object", "array"}
POLICIES = {"fail", "default", "retry"}
MAX_NODES = 200


def _output_types(node: dict, inputs: list[dict]) -> dict[str, str]:
    return KINDS[node["kind"]].output_types(node["settings"], inputs)


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
        if kind not in KINDS:
            raise refused(node_id, _("unknown kind %(kind)r; one of %(kinds)s.")
                          % {"kind": kind, "kinds": ", ".join(sorted(KINDS))})
        settings = node.get("settings", {})
        if not isinstance(settings, dict):
            raise refused(node_id, _("'settings' must be an object."))
        nodes.append({"id": node_id, "kind": kind, "settings": KINDS[kind].check(node_id, settings, workspace),
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
        policy["retries"] = number(node_id, raw, "retries", 2, 1, 5, int)
        policy["backoff_s"] = number(node_id, raw, "backoff_s", 0.5, 0, 30)
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
        labels = set(KINDS[nodes[source]["kind"]].branches(nodes[source]["settings"]))
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
        kind = KINDS[node["kind"]]
        for source, field, path in kind.reads(node["settings"]):
            name = f"{source}.{field}" if field else source
            if source == ITEM and kind.loops_over:
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
            types = _output_types(nodes[source], inputs)
            if field not in types:
                has = {"name": name, "kind": nodes[source]["kind"], "fields": ", ".join(sorted(types)) or "none"}
                raise refused(node["id"], (_("'%(name)s' is not an input (it has %(fields)s).") if source == "start"
                                           else _("'%(name)s' is not an output of a %(kind)s node (it has "
                                                  "%(fields)s).")) % has)
            if path and types[field] not in ("object", "any"):
                raise refused(node["id"], _("'%(name)s' is a %(type)s; it has no field '%(field)s'.")
                              % {"name": name, "type": types[field], "field": path[0]})
        if kind.loops_over:
            source, field, path = parsed(kind.loops_over(node["settings"]))
            listed = _output_types(nodes[source], inputs).get(field)
            if listed not in ("array", "any") and not path:
                raise refused(node["id"], _("iterates over '%(variable)s', a %(type)s, not a list.")
                              % {"variable": f"{source}.{field}", "type": listed})


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
