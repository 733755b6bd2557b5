"""Tools made from what a user already has: an OpenAPI/Swagger spec (`openapi`), or a cURL command (`curl`). Each
importer gives ToolDrafts, which the user edits before workbridge.services saves them."""

import re
from dataclasses import dataclass, field


class ImportInvalid(ValueError):
    """The input cannot be made into tools; the message says why, in the user's words."""


@dataclass
class ToolDraft:
    name: str
    description: str
    parameters: dict
    config: dict
    # "GET /pets/{petId}" for a spec's operation; blank for cURL.
    operation: str = ""
    # Credentials found in the input, by the secret name the config refers to; saved as workspace secrets.
    secrets: dict[str, str] = field(default_factory=dict)


def function_name(text: str) -> str:
    """`text` made into a tool name: other characters become '_', a leading digit gets a prefix."""
    name = re.sub(r"[^A-Za-z0-9_]", "_", text).strip("_") or "tool"
    name = re.sub(r"_+", "_", name)
    return (name if name[0].isalpha() else f"t_{name}")[:64]


def argument_name(wire: str, taken: set[str]) -> str:
    """A parameter's name on the wire (`page[size]`, `X-Request-Id`) as an argument name a model can use, unique
    among `taken` (which it joins)."""
    base = re.sub(r"[^A-Za-z0-9_]", "_", wire).strip("_") or "arg"
    base = re.sub(r"_+", "_", base)
    if not base[0].isalpha():
        base = f"p_{base}"
    name, number = base[:64], 1
    while name in taken:
        number += 1
        name = f"{base[:60]}_{number}"
    taken.add(name)
    return name


def unique_names(drafts: list[ToolDraft]) -> list[ToolDraft]:
    """Tool names unique within one import: a repeat gets _2, _3."""
    seen: set[str] = set()
    for draft in drafts:
        name, number = draft.name, 1
        while name in seen:
            number += 1
            name = f"{draft.name[:60]}_{number}"
        draft.name = name
        seen.add(name)
    return drafts
