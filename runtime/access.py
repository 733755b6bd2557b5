"""Who may call a published app: an app key (server to server) or the app's publishable web-chat token (from a
browser on an allowed origin), each within its rate limit."""

import time
from dataclasses import dataclass
from functools import lru_cache

import redis
from django.conf import settings
from django.utils import timezone

from accounts.errors import ApplicationError, Forbidden, NotFound, Unauthenticated
from accounts.services import secret_matches, secret_prefix
from runtime.models import App, AppKey, Release
from runtime.services import APP_KEY_TAG, WIDGET_TOKEN_TAG

RATE_WINDOW_S = 60


class RateLimited(ApplicationError):
    status = 429
    code = "rate_limited"

    def __init__(self, message: str, *, retry_after: int):
        super().__init__(message)
        self.retry_after = retry_after


@dataclass(frozen=True)
class Access:
    app: App
    release: Release
    app_key: AppKey | None  # None: the web chat's publishable token

    @property
    def end_user_default(self) -> str:
        return f"key:{self.app_key.prefix}" if self.app_key else "web"


# What a call needs of its app, read with it in the same query.
APP_RELATIONS = ("current_release__config_version", "workspace")


def authorize(*, slug: str, authorization: str, origin: str | None, own_origin: str) -> Access:
    """Resolve the app and check the caller's credential, the app's state and the rate limit, in that order."""
    raw = authorization[7:].strip() if authorization.lower().startswith("bearer ") else None
    app_key, refused = None, None
    if raw is not None and not raw.startswith(WIDGET_TOKEN_TAG):
        try:
            app_key = _app_key(raw)
        except Unauthenticated as exc:
            refused = exc
    # A key of this app brings the app along: server-to-server calls, the busiest, cost one query.
    app = app_key.app if app_key and app_key.app.slug == slug else \
        App.objects.select_related(*APP_RELATIONS).filter(slug=slug).first()
    if app is None:
        raise NotFound(f"No app named '{slug}'.")
    if raw is None:
        raise Unauthenticated("Missing app key: send 'Authorization: Bearer <app key>'.")
    if refused is not None:
        raise refused
    if app_key is None:
        _check_widget_token(app, raw, origin, own_origin)
        limit, counter = app.default_rate_limit, f"widget:{app.pk}"
    else:
        if app_key.app_id != app.pk:
            raise Forbidden(f"This key belongs to another app; it cannot call '{slug}'.")
        limit, counter = app_key.rate_limit or app.default_rate_limit, f"key:{app_key.pk}"
    if not app.enabled:
        raise Forbidden(f"The app '{slug}' is disabled. Enable it on its page in AI Factory to serve again.")
    _count_against(counter, limit)
    return Access(app=app, release=app.current_release, app_key=app_key)


def _app_key(raw: str) -> AppKey:
    prefix = secret_prefix(raw, APP_KEY_TAG)
    if prefix is None:
        raise Unauthenticated("That is not an app key; create one on the app's page (they start with 'afa_').")
    app_key = AppKey.objects.select_related(*(f"app__{relation}" for relation in APP_RELATIONS)).filter(
        prefix=prefix).first()
    if app_key is None or not secret_matches(raw, app_key.key_hash):
        raise Unauthenticated("Invalid app key.")
    if app_key.revoked_at is not None:
        raise Unauthenticated("This app key has been revoked.")
    now = timezone.now()
    # A minute's resolution is enough to show "last used", and spares a write on every call.
    if app_key.last_used_at is None or (now - app_key.last_used_at).total_seconds() > 60:
        AppKey.objects.filter(pk=app_key.pk).update(last_used_at=now)
    return app_key


def _check_widget_token(app: App, raw: str, origin: str | None, own_origin: str) -> None:
    """The token is public by design, so what guards it is the browser's Origin header: it must be this
    server (the web chat's own iframe) or one of the sites the app allows."""
    if raw != app.widget_token:
        owner = App.objects.filter(widget_token=raw).only("slug").first()
        if owner is not None:
            raise Forbidden(f"This web chat token belongs to another app; it cannot call '{app.slug}'.")
        raise Unauthenticated("Invalid web chat token; it may have been rotated.")
    if not origin or (origin != own_origin and origin not in app.allowed_origins):
        raise Forbidden(f"The web chat of '{app.slug}' may not be used from origin '{origin or 'none'}'; add it to "
                        f"the app's allowed origins.")


@lru_cache(maxsize=1)
def _counters() -> redis.Redis:
    # One client and connection pool per process. Django's cache would build a fresh pool, and so a fresh
    # connection, for every request served on the event loop.
    return redis.Redis.from_url(settings.REDIS_URL)


def _count_against(counter: str, limit: int) -> None:
    # A fixed one-minute window in Redis: one round trip per call, and every web process agrees.
    now = time.time()
    window = int(now // RATE_WINDOW_S)
    name = f"factory:runtime:rate:{counter}:{window}"
    count, _ = _counters().pipeline(transaction=False).incr(name).expire(name, RATE_WINDOW_S * 2).execute()
    if count > limit:
        retry_after = max(1, int((window + 1) * RATE_WINDOW_S - now + 0.999))
        raise RateLimited(f"Rate limit of {limit} requests per minute reached; retry in {retry_after} s.",
                          retry_after=retry_after)
