"""The gateway's constrained tool calls, request and answer side, without an engine (the live path is in
test_gateway.py)."""

import json

import pytest

from serving import toolcalls

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather for a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
CLOCK = {"type": "function", "function": {"name": "get_time"}}


def _request(**fields) -> dict:
    return {"model": "m", "messages": [{"role": "user", "content": "Weather in Paris?"}], "tools": [WEATHER, CLOCK],
            "stream": True, **fields}


def _completion(content: str, finish: str = "stop") -> dict:
    return {"id": "c1", "created": 1, "model": "m", "usage": {"prompt_tokens": 9, "completion_tokens": 5},
            "choices": [{"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": finish}]}


def test_each_tool_is_a_branch_of_the_reply_schema_and_auto_adds_an_answer():
    body = _request()
    functions = toolcalls.functions_of(body)
    sent = toolcalls.constrained_request(body, functions, toolcalls.choice_of(body, functions))

    branches = sent["response_format"]["json_schema"]["schema"]["anyOf"]
    assert [b["properties"].get("name", {}).get("const") for b in branches] == ["get_weather", "get_time", None]
    assert branches[0]["properties"]["arguments"] == WEATHER["function"]["parameters"]
    assert branches[2]["required"] == ["answer"]
    assert sent["stream"] is False and "tools" not in sent and "tool_choice" not in sent
    assert sent["messages"][0]["role"] == "system" and "get_weather: Current weather" in sent["messages"][0]["content"]


def test_a_named_tool_choice_leaves_only_that_tool_and_required_leaves_no_answer():
    named = _request(tool_choice={"type": "function", "function": {"name": "get_time"}})
    functions = toolcalls.functions_of(named)
    assert toolcalls.reply_schema(functions, toolcalls.choice_of(named, functions))["properties"]["name"] == {
        "const": "get_time"}
    required = toolcalls.reply_schema(functions, "required")["anyOf"]
    assert all("name" in branch["properties"] for branch in required)


@pytest.mark.parametrize("fields, param", [
    ({"tools": []}, "tools"),
    ({"tools": [{"type": "function", "function": {"name": "has space"}}]}, "tools[0].function.name"),
    ({"tools": [{"type": "retrieval"}]}, "tools[0].function.name"),
    ({"tools": [WEATHER, WEATHER]}, "tools"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": "x"}}]}, "tools[0].function.parameters"),
    ({"tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
])
def test_bad_tools_are_refused_naming_the_field(fields, param):
    body = _request(**fields)
    with pytest.raises(toolcalls.ToolsInvalid) as refused:
        toolcalls.choice_of(body, toolcalls.functions_of(body))
    assert refused.value.param == param


def test_a_conversation_with_calls_and_results_reaches_the_engine_in_plain_roles():
    body = _request(messages=[
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function", "function": {
            "name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "18°C, 晴"},
    ])
    sent = toolcalls.constrained_request(body, toolcalls.functions_of(body), "auto")

    assert [m["role"] for m in sent["messages"]] == ["system", "user", "assistant", "user"]
    assert sent["messages"][0]["content"].startswith("Be brief.\n\nYou can call these tools:")
    assert json.loads(sent["messages"][2]["content"]) == {"name": "get_weather", "arguments": {"city": "Paris"}}
    assert sent["messages"][3]["content"] == "Result of get_weather: 18°C, 晴"


def test_the_constrained_json_becomes_a_tool_call_an_answer_or_stays_text_when_cut_short():
    call = toolcalls.tool_reply(_completion('{"name": "get_weather", "arguments": {"city": "巴黎"}}'))
    answer = toolcalls.tool_reply(_completion('{"answer": "Hello!"}'))
    cut = toolcalls.tool_reply(_completion('{"name": "get_wea', finish="length"))

    message = call["choices"][0]["message"]
    assert call["choices"][0]["finish_reason"] == "tool_calls" and message["content"] is None
    assert message["tool_calls"][0]["function"] == {"name": "get_weather", "arguments": '{"city": "巴黎"}'}
    assert message["tool_calls"][0]["id"].startswith("call_")
    assert answer["choices"][0]["message"] == {"role": "assistant", "content": "Hello!"}
    assert cut["choices"][0]["message"]["content"] == '{"name": "get_wea' and cut["choices"][0]["finish_reason"] == \
        "length"


def test_a_streamed_tool_call_arrives_as_openai_deltas_with_usage_only_when_asked():
    reply = toolcalls.tool_reply(_completion('{"name": "get_time", "arguments": {}}'))
    events = [line[6:] for line in toolcalls.as_stream(reply, include_usage=False).decode().split("\n\n") if line]
    with_usage = toolcalls.as_stream(reply, include_usage=True).decode()

    chunks = [json.loads(event) for event in events[:-1]]
    assert events[-1] == "[DONE]"
    delta = chunks[0]["choices"][0]["delta"]
    assert delta["role"] == "assistant" and delta["tool_calls"][0]["index"] == 0
    assert delta["tool_calls"][0]["function"]["name"] == "get_time"
    assert chunks[1]["choices"][0]["finish_reason"] == "tool_calls"
    assert '"usage"' not in "".join(events) and '"completion_tokens": 5' in with_usage
