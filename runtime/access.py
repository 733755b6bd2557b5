"""Who may call a published app: an app key (server to server) or the app's publishable web-chat token (from a
browser on an allowed origin), each within its rate limit."""

from dataclasses import dataclass
from urllib.parse import urlsplit

from django.conf import settings

from accounts import ratelimits
from accounts.errors import Forbidden, NotFound, RateLimited, Unauthenticated
from accounts.services import secret_matches, secret_prefix, stamp_last_used
from runtime.models import App, AppKey, Release
from runtime.services import APP_KEY_TAG, WIDGET_TOKEN_TAG

__all__ = ["Access", "RateLimited", "authorize", "count_conversation", "own_origin"]


@dataclass(frozen=True)
class Access:
    app: App
    release: Release
    app_key: AppKey | None  # None: the web chat's publishable token

    @property
    def end_user_default(self) -> str:
        return f"key:{self.app_key.prefix}" if self.app_key else "web"


# What a call needs of its app, read with it in the same query.
APP_RELATIONS = ("current_release__config_version", "current_release__agent_version",
                 "current_release__workflow_version", "current_release__published_by", "agent", "workflow",
                 "workspace")


def own_origin() -> str:
    """This platform's own origin, where the web chat's page is served from: from settings (FACTORY_PUBLIC_URL),
    never from a request's Host header, which the caller chooses."""
    parts = urlsplit(settings.PUBLIC_URL)
    return f"{parts.scheme}://{parts.netloc}"


def authorize(*, slug: str, authorization: str, origin: str | None, client: str | None) -> Access:
    """Resolve the app and check the caller's credential, the app's state and the rate limit, in that order. An
    app key is limited per key; the web chat, whose token is public, per client address (at the app's rate), so
    that no one caller can use up the web chat for every visitor."""
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
        _check_widget_token(app, raw, origin)
        limit, counter, what = app.default_rate_limit, ("widget", str(app.pk), client or "unknown"), "this address"
    else:
        if app_key.app_id != app.pk:
            raise Forbidden(f"This key belongs to another app; it cannot call '{slug}'.")
        limit, counter, what = app_key.rate_limit or app.default_rate_limit, ("key", str(app_key.pk)), "this key"
    if not app.enabled:
        raise Forbidden(f"The app '{slug}' is disabled. Enable it on its page in AI Factory to serve again.")
    ratelimits.hit(f"{limit}/minute", "app", *counter, what=what)
    return Access(app=app, release=app.current_release, app_key=app_key)


def count_conversation(access: Access, conversation_id) -> None:
    """The web chat is also limited per conversation (FACTORY_WIDGET_RATE_PER_CONVERSATION)."""
    if access.app_key is None and conversation_id:
        ratelimits.hit(settings.WIDGET_RATE_PER_CONVERSATION, "widget-conversation", str(access.app.pk),
                       str(conversation_id)[:64], what="this conversation")


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
    stamp_last_used(app_key, later=True)  # the answer's first token waits for no database write
    return app_key


def _check_widget_token(app: App, raw: str, origin: str | None) -> None:
    """The token is public by design, so what guards it is the browser's Origin header: it must be this
    platform (the web chat's own page) or one of the sites the app allows. That keeps other sites' pages from
    using it in their visitors' browsers; it does not stop a script outside a browser, which can send any Origin:
    that is what the per-address and per-conversation rate limits are for."""
    if raw != app.widget_token:
        owner = App.objects.filter(widget_token=raw).only("slug").first()
        if owner is not None:
            raise Forbidden(f"This web chat token belongs to another app; it cannot call '{app.slug}'.")
        raise Unauthenticated("Invalid web chat token; it may have been rotated.")
    if not origin or (origin != own_origin() and origin not in app.allowed_origins):
        raise Forbidden(f"The web chat of '{app.slug}' may not be used from origin '{origin or 'none'}'; add it to "
                        f"the app's allowed origins.")
