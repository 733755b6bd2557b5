"""Tool calls on SmolLM2-135M through the real gateway (its chat template has no tool-call format, so the gateway
uses the constrained strategy): what an OpenAI client gets for each `tool_choice`, and for an argument the model
would repeat until max_tokens."""

import json

import pytest
from django.contrib.auth import get_user_model
from openai import OpenAI

from accounts.services import Actor, create_api_key, create_workspace
from serving.models import Deployment
from serving.presets import SMOLLM2
from tests.conftest import deploy_presets, stop_engines_and_flush

pytestmark = pytest.mark.worker

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather and the forecast for a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
NOTE = {"type": "function", "function": {
    "name": "create_note", "description": "Save a note with a title and its text in the user's notebook.",
    "parameters": {"type": "object", "properties": {"title": {"type": "string"}, "content": {"type": "string"}},
                   "required": ["title", "content"]}}}


@pytest.fixture(scope="module")
def client(shared_smollm2, web_server, django_db_blocker) -> OpenAI:
    with django_db_blocker.unblock():
        deploy_presets({SMOLLM2: 1})
        assert Deployment.objects.get(name=SMOLLM2).tool_strategy == "constrained"
        owner = get_user_model().objects.create_user(username="tools-owner", password="x" * 12)
        workspace = create_workspace(actor=Actor(user=owner), name="Tool calls")
        key = create_api_key(actor=Actor(user=owner), workspace=workspace, name="tools").secret
        yield OpenAI(base_url=f"{web_server}/v1", api_key=key, max_retries=0, timeout=120)
        stop_engines_and_flush(keep=SMOLLM2)


def _ask(client: OpenAI, prompt: str, **options):
    return client.chat.completions.create(model=SMOLLM2, messages=[{"role": "user", "content": prompt}],
                                          temperature=0, **options)


def test_an_argument_cut_short_by_max_tokens_still_comes_back_as_a_parseable_call(client):
    answer = _ask(client, "Save a note titled Laugh whose text is the word 'ha' written five hundred times.",
                  tools=[NOTE, WEATHER], tool_choice="required", max_tokens=24)

    call = answer.choices[0].message.tool_calls[0]
    assert call.function.name == "create_note" and answer.choices[0].finish_reason == "length"
    assert isinstance(json.loads(call.function.arguments), dict)


def test_a_named_tool_is_called_and_required_always_calls_one(client):
    named = _ask(client, "Tell me a joke.", tools=[WEATHER, NOTE], max_tokens=60,
                 tool_choice={"type": "function", "function": {"name": "get_weather"}})
    required = _ask(client, "Good morning!", tools=[WEATHER, NOTE], tool_choice="required", max_tokens=60)

    assert [call.function.name for call in named.choices[0].message.tool_calls] == ["get_weather"]
    assert "city" in json.loads(named.choices[0].message.tool_calls[0].function.arguments)
    call = required.choices[0].message.tool_calls[0]
    assert call.function.name in {"get_weather", "create_note"} and json.loads(call.function.arguments) != {}
    assert required.choices[0].finish_reason == "tool_calls"


def test_with_tool_choice_none_or_no_fitting_tool_the_reply_is_text_streamed_token_by_token(client):
    declined = _ask(client, "Hi! How are you today?", tools=[WEATHER], tool_choice="none", max_tokens=30)
    chunks = list(_ask(client, "Write a two-line poem about the ocean.", tools=[WEATHER, NOTE], max_tokens=30,
                       stream=True))

    assert declined.choices[0].message.content.strip() and not declined.choices[0].message.tool_calls
    pieces = [c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content]
    assert len(pieces) > 3 and not any(c.choices and c.choices[0].delta.tool_calls for c in chunks)


def test_a_request_a_tool_fits_gets_a_call_of_that_tool(client):
    answer = _ask(client, "Is it going to rain in Oslo today?", tools=[NOTE, WEATHER], max_tokens=60)

    call = answer.choices[0].message.tool_calls[0]
    assert call.function.name == "get_weather" and json.loads(call.function.arguments)["city"]
