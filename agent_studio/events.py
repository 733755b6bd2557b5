"""A run's live events: the worker running it appends each step to a Redis stream, and every viewer (the debug
chat, an app's SSE client, the API) reads the stream from where it is, so the steps show as they happen whichever
process serves the viewer. The steps are also rows (RunStep), which outlive the stream (kept an hour).

Event types: `status` (queued, running, awaiting_approval…), `step` (a RunStep as the API shows it), `token` (a
piece of the answer as the model writes it: live only, a run replayed from its rows has none), `plan` (the plan
awaiting approval), `done` (the answer), `error`, `cancelled`. The last three, and `plan`, end a viewer's stream.
"""

import json
from collections.abc import AsyncIterator
from functools import cache

import redis
import redis.asyncio as aredis
from django.conf import settings

from accounts import redis_connections

STREAM_TTL_S = 3600
STREAM_MAX_EVENTS = 5000
ENDING = {"done", "error", "cancelled", "plan"}


def _key(run_public_id) -> str:
    return f"agent-run:{run_public_id}"


@cache
def _client() -> redis.Redis:
    return redis.Redis.from_url(settings.REDIS_URL, **redis_connections.options())


def publish(run_public_id, event: str, data: dict) -> None:
    publish_many(run_public_id, [(event, data)])


def publish_many(run_public_id, batch: list[tuple[str, dict]]) -> None:
    """Several events of a run, in order, in one round trip to Redis."""
    key = _key(run_public_id)
    pipe = _client().pipeline()
    for event, data in batch:
        pipe.xadd(key, {"event": event, "data": json.dumps(data, ensure_ascii=False, default=str)},
                  maxlen=STREAM_MAX_EVENTS, approximate=True)
    pipe.expire(key, STREAM_TTL_S)
    pipe.execute()


async def follow(run_public_id, *, after: str = "0", block_ms: int = 15_000) -> AsyncIterator[tuple[str, str, dict]]:
    """(stream id, event, data) from after `after`, waiting for new ones, until an ending event; a quiet stream
    yields ("", "ping", {}) every `block_ms` so that the caller can keep its connection alive."""
    client = aredis.Redis.from_url(settings.REDIS_URL, socket_timeout=block_ms / 1000 + 10,
                                   **redis_connections.async_options())
    try:
        last = after
        while True:
            batches = await client.xread({_key(run_public_id): last}, count=100, block=block_ms)
            if not batches:
                yield "", "ping", {}
                continue
            for stream_id, fields in batches[0][1]:
                last = stream_id.decode()
                event = fields[b"event"].decode()
                yield last, event, json.loads(fields[b"data"])
                if event in ENDING:
                    return
    finally:
        await client.aclose()


def stream_exists(run_public_id) -> bool:
    return bool(_client().exists(_key(run_public_id)))


def last_id(run_public_id) -> str:
    """The id of the stream's latest event, to follow a run from here on ("0" when it has none)."""
    latest = _client().xrevrange(_key(run_public_id), count=1)
    return latest[0][0].decode() if latest else "0"
