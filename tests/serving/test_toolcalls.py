"""The gateway's constrained tool calls, request and answer side, without an engine (the live path is in
test_toolcalls_live.py and test_gateway.py)."""

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
    assert branches[0]["properties"]["arguments"]["properties"]["city"] == {"type": "string", "maxLength": 256}
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


def test_every_string_and_array_argument_is_capped_unless_its_schema_says_less():
    schema = {"type": "object", "properties": {
        "note": {"type": "string"}, "code": {"type": "string", "maxLength": 8},
        "unit": {"type": "string", "enum": ["c", "f"]}, "maybe": {"type": ["string", "null"]},
        "tags": {"type": "array", "items": {"type": "string"}},
        "nested": {"anyOf": [{"type": "object", "properties": {"deep": {"type": "string"}}}, {"type": "integer"}]}},
        "$defs": {"word": {"type": "string", "maxLength": 10000}}}

    held = toolcalls.capped(schema)["properties"]
    cap = toolcalls.MAX_STRING_CHARS
    assert held["note"]["maxLength"] == cap and held["code"]["maxLength"] == 8 and held["maybe"]["maxLength"] == cap
    assert "maxLength" not in held["unit"]
    assert held["tags"] == {"type": "array", "items": {"type": "string", "maxLength": cap},
                            "maxItems": toolcalls.MAX_ARRAY_ITEMS}
    assert held["nested"]["anyOf"][0]["properties"]["deep"]["maxLength"] == cap
    assert toolcalls.capped(schema)["$defs"]["word"]["maxLength"] == cap
    assert "maxLength" not in schema["properties"]["note"], "the client's schema is left as it was"


def test_the_decision_step_offers_the_tool_names_and_none_only_when_it_may_decline():
    body = _request(n=2, max_completion_tokens=500)
    functions = toolcalls.functions_of(body)

    optional = toolcalls.decision_request(body, functions, may_decline=True)
    required = toolcalls.decision_request(body, functions, may_decline=False)

    enum = optional["response_format"]["json_schema"]["schema"]["properties"]["tool"]["enum"]
    assert enum == ["get_weather", "get_time", "none"]
    assert required["response_format"]["json_schema"]["schema"]["properties"]["tool"]["enum"] == [
        "get_weather", "get_time"]
    assert optional["max_tokens"] == toolcalls.DECISION_MAX_TOKENS and optional["stream"] is False
    assert "n" not in optional and "max_completion_tokens" not in optional and "tools" not in optional
    assert "get_weather: Current weather for a city." in optional["messages"][0]["content"]


@pytest.mark.parametrize("content, may_decline, decided", [
    ('{"tool": "get_time"}', True, "get_time"),
    ('```json\n{"tool": "get_time"}\n```', False, "get_time"),
    ('{"tool": "none"}', True, None),
    ('{"to', True, None),  # cut short: no call
    ('{"to', False, "get_weather"),  # cut short, but it may not decline: the first candidate
])
def test_the_decision_is_a_tool_name_or_no_call(content, may_decline, decided):
    functions = toolcalls.functions_of(_request())
    usage = {"prompt_tokens": 40, "completion_tokens": 6, "total_tokens": 46}
    completion = _completion(content) | {"usage": usage}

    assert toolcalls.decision_of(completion, functions, may_decline=may_decline) == toolcalls.Decision(
        name=decided, usage=usage)


def test_the_arguments_step_holds_the_reply_to_the_chosen_tool_s_capped_parameters():
    body = _request(temperature=0.2)
    sent = toolcalls.arguments_request(body, toolcalls.functions_of(body)[0])

    assert sent["response_format"]["json_schema"]["schema"] == toolcalls.capped(WEATHER["function"]["parameters"])
    assert sent["temperature"] == 0.2 and sent["stream"] is False and "tools" not in sent
    assert sent["messages"][0]["content"].startswith("Call the tool get_weather: Current weather for a city.")


@pytest.mark.parametrize("cut, closed", [
    ('{"city": "Par', {"city": "Par"}),
    ('{"city": "Paris", "da', {"city": "Paris"}),
    ('{"tags": ["a", "b', {"tags": ["a", "b"]}),
    ('{"a": {"b": tr', {"a": {}}),
    ('{"q": "say \\"hi', {"q": 'say "hi'}),
    ('{"q": "x\\', {"q": "x"}),
    ("{", {}),
    ("", None),
])
def test_json_cut_short_is_closed_where_it_was_cut(cut, closed):
    assert toolcalls.closed_json(cut) == closed


def test_arguments_that_loop_until_max_tokens_still_come_back_as_a_parseable_call():
    looping = '{"city": "' + "Paris Paris " * 40
    decision = toolcalls.Decision(name="get_weather", usage={"prompt_tokens": 40, "completion_tokens": 6,
                                                             "total_tokens": 46})
    reply = toolcalls.call_reply(_completion(looping, finish="length"), decision)

    call = reply["choices"][0]["message"]["tool_calls"][0]["function"]
    assert call["name"] == "get_weather" and json.loads(call["arguments"])["city"].startswith("Paris Paris")
    assert reply["choices"][0]["finish_reason"] == "length"
    assert reply["usage"] == {"prompt_tokens": 49, "completion_tokens": 11}


def _many_tools(request: str) -> dict:
    names = ["send_email", "play_music", "get_stock_price", "translate_text", "track_package", "get_weather",
             "order_taxi", "create_note"]
    descriptions = ["Send an email message.", "Play a song on the speaker.", "Latest share price of a company.",
                    "Translate a text into another language.", "Track a parcel by its tracking number.",
                    "Current weather and forecast for a city.", "Order a taxi to a destination.",
                    "Save a note in the notebook."]
    return _request(messages=[{"role": "user", "content": request}],
                    tools=[{"type": "function", "function": {"name": name, "description": description}}
                           for name, description in zip(names, descriptions)])


def test_among_many_tools_the_decision_sees_those_the_ranking_cannot_tell_apart_nearest_first():
    clear = _many_tools("Is it going to rain in Oslo today?")
    unclear = _many_tools("Let Anna know the meeting moved.")

    ranked = toolcalls.ranked_tools(clear, toolcalls.functions_of(clear))
    offered, may_decline = toolcalls.candidates_of(ranked, "auto")
    close, _ = toolcalls.candidates_of(toolcalls.ranked_tools(unclear, toolcalls.functions_of(unclear)), "auto")

    assert [function["name"] for function in offered] == ["get_weather"]
    assert may_decline == (ranked[0][1] < toolcalls.CONFIDENT)
    assert len(close) == toolcalls.SHORTLIST and "send_email" in [function["name"] for function in close]
    assert toolcalls.decision_request(unclear, close, may_decline=True)["response_format"]["json_schema"][
        "schema"]["properties"]["tool"]["enum"] == [function["name"] for function in close] + ["none"]


def test_auto_offers_no_tool_for_a_request_far_from_every_description_but_required_still_does():
    body = _many_tools("Who painted the Mona Lisa?")
    ranked = toolcalls.ranked_tools(body, toolcalls.functions_of(body))

    assert ranked[0][1] < toolcalls.RELEVANCE_FLOOR
    assert toolcalls.candidates_of(ranked, "auto") == ([], True)
    offered, may_decline = toolcalls.candidates_of(ranked, "required")
    assert offered and not may_decline
    offered, may_decline = toolcalls.candidates_of(ranked, "auto", after_result=True)
    assert offered and may_decline, "after a tool's result the model is asked"
