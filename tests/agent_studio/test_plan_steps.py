"""A plan step that names a tool is offered only that tool; the request and the steps done so far, which the step's
task also quotes, do not count."""

from dataclasses import dataclass, replace

from langchain_core.messages import AIMessage, HumanMessage

from agent_studio.graphs import STEP_MARKER, tools_the_step_names


@dataclass(frozen=True)
class Tool:
    name: str


@dataclass(frozen=True)
class Request:
    messages: list
    tools: list

    def override(self, **fields):
        return replace(self, **fields)


TOOLS = [Tool("search_Handbook"), Tool("word_count")]


def _offered(task: str) -> list[str]:
    request = Request(messages=[HumanMessage(content=task), AIMessage(content="")], tools=TOOLS)
    return [tool.name for tool in tools_the_step_names.wrap_model_call(request, lambda seen: seen).tools]


def test_only_the_step_being_done_chooses_the_tools():
    task = ("The user's request: search_Handbook for leave, then word_count it\n"
            "Steps done so far:\n1. search_Handbook for the leave policy -> 25 days\n"
            f"{STEP_MARKER} 2: word_count of 'Every employee gets 25 days'")
    assert _offered(task) == ["word_count"]


def test_a_step_naming_no_tool_is_offered_every_tool():
    assert _offered(f"The user's request: word_count this\n{STEP_MARKER} 1: Report the number") == [
        "search_Handbook", "word_count"]
