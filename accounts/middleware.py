from asgiref.sync import iscoroutinefunction, markcoroutinefunction, sync_to_async

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
