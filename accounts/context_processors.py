from accounts.selectors import workspaces_for


def workspaces(request):
    user = getattr(request, "user", None)
    if user is None or not user.is_authenticated:
        return {}
    return {"my_workspaces": workspaces_for(user=user), "current_workspace": getattr(request, "workspace", None)}
