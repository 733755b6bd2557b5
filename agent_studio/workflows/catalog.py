"""Workflow templates shipped with the platform (agent_studio/workflows/templates/*.json), each a graph with its
scenario set, and making a workflow from one.

A template file:

    {"key", "title", "description",
     "bindings": {slot: {"kind": "model" | "knowledge_base" | "tool", "label", "create"?: a Work Bridge tool}},
     "graph": a workflow graph (agent_studio/workflows/graph.py) where a setting written "$slot" takes the asset
              bound to that slot: a model's name, a knowledge base's or a tool's id,
     "scenarios": [{name, inputs, checks, expected_nodes, forbidden_nodes}]}

A tool slot with `create` may be left out: the template's own tool is made (or the workspace's tool of that name
reused), so a template runs on a fresh workspace; every other slot must be bound.

What a template says to the model or the user (prompts, a classifier's classes and the branches named after them,
fixed messages, scenarios) is written in both languages side by side, as an object of exactly the keys "en" and
"zh-hans", anywhere in "bindings", "graph" and "scenarios"; the workflow is made in the language active when it is
made (the user's), so a Chinese user's flow classifies, answers and hands over in Chinese. The title, description
and slot labels are GUI text, translated by the catalogue (locale/) like the rest of the GUI.
"""

import json
from functools import cache
from pathlib import Path

from django.db import transaction
from django.utils.translation import get_language, gettext as _, gettext_lazy

from accounts.errors import ValidationFailed
from accounts.models import Workspace
from accounts.services import Actor
from agent_studio.workflows import services
from agent_studio.workflows.models import Workflow
from rag_studio.models import KnowledgeBase
from serving.selectors import chat_model_problem
from workbridge import services as workbridge_services
from workbridge.models import Tool

TEMPLATES_DIR = Path(__file__).parent / "templates"
SLOT_KINDS = {"model": gettext_lazy("a chat deployment or model group (its name)"),
              "knowledge_base": gettext_lazy("a knowledge base (its id)"),
              "tool": gettext_lazy("a Work Bridge tool (its id)")}


@cache
def templates() -> dict[str, dict]:
    found = {}
    for path in sorted(TEMPLATES_DIR.glob("*.json")):
        template = json.loads(path.read_text(encoding="utf-8"))
        found[template["key"]] = template
    return found


BOTH_LANGUAGES = {"en", "zh-hans"}


def in_language(value, language: str | None):
    """`value` with each text given in both languages ({"en": …, "zh-hans": …}) as the one for `language` (a
    Django language code; English unless it is Chinese)."""
    if isinstance(value, dict) and set(value) == BOTH_LANGUAGES:
        return value["zh-hans" if (language or "").lower().startswith("zh") else "en"]
    if isinstance(value, dict):
        return {key: in_language(item, language) for key, item in value.items()}
    if isinstance(value, list):
        return [in_language(item, language) for item in value]
    return value


def listing() -> list[dict]:
    """What a user chooses from: each template's description, what it needs bound, its inputs and scenarios (their
    names in the active language)."""
    return [{"key": template["key"], "title": template["title"], "description": template["description"],
             "bindings": [{"slot": slot, "kind": spec["kind"], "label": spec["label"],
                           "required": "create" not in spec} for slot, spec in template["bindings"].items()],
             "inputs": template["graph"]["inputs"], "nodes": [node["id"] for node in template["graph"]["nodes"]],
             "scenarios": [in_language(scenario["name"], get_language()) for scenario in template["scenarios"]]}
            for template in templates().values()]


def _template(key) -> dict:
    template = templates().get(key) if isinstance(key, str) else None
    if template is None:
        raise ValidationFailed(_("No workflow template %(key)r; one of %(keys)s.")
                               % {"key": key, "keys": ", ".join(sorted(templates()))},
                               fields={"template": ["Unknown."]})
    return template


def _bound(*, actor: Actor, workspace: Workspace, slot: str, spec: dict, value) -> str | int | None:
    """The asset bound to a slot, or None when it is missing (named in the 400 with every other missing one)."""
    kind = spec["kind"]
    if kind == "model":
        if value in (None, ""):
            return None
        problem = chat_model_problem(workspace=workspace, name=value)
        if problem:
            raise ValidationFailed(f"'{slot}': {_(problem)}", fields={slot: [problem]})
        return value
    if value is None and kind == "tool" and "create" in spec:
        existing = Tool.objects.filter(workspace=workspace, name=spec["create"]["name"]).first()
        return (existing or workbridge_services.save_tool(actor=actor, workspace=workspace, **spec["create"])).pk
    if value is None:
        return None
    model = KnowledgeBase if kind == "knowledge_base" else Tool
    if isinstance(value, bool) or not isinstance(value, int) or not model.objects.filter(
            workspace=workspace, pk=value).exists():
        message = (_("'%(slot)s': there is no knowledge base %(id)r in this workspace.") if kind == "knowledge_base"
                   else _("'%(slot)s': there is no tool %(id)r in this workspace."))
        raise ValidationFailed(message % {"slot": slot, "id": value},
                               fields={slot: ["Not found."]})
    return value


def _filled(value, bound: dict):
    if isinstance(value, str) and value.startswith("$") and value[1:] in bound:
        return bound[value[1:]]
    if isinstance(value, dict):
        return {key: _filled(item, bound) for key, item in value.items()}
    if isinstance(value, list):
        return [_filled(item, bound) for item in value]
    return value


@transaction.atomic
def create_from_template(*, actor: Actor, workspace: Workspace, key, name: str = "", bindings=None) -> Workflow:
    """A new workflow from a template, with its assets bound and its scenario set; a 400 names every slot left
    unbound at once. Its prompts, classes, messages and scenarios are those of the active language."""
    template = in_language(_template(key), get_language())
    bindings = bindings if bindings is not None else {}
    if not isinstance(bindings, dict):
        raise ValidationFailed("'bindings' must be an object of slot: asset.", fields={"bindings": ["Invalid."]})
    if unknown := sorted(set(bindings) - set(template["bindings"])):
        raise ValidationFailed(_("The template '%(key)s' has no slot %(unknown)s; its slots: %(slots)s.") % {
            "key": template["key"], "unknown": ", ".join(unknown), "slots": ", ".join(template["bindings"])},
            fields={"bindings": unknown})
    missing = [slot for slot, spec in template["bindings"].items()
               if bindings.get(slot) in (None, "") and "create" not in spec]
    if missing:
        labels = {slot: _(template["bindings"][slot]["label"]) for slot in missing}
        needs = "; ".join(f"{slot}: {SLOT_KINDS[template['bindings'][slot]['kind']]}, "
                          f"{labels[slot][:1].lower()}{labels[slot][1:]}" for slot in missing)
        raise ValidationFailed(_("The template '%(key)s' needs these bound in 'bindings': %(needs)s.")
                               % {"key": template["key"], "needs": needs},
                               fields={"bindings": missing})
    bound = {slot: _bound(actor=actor, workspace=workspace, slot=slot, spec=spec, value=bindings.get(slot))
             for slot, spec in template["bindings"].items()}
    workflow = services.save_workflow(actor=actor, workspace=workspace, name=(name or _(template["title"])).strip(),
                                      graph=_filled(template["graph"], bound), description=_(template["description"]),
                                      layout=template.get("layout"))
    for scenario in template["scenarios"]:
        services.save_scenario(actor=actor, workflow=workflow, **scenario)
    return workflow
