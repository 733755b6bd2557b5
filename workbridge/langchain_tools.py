"""Work Bridge tools as LangChain tools, for Agent Studio and RAG: each call goes through `invoke_tool` (checked,
guarded, recorded), and whatever goes wrong comes back to the model as a tool error message it can react to, never
as an exception that ends the run."""

import json

from asgiref.sync import sync_to_async
from langchain_core.tools import StructuredTool

from accounts.errors import ApplicationError
from accounts.services import Actor
from workbridge import services
from workbridge.models import Tool


def _runner(actor: Actor, tool: Tool, caller: str):
    def run(**arguments) -> str:
        try:
            result = services.invoke_tool(actor=actor, tool=tool, arguments=arguments, caller=caller)
        except ApplicationError as exc:
            return f"Tool error: {exc.message}"
        if not result.ok:
            return f"Tool error: {result.invocation.error}"
        return result.output if isinstance(result.output, str) else json.dumps(result.output, ensure_ascii=False)

    return run


def as_langchain_tools(*, actor: Actor, tools, caller: str) -> list[StructuredTool]:
    """`tools` as StructuredTools whose argument schema is the tool's own JSON Schema; sync and async."""
    made = []
    for tool in tools:
        run = _runner(actor, tool, caller)
        made.append(StructuredTool.from_function(func=run, coroutine=sync_to_async(run, thread_sensitive=False),
                                                 name=tool.name, description=tool.description,
                                                 args_schema=tool.parameters))
    return made
