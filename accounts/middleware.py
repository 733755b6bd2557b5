from asgiref.sync import iscoroutinefunction, markcoroutinefunction, sync_to_async
from django.conf import settings
from django.utils import translation
from django.utils.deprecation import MiddlewareMixin

from accounts.selectors import workspaces_for

SESSION_KEY = "workspace_id"


class CurrentWorkspaceMiddleware:
    """Sets request.workspace for signed-in users: the X-Workspace header (a slug), else the one chosen in the
    switcher, else their first. API-key requests get theirs from the key (see accounts.permissions).

    Async-capable, so that the gateway's async views run on the event loop without a thread hop per request."""

    sync_capable = True
    async_capable = True

    def __init__(self, get_response):
        self.get_response = get_response
        if iscoroutinefunction(get_response):
            markcoroutinefunction(self)

    def __call__(self, request):
        if iscoroutinefunction(self):
            return self._acall(request)
        request.workspace = self._resolve(request, request.user)
        return self.get_response(request)

    async def _acall(self, request):
        user = await request.auser()
        request.workspace = await sync_to_async(self._resolve)(request, user) if user.is_authenticated else None
        return await self.get_response(request)

    @staticmethod
    def _resolve(request, user):
        if user is None or not user.is_authenticated:
            return None
        mine = workspaces_for(user=user)
        slug = request.headers.get("X-Workspace")
        if slug:
            return mine.filter(slug=slug).first()
        chosen = request.session.get(SESSION_KEY)
        return (chosen and mine.filter(pk=chosen).first()) or mine.first()


LANGUAGE_SESSION_KEY = "language"


class UserLanguageMiddleware(MiddlewareMixin):
    """The signed-in user's chosen language (accounts.Profile) over what LocaleMiddleware read from the browser.

    The choice is copied into the session at sign-in and when it changes (accounts.signals, views.choose_language),
    so a request reads no extra row. API-key calls are anonymous here and keep their Accept-Language."""

    def process_request(self, request):
        language = request.session.get(LANGUAGE_SESSION_KEY) if request.user.is_authenticated else None
        if language and language in dict(settings.LANGUAGES):
            translation.activate(language)
            request.LANGUAGE_CODE = translation.get_language()
