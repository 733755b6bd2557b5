"""Agent Studio's unit tests script the model's replies (LangChain's fake chat model, tagged as a gateway call so
the run counts it as one) and run everything else for real: the LangGraph templates, the checkpointer, Work Bridge
tools in the sandbox, the recorder and the database."""

import re
from collections import deque
from collections.abc import Iterator
from typing import Any

import pytest
from langchain_core.language_models.chat_models import BaseChatModel
from langchain_core.messages import AIMessage, AIMessageChunk
from langchain_core.outputs import ChatGeneration, ChatGenerationChunk, ChatResult

from accounts.services import SYSTEM, Actor
from agent_studio import graphs, runner
from agent_studio.models import AgentRun
from agent_studio.strategies import GATEWAY_TAG
from cluster import inventory
from cluster.services import register_node
from serving import presets
from serving.services import create_deployment, register_model
from tests.conftest import WORKER_NODE

MODEL = "smollm2-135m-instruct"
AGENTS = "/api/agents/"
WORD_COUNT = "def run(args):\n    return {'words': len(args['text'].split())}\n"


class ScriptedModel(BaseChatModel):
    """Answers with the next reply of a script shared by every model a run builds; a callable reply is given the
    prompt first. A streamed reply comes word by word, as an engine streams it."""

    script: Any
    prompts: Any
    offered: Any
    tools: list = []

    @property
    def _llm_type(self) -> str:
        return "scripted"

    def bind_tools(self, tools, **kwargs):
        return self.model_copy(update={"tools": [tool.name for tool in tools]})

    def _generate(self, messages, stop=None, run_manager=None, **kwargs) -> ChatResult:
        self.prompts.append(messages)
        self.offered.append(self.tools)
        if not self.script:
            raise AssertionError("The scripted model was called more often than the test expected.")
        reply = self.script.popleft()
        reply = reply(messages) if callable(reply) else reply
        message = reply if isinstance(reply, AIMessage) else AIMessage(content=reply)
        return ChatResult(generations=[ChatGeneration(message=message)])

    def _stream(self, messages, stop=None, run_manager=None, **kwargs) -> Iterator[ChatGenerationChunk]:
        message = self._generate(messages).generations[0].message
        if message.tool_calls:
            raise AssertionError("A streamed call is offered no tools; the script gave it a tool call.")
        for piece in re.findall(r"\s*\S+", message.content) or [""]:
            yield ChatGenerationChunk(message=AIMessageChunk(content=piece))


class Script(deque):
    """Replies (AIMessage, text, or a function of the prompt), every prompt the model was given, and the names of
    the tools each call was offered."""

    def __init__(self):
        super().__init__()
        self.prompts = []
        self.offered = []


@pytest.fixture
def script(monkeypatch):
    replies = Script()
    prompts = replies.prompts

    def gateway_model(**kwargs):
        return ScriptedModel(script=replies, prompts=prompts, offered=replies.offered, tags=[GATEWAY_TAG])

    monkeypatch.setattr(graphs, "gateway_model", gateway_model)
    return replies


def call(tool: str, /, **arguments) -> AIMessage:
    return AIMessage(content="", tool_calls=[{"name": tool, "args": arguments, "id": f"call_{tool}_{len(arguments)}",
                                              "type": "tool_call"}])


@pytest.fixture
def chat_deployment(transactional_db):
    """Runs are run inline by the tests (run_inline): their queued messages go where no worker reads
    (tests/conftest.py). Tools run in LangGraph's thread pool, whose database connections must see committed rows,
    so these tests use transactional databases, where a dispatch happens for real."""
    node = register_node(name=WORKER_NODE, resources=inventory.probe())
    locate, role, _template = presets.PRESETS[presets.SMOLLM2]
    model = register_model(actor=SYSTEM, workspace=None, name=MODEL, path=str(locate()), role_hint=role)
    return create_deployment(actor=SYSTEM, workspace=None, model=model, name=MODEL, replicas=[(node, 1.0)])


@pytest.fixture
def acme(make_workspace, chat_deployment):
    return make_workspace("Acme", owner="ann", dev="developer", viewer="viewer")


@pytest.fixture
def ann(acme):
    return Actor(user=acme.memberships.get(role="owner").user)


@pytest.fixture
def dev(acme, key_client):
    return key_client("dev", acme)


@pytest.fixture
def word_count(dev):
    return dev.post("/api/workbridge/tools/", {
        "name": "word_count", "description": "Count the words of a text.", "binding": "python",
        "parameters": {"type": "object", "required": ["text"], "properties": {"text": {"type": "string"}}},
        "config": {"code": WORD_COUNT}}, format="json").json()


def run_inline(run_id, **kwargs) -> AgentRun:
    """What the worker does with a queued run, in this process; the run as it ended (or paused)."""
    pk = AgentRun.objects.get(public_id=run_id).pk if not isinstance(run_id, int) else run_id
    runner.execute(pk, owner="test-worker", **kwargs)
    return AgentRun.objects.get(pk=pk)
