"""A published workflow app in a signed bundle (assets.bundles is the envelope): the workflow version it serves,
the app's settings, and the assets the graph uses.

Manifest entries:

    entries[kind=workflow]        name, description, version, checksum, graph (as saved: assets by id)
    entries[kind=tool]            each tool the graph calls: name, description, binding, parameters, config,
                                  output_schema, timeout_s, max_output_bytes, id (its id in the graph)
    entries[kind=knowledge_base]  each knowledge base it searches: name, id
    entries[kind=agent]           each agent it runs: name, id
    app                           name, slug, default_rate_limit, allowed_origins, opener, suggested_questions

Python and HTTP tools travel whole: the import makes each one the target workspace lacks (a tool of the same name
there is used as it is). A tool bound to an imported spec or an MCP server, a knowledge base and an agent travel by
name: the target workspace must have one of that name, or the import is refused naming every one missing. Models
are named in the graph and checked when it is saved there, like any graph. Everything is made in one transaction.
"""

import os
import tempfile
from pathlib import Path

from django.conf import settings
from django.db import transaction
from django.db.models import Q
from django.utils.text import slugify
from django.utils.translation import gettext as _

from accounts.errors import ValidationFailed
from accounts.models import Role, Workspace
from accounts.services import Actor, record_audit, require_role
from agent_studio.models import Agent
from agent_studio.workflows import services as workflow_services
from agent_studio.workflows.kinds import KINDS
from agent_studio.workflows.models import Workflow
from assets.bundles import Bundle, BundleRejected, ImportOutcome, bundle_importer, write_bundle
from assets.models import Asset, AssetKind
from rag_studio.bundles import ExportedBundle
from rag_studio.models import KnowledgeBase
from runtime import services
from runtime.models import App
from workbridge import services as workbridge_services
from workbridge.models import Binding, Tool

WORKFLOW_APP_BUNDLE = "workflow_app"
PORTABLE_BINDINGS = {Binding.PYTHON, Binding.HTTP}
TOOL_FIELDS = ("name", "description", "binding", "parameters", "config", "output_schema", "timeout_s",
               "max_output_bytes")


def _asset_settings(graph: dict):
    """(asset, settings) of every node that uses a workspace asset, an iteration's body included: the setting that
    holds the asset's id is named as the asset (agent_studio/workflows/kinds.py)."""
    for node in graph["nodes"]:
        for one in [node, node["settings"]["do"]] if node["kind"] == "iteration" else [node]:
            asset = KINDS[one["kind"]].asset
            if asset:
                yield asset, one["settings"]


def used_assets(graph: dict) -> dict[str, set[int]]:
    used = {"tool": set(), "knowledge_base": set(), "agent": set()}
    for asset, node_settings in _asset_settings(graph):
        used[asset].add(node_settings[asset])
    return used


def _exports_dir() -> Path:
    directory = settings.DATA_DIR / "exports"
    directory.mkdir(parents=True, exist_ok=True)
    return directory


def export_workflow_app_bundle(*, actor: Actor, app: App, extra: dict) -> ExportedBundle:
    require_role(actor=actor, workspace=app.workspace, role=Role.DEVELOPER)
    version = app.current_release.workflow_version
    used = used_assets(version.graph)
    tools = Tool.objects.filter(workspace=app.workspace, pk__in=used["tool"])
    kbs = KnowledgeBase.objects.filter(workspace=app.workspace, pk__in=used["knowledge_base"])
    agents = Agent.objects.filter(workspace=app.workspace, pk__in=used["agent"])
    entries = [{"kind": AssetKind.WORKFLOW.value, "name": app.workflow.name,
                "description": app.workflow.description, "version": version.number, "checksum": version.checksum,
                "graph": version.graph}]
    entries += [{"kind": AssetKind.TOOL.value, "id": tool.pk, "portable": tool.binding in PORTABLE_BINDINGS,
                 **{name: getattr(tool, name) for name in TOOL_FIELDS}} for tool in tools]
    entries += [{"kind": AssetKind.KNOWLEDGE_BASE.value, "id": kb.pk, "name": kb.name} for kb in kbs]
    entries += [{"kind": AssetKind.AGENT.value, "id": agent.pk, "name": agent.name} for agent in agents]
    handle, written = tempfile.mkstemp(prefix="export-", suffix=".zip", dir=_exports_dir())
    os.close(handle)
    manifest = write_bundle(written, kind=WORKFLOW_APP_BUNDLE, entries=entries, files={}, sections={"app": extra})
    record_audit(actor=actor, workspace=app.workspace, action="app.export", target=app,
                 detail={"workflow": app.workflow.name, "version": version.number, "tools": len(tools)})
    return ExportedBundle(path=Path(written), filename=f"{slugify(app.slug)}-workflow-v{version.number}.bundle.zip",
                          manifest=manifest)


def _entries(bundle: Bundle, kind: str) -> list[dict]:
    found = [entry for entry in bundle.manifest.get("entries") or [] if isinstance(entry, dict)
             and entry.get("kind") == kind]
    if not all(isinstance(entry.get("name"), str) and isinstance(entry.get("id"), int) for entry in found):
        raise BundleRejected(f"an entry of kind {kind} has no name or id")
    return found


def _targets(workspace: Workspace, bundle: Bundle) -> tuple[dict, list[dict], list[str]]:
    """What each asset id of the graph becomes here (tools to make still None), the tools to make, and what is
    missing."""
    mapping = {"tool": {}, "knowledge_base": {}, "agent": {}}
    to_make, missing = [], []
    for entry in _entries(bundle, AssetKind.TOOL.value):
        existing = Tool.objects.filter(workspace=workspace, name=entry["name"]).first()
        if existing is not None:
            mapping["tool"][entry["id"]] = existing.pk
        elif entry.get("portable"):
            to_make.append(entry)
        else:
            missing.append(f"tool '{entry['name']}' (bound to an imported spec or an MCP server: set it up here)")
    for kind, model, label in ((AssetKind.KNOWLEDGE_BASE.value, KnowledgeBase, "knowledge base"),
                               (AssetKind.AGENT.value, Agent, "agent")):
        for entry in _entries(bundle, kind):
            found = model.objects.filter(workspace=workspace, name=entry["name"]).first()
            if found is None:
                missing.append(f"{label} '{entry['name']}'")
            else:
                mapping[kind][entry["id"]] = found.pk
    return mapping, to_make, missing


def _remapped(graph: dict, mapping: dict) -> dict:
    for asset, node_settings in _asset_settings(graph):
        node_settings[asset] = mapping[asset].get(node_settings[asset], node_settings[asset])
    return graph


def _free_name(workspace: Workspace, name: str) -> str:
    candidate, counter = name, 1
    while Workflow.objects.filter(workspace=workspace, name=candidate).exists():
        counter += 1
        candidate = f"{name[:58]} ({counter})"
    return candidate


def _free_slug(slug: str) -> str:
    candidate, counter = slug, 1
    while App.objects.filter(slug=candidate).exists():
        counter += 1
        candidate = f"{slug[:58]}-{counter}"
    return candidate


@bundle_importer(WORKFLOW_APP_BUNDLE)
@transaction.atomic
def import_workflow_app_bundle(*, actor: Actor, workspace: Workspace, bundle: Bundle) -> ImportOutcome:
    workflow_entry = bundle.entry(AssetKind.WORKFLOW.value)
    extra = bundle.manifest.get("app")
    if not isinstance(extra, dict) or not isinstance(extra.get("slug"), str) or not isinstance(extra.get("name"),
                                                                                               str):
        raise BundleRejected("its app section needs a name and a slug")
    if not isinstance(workflow_entry.get("graph"), dict) or not isinstance(workflow_entry.get("name"), str):
        raise BundleRejected("its workflow entry has no graph")
    mapping, to_make, missing = _targets(workspace, bundle)
    if missing:
        raise ValidationFailed(_("The workflow '%(name)s' uses what this workspace lacks: %(missing)s. Create or "
                                 "import them first, with these names.")
                               % {"name": workflow_entry["name"], "missing": ", ".join(missing)},
                               fields={"bundle": missing})
    notes = []
    for entry in to_make:
        tool = workbridge_services.save_tool(actor=actor, workspace=workspace,
                                             **{name: entry[name] for name in TOOL_FIELDS if name in entry})
        mapping["tool"][entry["id"]] = tool.pk
        notes.append(f"Made the tool '{tool.name}' the workflow calls.")
    workflow = workflow_services.save_workflow(
        actor=actor, workspace=workspace, name=_free_name(workspace, workflow_entry["name"]),
        graph=_remapped(workflow_entry["graph"], mapping), description=workflow_entry.get("description") or "")
    app = services.publish_app(actor=actor, workflow=workflow, name=extra["name"], slug=_free_slug(extra["slug"]),
                               rate_limit=extra.get("default_rate_limit", 60))
    services.update_app(actor=actor, app=app, allowed_origins=extra.get("allowed_origins") or [],
                        opener=extra.get("opener") or "", suggested_questions=extra.get("suggested_questions") or [])
    imported = Asset.objects.filter(Q(kind=AssetKind.WORKFLOW, ref_id=str(workflow.pk))
                                    | Q(kind=AssetKind.APP, ref_id=str(app.pk))
                                    | Q(kind=AssetKind.TOOL, ref_id__in=[str(pk) for pk in mapping["tool"].values()]),
                                    workspace=workspace)
    notes.append(f"Published as /api/apps/{app.slug}/; create an app key on its page to call it.")
    return ImportOutcome(assets=list(imported), notes=notes)
