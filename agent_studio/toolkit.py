"""The tools a run offers its model: the agent's Work Bridge tools, one retriever per knowledge base (returning
numbered passages with their sources, kept as the run's citations), long-term memory (save and search), the named
variables, and for a team its sub-agents. Every tool answers failures as a "Tool error: …" message the model can
react to; only a cancelled run or a spent limit stops the run."""

import json
import uuid
from dataclasses import dataclass, field

from langchain_core.tools import StructuredTool

from accounts.errors import ApplicationError
from accounts.services import Actor
from agent_studio import memory
from agent_studio.models import AgentThread, StepKind
from agent_studio.tracing import Recorder
from rag_studio.models import KnowledgeBase
from rag_studio.search.retrieval import retrieve
from serving.models import RoleHint
from serving.selectors import models_visible_to
from workbridge.importers import function_name
from workbridge.langchain_tools import as_langchain_tools
from workbridge.models import Tool

PASSAGE_CHARS = 700


class BindingMissing(Exception):
    """A tool or knowledge base the agent's version uses no longer exists."""


@dataclass
class RunContext:
    """What a run's tools need: who acts, in which thread, with which settings, and where steps are recorded."""

    actor: Actor
    workspace_id: int
    agent_id: int
    agent_name: str
    thread: AgentThread
    settings: dict
    recorder: Recorder
    citations: list[dict] = field(default_factory=list)
    # An evaluation's probe tools and context, offered for that run only.
    extra_tools: list = field(default_factory=list)
    extra_prompt: str = ""


def work_bridge_tools(context: RunContext) -> list[StructuredTool]:
    wanted = context.settings["tools"]
    tools = list(Tool.objects.filter(workspace_id=context.workspace_id, pk__in=wanted).select_related(
        "workspace", "spec", "mcp_server"))
    if missing := sorted(set(wanted) - {tool.pk for tool in tools}):
        raise BindingMissing(f"This version of the agent uses tool(s) {', '.join(map(str, missing))}, which no longer "
                             f"exist; edit the agent and save it without them.")
    return as_langchain_tools(actor=context.actor, tools=tools, caller=f"agent:{context.agent_name}")


def _passages(kb: KnowledgeBase, query: str, context: RunContext) -> str:
    result = retrieve(kb, query)
    lines = []
    for hit in result.hits:
        number = len(context.citations) + 1
        where = f"{hit.filename}" + (f", p. {hit.page}" if hit.page else "")
        context.citations.append({"n": number, "knowledge_base": kb.name, "document": hit.filename,
                                  "document_id": hit.document_id, "chunk_id": hit.chunk_id, "page": hit.page,
                                  "text": hit.text[:PASSAGE_CHARS]})
        lines.append(f"[{number}] ({where}) {hit.text[:PASSAGE_CHARS]}")
    return "\n".join(lines) or "No passage matches."


def knowledge_tools(context: RunContext) -> list[StructuredTool]:
    wanted = context.settings["knowledge_bases"]
    kbs = list(KnowledgeBase.objects.filter(workspace_id=context.workspace_id, pk__in=wanted).select_related(
        "embedding_model", "embedding_deployment"))
    if missing := sorted(set(wanted) - {kb.pk for kb in kbs}):
        raise BindingMissing(f"This version of the agent searches knowledge base(s) {', '.join(map(str, missing))}, "
                             f"which no longer exist; edit the agent and save it without them.")
    made = []
    for kb in kbs:
        def search(query: str, kb: KnowledgeBase = kb) -> str:
            try:
                return _passages(kb, query, context)
            except ApplicationError as exc:
                return f"Tool error: {exc.message}"

        made.append(StructuredTool.from_function(
            func=search, name=function_name(f"search_{kb.name}"),
            description=(f"Search the knowledge base '{kb.name}'" + (f" ({kb.description})" if kb.description else "")
                         + ". Returns numbered passages with their sources; cite them as [n]."),
            # No description on the argument: a small model copies it as the query.
            args_schema={"type": "object", "required": ["query"], "properties": {"query": {"type": "string"}}}))
    return made


def _embedding_model_path(workspace_id: int) -> str | None:
    model = models_visible_to(workspace=workspace_id).filter(role_hint=RoleHint.EMBEDDING).exclude(path="").first()
    return model.path if model else None


def memory_tools(context: RunContext) -> list[StructuredTool]:
    tools = []
    if context.settings["memory"]["long_term"]:
        path = _embedding_model_path(context.workspace_id)
        if path is None:
            raise BindingMissing("Long-term memory needs an embedding model; register one on Models & Serving.")
        store = memory.long_term_store(path)
        namespace = memory.memory_namespace(context.agent_id, context.thread.end_user)

        def save_memory(text: str) -> str:
            key = uuid.uuid4().hex[:12]
            store.put(namespace, key, {"text": text})
            context.recorder.record(StepKind.MEMORY, "save_memory", {"key": key, "text": text[:500]})
            return f"Saved as memory {key}."

        def search_memories(query: str) -> str:
            found = store.search(namespace, query=query, limit=5)
            return "\n".join(f"- {item.value.get('text', '')}" for item in found) or "No memories yet."

        text = {"type": "object", "required": ["text"], "properties": {"text": {"type": "string"}}}
        query = {"type": "object", "required": ["query"], "properties": {"query": {"type": "string"}}}
        tools += [StructuredTool.from_function(func=save_memory, name="save_memory", args_schema=text,
                                               description="Remember a fact about the user for later conversations."),
                  StructuredTool.from_function(func=search_memories, name="search_memories", args_schema=query,
                                               description="Search what you remembered about the user before.")]
    definitions = context.settings["variables"]
    if definitions:
        def set_variable(name: str, value=None) -> str:
            try:
                memory.set_variable(definitions=definitions, thread=context.thread, name=name, value=value)
            except memory.VariableRefused as exc:
                return f"Tool error: {exc}"
            context.recorder.record(StepKind.MEMORY, "set_variable", {"name": name, "value": value})
            return f"{name} = {json.dumps(value, ensure_ascii=False)}"

        described = "; ".join(f"{item['name']} ({item['type']}): {item['description']}" for item in definitions)
        tools.append(StructuredTool.from_function(
            func=set_variable, name="set_variable",
            description=f"Set one of your memory variables: {described}",
            args_schema={"type": "object", "required": ["name", "value"], "properties": {
                "name": {"type": "string", "enum": [item["name"] for item in definitions]}, "value": {}}}))
    return tools
