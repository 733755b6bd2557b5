"""Job kinds. Upper floors (serving, enhancement) register a handler for each kind of job they dispatch, so the
cluster runs their work without importing them.

A handler takes the Job and a `report(progress, message)` callback and returns a JSON-able result. It may be
run again after a worker dies mid-way, so it must be safe to repeat.

Only kinds registered `submittable=True` may be submitted through the generic jobs API: the others act on another
app's objects (a replica, a training run) and are dispatched by that app's services, which check whose the object is
and the caller's role first.
"""

from collections.abc import Callable
from typing import Any

from accounts.registry import Registry

Report = Callable[[float, str], None]
Handler = Callable[[Any, Report], dict]
_handlers: Registry[Handler] = Registry()
_submittable: set[str] = set()


def job_handler(kind: str, *, submittable: bool = False):
    if submittable:
        _submittable.add(kind)
    return _handlers.registering(kind)


def handler_for(kind: str) -> Handler | None:
    return _handlers.get(kind)


def known_kinds() -> list[str]:
    return _handlers.names()


def submittable_kinds() -> list[str]:
    return sorted(_submittable)
