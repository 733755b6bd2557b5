"""How every process of the platform connects to Redis (rate limits, the cache, run events, the queues' line), in
one place.

Redis restarted under a running platform leaves each pooled connection stale: the first command on it finds the
socket closed. redis-py sends a command again on a fresh connection only when told to, and a client made with
`from_url` (as limits, Django's cache and our own modules make theirs) gets no retry at all: that first command
failed, and with it the request (a 503 from the gateway's rate limiter). So every client is given the same policy,
redis-py's own: one retry on a dropped connection after a short jittered pause, and a PING before reusing a
connection idle for HEALTH_CHECK_S (a connection whose peer vanished without closing it). A timeout is not retried
(a Redis that hangs would only make the caller wait twice), and a Redis that stays down still fails the command
after that one retry, so a request is refused (503, Retry-After) rather than held.

redis-py only: factory/settings.py reads it before Django is set up."""

from redis.asyncio.retry import Retry as AsyncRetry
from redis.backoff import ExponentialWithJitterBackoff
from redis.exceptions import ConnectionError as ConnectionDropped
from redis.retry import Retry

RETRIES = 1
BACKOFF_BASE_S = 0.05
BACKOFF_CAP_S = 0.5
HEALTH_CHECK_S = 30


def _backoff() -> ExponentialWithJitterBackoff:
    return ExponentialWithJitterBackoff(base=BACKOFF_BASE_S, cap=BACKOFF_CAP_S)


def options() -> dict:
    """Keyword arguments for a sync client or pool: `redis.Redis.from_url`, limits' RedisStorage, Django's
    RedisCache OPTIONS."""
    return {"retry": Retry(_backoff(), RETRIES, supported_errors=(ConnectionDropped,)),
            "health_check_interval": HEALTH_CHECK_S}


def async_options() -> dict:
    """`options` for redis.asyncio, whose Retry is a class of its own."""
    return {"retry": AsyncRetry(_backoff(), RETRIES, supported_errors=(ConnectionDropped,)),
            "health_check_interval": HEALTH_CHECK_S}
