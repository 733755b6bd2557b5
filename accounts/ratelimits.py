"""Rate limits for the gateway, the apps' API, the web chat and sign-in, counted in Redis so that every web
process agrees. The `limits` library does the counting with its sliding-window counter: a fixed window lets a caller
send twice the rate across a window's edge, a sliding one does not. A limit is written in limits' notation
("600/minute", "10 per 15 minutes") and read from settings at each call, so tests and operators can change it.

Redis not answering is not a reason to turn every caller away with a 500, nor to let every caller through
unnoticed: it raises ServiceUnavailable, a 503 with Retry-After. A connection dropped by a Redis restart is not
"not answering": the storages retry it once on a fresh connection (accounts/redis_connections.py)."""

import asyncio
import math
import time
import weakref
from functools import lru_cache

from django.conf import settings
from limits import RateLimitItem, parse
from limits.aio.storage import RedisStorage as AsyncRedisStorage
from limits.aio.strategies import SlidingWindowCounterRateLimiter as AsyncSlidingWindow
from limits.errors import StorageError
from limits.storage import RedisStorage
from limits.strategies import SlidingWindowCounterRateLimiter

from accounts import redis_connections
from accounts.errors import RateLimited, ServiceUnavailable

KEY_PREFIX = "factory:rate"
UNAVAILABLE = "The platform's rate limiter (Redis) is not answering; retry in a few seconds."
_async_limiters: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, tuple[str, AsyncSlidingWindow]]" = (
    weakref.WeakKeyDictionary())


@lru_cache(maxsize=64)
def _item(limit: str) -> RateLimitItem:
    return parse(limit)


@lru_cache(maxsize=4)
def _sync_limiter(redis_url: str) -> SlidingWindowCounterRateLimiter:
    storage = RedisStorage(redis_url, key_prefix=KEY_PREFIX, wrap_exceptions=True, socket_timeout=2,
                           socket_connect_timeout=2, **redis_connections.options())
    return SlidingWindowCounterRateLimiter(storage)


def _async_limiter() -> AsyncSlidingWindow:
    # redis.asyncio's connections belong to the event loop they were opened on: one limiter per loop.
    loop = asyncio.get_running_loop()
    url = settings.REDIS_URL
    held = _async_limiters.get(loop)
    if held is None or held[0] != url:
        storage = AsyncRedisStorage(f"async+{url}", implementation="redispy", key_prefix=KEY_PREFIX,
                                    wrap_exceptions=True, socket_timeout=2, socket_connect_timeout=2,
                                    **redis_connections.async_options())
        held = (url, AsyncSlidingWindow(storage))
        _async_limiters[loop] = held
    return held[1]


def _describe(item: RateLimitItem) -> str:
    period = item.GRANULARITY.name if item.multiples == 1 else f"{item.multiples} {item.GRANULARITY.name}s"
    return f"{item.amount} requests per {period}"


def _refusal(item: RateLimitItem, reset_time: float, what: str) -> RateLimited:
    retry_after = max(1, math.ceil(reset_time - time.time()))
    return RateLimited(f"Rate limit of {_describe(item)} reached for {what}; retry in {retry_after} s.",
                       retry_after=retry_after)


def hit(limit: str, *identifiers: str, what: str) -> None:
    """Count one call against `limit` for `identifiers`; RateLimited (429) past it."""
    item, limiter = _item(limit), _sync_limiter(settings.REDIS_URL)
    try:
        if limiter.hit(item, *identifiers):
            return
        reset_time = limiter.get_window_stats(item, *identifiers).reset_time
    except StorageError:
        raise ServiceUnavailable(UNAVAILABLE)
    raise _refusal(item, reset_time, what)


async def ahit(limit: str, *identifiers: str, what: str) -> None:
    """`hit` on the event loop."""
    item, limiter = _item(limit), _async_limiter()
    try:
        if await limiter.hit(item, *identifiers):
            return
        reset_time = (await limiter.get_window_stats(item, *identifiers)).reset_time
    except StorageError:
        raise ServiceUnavailable(UNAVAILABLE)
    raise _refusal(item, reset_time, what)


def check(limit: str, *identifiers: str, what: str) -> None:
    """Refuse (429) when `identifiers` are already past `limit`, without counting this call: for counting only
    failures, as sign-in does."""
    item, limiter = _item(limit), _sync_limiter(settings.REDIS_URL)
    try:
        if limiter.test(item, *identifiers):
            return
        reset_time = limiter.get_window_stats(item, *identifiers).reset_time
    except StorageError:
        raise ServiceUnavailable(UNAVAILABLE)
    raise _refusal(item, reset_time, what)
