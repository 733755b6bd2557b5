"""An agent's memory.

- Short-term: the conversation's LangGraph thread, checkpointed after every step by LangGraph's own savers, in
  `$FACTORY_DATA_DIR/agents/checkpoints.sqlite` (SQLite, WAL) or in the platform's Postgres when DATABASE_URL is
  one. The checkpoint is also what a run resumes from after its worker died.
- Long-term: a LangGraph Store with an embedding index (the workspace's embedding model) in the platform's
  database (agent_studio/store.py), namespaced per agent and end user; the agent saves and searches memories
  through two tools.
- Named variables: typed values with a scope (conversation, end user, app), read in the prompt as `{name}` and
  written by the agent through a tool (agent_studio/toolkit.py).
"""

import json
import re
import sqlite3
import threading
from functools import cache
from pathlib import Path

from django.conf import settings
from django.db import connection, transaction

from agent_studio.config import fits_type
from agent_studio.models import AgentThread, MemoryItem, VariableScope, VariableValue

_lock = threading.Lock()


def _uses_postgres() -> bool:
    return connection.vendor == "postgresql"


def _agents_dir() -> Path:
    path = Path(settings.DATA_DIR) / "agents"
    path.mkdir(parents=True, exist_ok=True)
    return path


def _sqlite(path: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(path, check_same_thread=False, timeout=30)
    conn.execute("PRAGMA journal_mode=WAL")
    # No fsync per checkpoint (11 of the 14 ms a step took): in WAL mode a killed worker loses nothing, and a power
    # cut loses at most the last checkpoints, never the file's consistency; the run then resumes a step earlier.
    conn.execute("PRAGMA synchronous=NORMAL")
    conn.execute("PRAGMA busy_timeout=30000")
    return conn


def _postgres_pool():
    from psycopg.rows import dict_row
    from psycopg_pool import ConnectionPool

    params = connection.settings_dict
    conninfo = (f"host={params['HOST'] or 'localhost'} port={params['PORT'] or 5432} dbname={params['NAME']} "
                f"user={params['USER']} password={params['PASSWORD']}")
    return ConnectionPool(conninfo, max_size=4, open=True,
                          kwargs={"autocommit": True, "prepare_threshold": 0, "row_factory": dict_row})


@cache
def checkpointer():
    """This process's checkpoint saver, its tables made on first use."""
    with _lock:
        if _uses_postgres():
            from langgraph.checkpoint.postgres import PostgresSaver

            saver = PostgresSaver(_postgres_pool())
        else:
            from langgraph.checkpoint.sqlite import SqliteSaver

            saver = SqliteSaver(_sqlite(_agents_dir() / "checkpoints.sqlite"))
        saver.setup()
        return saver


def thread_key(thread: AgentThread) -> str:
    """The conversation's LangGraph thread id in the checkpointer."""
    return f"agent-thread-{thread.public_id}"


def forget_agent(*, agent_id: int, threads: list[AgentThread]) -> None:
    """What a deleted agent remembered: its long-term memories (every end user's), and its conversations'
    checkpoints once the deletion is committed, as they live outside the database transaction."""
    from agent_studio.store import SEPARATOR

    MemoryItem.objects.filter(namespace__startswith=SEPARATOR.join(("agent", str(agent_id), ""))).delete()
    keys = [thread_key(thread) for thread in threads]

    def forget_checkpoints() -> None:
        for key in keys:
            checkpointer().delete_thread(key)

    if keys:
        transaction.on_commit(forget_checkpoints)


@cache
def long_term_store(model_path: str):
    """This process's long-term memory store for one embedding model (the workspace's)."""
    from agent_studio.store import DatabaseStore
    from rag_studio.embedding import Embedder

    embedder = Embedder(model_path=model_path, deployment=None, workspace_id=0)
    return DatabaseStore(embed=lambda texts: embedder.embed(list(texts)))


def memory_namespace(agent_id: int, end_user: str) -> tuple[str, ...]:
    return ("agent", str(agent_id), end_user or "-")


def scope_key(scope: str, thread: AgentThread) -> str:
    if scope == VariableScope.CONVERSATION:
        return str(thread.public_id)
    if scope == VariableScope.END_USER:
        return thread.end_user
    return "app"


def variable_values(*, definitions: list[dict], thread: AgentThread) -> dict:
    """Each defined variable's value in this thread's scopes, or its default."""
    values = {definition["name"]: definition.get("default") for definition in definitions}
    if not values:
        return values
    stored = VariableValue.objects.filter(agent_id=thread.agent_id, name__in=list(values))
    by_key = {(row.name, row.scope, row.scope_key): row.value for row in stored}
    for definition in definitions:
        key = (definition["name"], definition["scope"], scope_key(definition["scope"], thread))
        if key in by_key:
            values[definition["name"]] = by_key[key]
    return values


class VariableRefused(ValueError):
    pass


def set_variable(*, definitions: list[dict], thread: AgentThread, name: str, value) -> dict:
    """Write one variable in its scope; a name the agent does not define, or a value of the wrong type, is
    refused with the reason (the agent reads it as a tool error)."""
    definition = next((item for item in definitions if item["name"] == name), None)
    if definition is None:
        raise VariableRefused(f"There is no variable '{name}'; the variables are "
                              f"{', '.join(item['name'] for item in definitions) or 'none'}.")
    if value is not None and not fits_type(value, definition["type"]):
        raise VariableRefused(f"'{name}' holds a {definition['type']}, not {json.dumps(value, ensure_ascii=False)}.")
    VariableValue.objects.update_or_create(
        agent_id=thread.agent_id, name=name, scope=definition["scope"],
        scope_key=scope_key(definition["scope"], thread), defaults={"value": value})
    return definition


PLACEHOLDER = re.compile(r"\{([A-Za-z][A-Za-z0-9_]{0,63})\}")


def render_prompt(template: str, values: dict) -> str:
    """`{name}` replaced by the variable's value; braces that name no variable are left as written."""
    def fill(match: re.Match) -> str:
        name = match.group(1)
        if name not in values:
            return match.group(0)
        value = values[name]
        return "" if value is None else value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)

    return PLACEHOLDER.sub(fill, template)
