"""What a workflow graph's check (graph.py) and each node kind's settings check (kinds.py) share: the shape of a
name, a `{{node.field}}` reference and a bare `node.field` variable, the refusal that names the node, and the checks
of a text, a number, a variable, a tool's arguments and a model. The node runners (nodes.py) read references with
the same patterns."""

import re

from django.utils.translation import gettext as _

from accounts.errors import ValidationFailed
from accounts.models import Workspace
from serving.selectors import chat_model_problem

NODE_ID = re.compile(r"[A-Za-z][A-Za-z0-9_]{0,63}")
# A branch's name (a classifier's class, a condition's case) is read by people and, for a class, by the model: any
# language's letters, so that a Chinese flow's classes are Chinese words.
BRANCH_NAME = re.compile(r"[^\W\d_]\w{0,63}")
# `{{node.field}}` or `{{node.field.path.into.json}}`, spaces allowed inside the braces.
REFERENCE = re.compile(r"\{\{\s*([A-Za-z_]\w*)\.(\w+)((?:\.\w+)*)\s*\}\}")
BRACES = re.compile(r"\{\{(.*?)\}\}", re.S)
VARIABLE = re.compile(r"([A-Za-z_]\w*)\.(\w+)((?:\.\w+)*)")
# The name an iteration's body reads its item by (item.value, item.index).
ITEM = "item"
# The branch a condition takes when no case holds.
ELSE = "else"
MAX_TEXT = 20_000
# A variable a node reads: (node, field, path into the field's JSON value); a template's name has no field.
Reference = tuple[str, str, list[str]]


def refused(node_id: str | None, message: str) -> ValidationFailed:
    text = _("Node '%(node)s': %(problem)s") % {"node": node_id, "problem": message} if node_id else message
    return ValidationFailed(text, fields={"graph": [text], **({"node": [node_id]} if node_id else {})})


def _path(path: str) -> list[str]:
    return [part for part in path.split(".") if part]


def references(text: str) -> list[Reference]:
    """Every `{{node.field.path}}` in `text`."""
    return [(node, field, _path(path)) for node, field, path in REFERENCE.findall(text)]


def parsed(variable_name: str) -> Reference:
    """A variable already checked by `variable`, as (node, field, path)."""
    node, field, path = VARIABLE.fullmatch(variable_name).groups()
    return node, field, _path(path)


def text(node_id, settings: dict, key: str, *, required: bool = True) -> str:
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


def number(node_id, settings: dict, key: str, default, low, high, kind=float):
    value = settings.get(key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value <= high:
        raise refused(node_id, _("'%(key)s' must be a number from %(low)s to %(high)s.")
                      % {"key": key, "low": low, "high": high})
    return kind(value)


def variable(node_id, value, key: str) -> str:
    if not isinstance(value, str) or not VARIABLE.fullmatch(value.strip()):
        raise refused(node_id, _("'%(key)s' must name a variable as node.field (e.g. start.question).") % {"key": key})
    return value.strip()


def arguments(node_id, settings: dict) -> dict:
    """A tool's or a code node's arguments: name: value, text values checked as texts."""
    given = settings.get("arguments", {})
    if not isinstance(given, dict):
        raise refused(node_id, _("'arguments' must be an object of name: value (text values may hold references)."))
    for name, value in given.items():
        if isinstance(value, str):
            text(node_id, given, name, required=False)
    return given


def model(node_id, workspace: Workspace, settings: dict) -> str:
    name = settings.get("model")
    problem = chat_model_problem(workspace=workspace, name=name)
    if problem:
        raise refused(node_id, problem)
    return name
