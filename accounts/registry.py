"""The one shape of a registry: a lower floor keeps it, and the apps above fill it when they load, so that it
calls their code without importing them (DESIGN.md §2: cross-floor callbacks go through a registry on the lower
floor, never an upward import). Bundle importers (assets), job handlers (cluster), engines, calibration's prompt
sources and the directories of model producers (serving) are kept in one each."""

from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class Registry(Generic[T]):
    """Entries by name; registering a name again replaces its entry (a module loaded twice registers twice)."""

    def __init__(self) -> None:
        self._entries: dict[str, T] = {}

    def add(self, name: str, entry: T) -> T:
        self._entries[name] = entry
        return entry

    def registering(self, name: str) -> Callable[[T], T]:
        """A decorator that registers what it decorates under `name`."""
        return lambda entry: self.add(name, entry)

    def get(self, name: str) -> T | None:
        return self._entries.get(name)

    def __getitem__(self, name: str) -> T:
        return self._entries[name]

    def names(self) -> list[str]:
        return sorted(self._entries)

    def entries(self) -> list[T]:
        """Every entry, in the order of their names."""
        return [self._entries[name] for name in self.names()]
