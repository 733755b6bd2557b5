"""Prompt sets that calibration can run on, offered by the studios above serving (a RAG eval set, an agent's
scenarios): a registry on serving's floor, which the studios fill when they load, so that serving lists and reads
their sets without importing them (DESIGN.md §2)."""

from collections.abc import Callable
from dataclasses import dataclass

from accounts.registry import Registry


@dataclass(frozen=True)
class PromptSource:
    key: str
    label: str
    # The workspace's sets of this kind: (id, name).
    sets: Callable[..., list[tuple[int, str]]]
    # One set's {"prompt", "reference"} pairs, or None when the workspace has no such set.
    items: Callable[..., list[dict] | None]


_sources: Registry[PromptSource] = Registry()


def register_prompt_source(source: PromptSource) -> None:
    _sources.add(source.key, source)


def prompt_sources() -> list[PromptSource]:
    return _sources.entries()


def find(key: str) -> PromptSource | None:
    return _sources.get(key)
