"""The one check of an OpenAI `messages` list, as the gateway and a published app's endpoint use it."""

import pytest

from serving.chat_messages import CHAT_ROLES, InvalidMessages, check_messages

APP_ROLES = CHAT_ROLES - {"tool"}


@pytest.mark.parametrize("messages, param, text", [
    ("hi", "messages", "'messages' must be a non-empty list of {role, content} objects."),
    ([], "messages", "'messages' must be a non-empty list of {role, content} objects."),
    ([{"role": "user", "content": "hi"}, {"role": "robot", "content": "x"}], "messages[1].role",
     "messages[1] needs a 'role', one of ['assistant', 'developer', 'system', 'tool', 'user']."),
    ([{"role": "user", "content": 3}], "messages[0].content",
     "messages[0].content must be a string or a list of parts."),
])
def test_the_gateway_names_the_first_bad_message(messages, param, text):
    with pytest.raises(InvalidMessages) as caught:
        check_messages(messages)
    assert (caught.value.param, caught.value.message) == (param, text)


def test_the_gateway_takes_parts_and_an_assistant_that_only_called_tools():
    messages = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:,"}}]},
                {"role": "assistant", "content": None, "tool_calls": []}, {"role": "tool", "content": "42"}]
    assert check_messages(messages) is messages


def test_an_app_takes_text_turns_only_and_gets_them_as_text():
    parts = [{"type": "text", "text": "Leave "}, {"type": "text", "text": "days?"}]
    turns = check_messages([{"role": "system", "content": "Be brief."}, {"role": "user", "content": parts}],
                           roles=APP_ROLES, text_only=True)
    assert turns == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Leave days?"}]
    with pytest.raises(InvalidMessages) as caught:
        check_messages([{"role": "assistant", "content": None}], roles=APP_ROLES, text_only=True)
    assert caught.value.fields == {"messages[0].content": ["Invalid."]}
    assert caught.value.message == "messages[0].content must be a string or a list of text parts."
    with pytest.raises(InvalidMessages) as caught:
        check_messages([{"role": "tool", "content": "42"}], roles=APP_ROLES, text_only=True)
    assert "'tool'" not in caught.value.message
