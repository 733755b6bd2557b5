"""Job kinds. Upper floors (serving, enhancement) register a handler for each kind of job they dispatch, so the
cluster runs their work without importing them.

A handler takes the Job and a `report(progress, message)` callback and returns a JSON-able result. It may be
run again after a worker dies mid-way, so it must be safe to repeat.
"""

from collections.abc import Callable
from typing import Any

Report = Callable[[float, str], None]
Handler = Callable[[Any, Report], dict]
_handlers: dict[str, Handler] = {}


def job_handler(kind: str):
    def register(handler: Handler) -> Handler:
        _handlers[kind] = handler
        return handler

    return register


def handler_for(kind: str) -> Handler | None:
    return _handlers.get(kind)


def known_kinds() -> list[str]:
    return sorted(_handlers)
