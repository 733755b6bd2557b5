from accounts.selectors import workspaces_for

SESSION_KEY = "workspace_id"


class CurrentWorkspaceMiddleware:
    """Sets request.workspace for signed-in users: the X-Workspace header (a slug), else the one chosen in the
    switcher, else their first. API-key requests get theirs from the key (see accounts.permissions)."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        request.workspace = self._resolve(request)
        return self.get_response(request)

    @staticmethod
    def _resolve(request):
        user = getattr(request, "user", None)
        if user is None or not user.is_authenticated:
            return None
        mine = workspaces_for(user=user)
        slug = request.headers.get("X-Workspace")
        if slug:
            return mine.filter(slug=slug).first()
        chosen = request.session.get(SESSION_KEY)
        return (chosen and mine.filter(pk=chosen).first()) or mine.first()
