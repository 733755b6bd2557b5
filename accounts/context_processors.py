from accounts.selectors import workspaces_for
from accounts.services import may_create_workspaces


def workspaces(request):
    user = getattr(request, "user", None)
    if user is None or not user.is_authenticated:
        return {}
    return {"my_workspaces": workspaces_for(user=user), "current_workspace": getattr(request, "workspace", None),
            "may_create_workspaces": may_create_workspaces(user)}
