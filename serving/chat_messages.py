"""The OpenAI chat `messages` list, checked once: by the gateway (`/v1/chat/completions`), and by a published app's
OpenAI-compatible endpoint, which takes text turns only and fewer roles."""

from accounts.errors import ValidationFailed

CHAT_ROLES = frozenset({"system", "developer", "user", "assistant", "tool"})


class InvalidMessages(ValidationFailed):
    """The first thing wrong with a `messages` list, in the user's words; `param` is where (`messages[2].role`)."""

    def __init__(self, message: str, *, param: str, reason: str = "Invalid."):
        super().__init__(message, fields={param: [reason]})
        self.param = param


def text_of(content) -> str | None:
    """A message's content as text: a string, or a list of parts whose text parts are joined; None for anything
    else (a part that is not an object, or a text part whose text is not a string)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(isinstance(part, dict) for part in content):
        texts = [part.get("text") for part in content if part.get("type") == "text"]
        if all(isinstance(text, str) for text in texts):
            return "".join(texts)
    return None


def check_messages(messages, *, roles: frozenset[str] = CHAT_ROLES, text_only: bool = False) -> list[dict]:
    """`messages`, checked: a non-empty list of {role, content} with each role among `roles` and each content a
    string or a list of parts (an assistant's may be null: it called tools). With `text_only`, each content must be
    text (`text_of`), and the messages come back as {role, content: str}. InvalidMessages names the first bad one."""
    if not isinstance(messages, list) or not messages:
        raise InvalidMessages("'messages' must be a non-empty list of {role, content} objects.", param="messages",
                              reason="Required.")
    checked = []
    for index, message in enumerate(messages):
        if not isinstance(message, dict) or message.get("role") not in roles:
            raise InvalidMessages(f"messages[{index}] needs a 'role', one of {sorted(roles)}.",
                                  param=f"messages[{index}].role")
        content = message.get("content")
        if text_only:
            content = text_of(content)
            if content is None:
                raise InvalidMessages(f"messages[{index}].content must be a string or a list of text parts.",
                                      param=f"messages[{index}].content")
            checked.append({"role": message["role"], "content": content})
        elif not (isinstance(content, (str, list)) or (content is None and message["role"] == "assistant")):
            raise InvalidMessages(f"messages[{index}].content must be a string or a list of parts.",
                                  param=f"messages[{index}].content")
    return checked if text_only else messages
