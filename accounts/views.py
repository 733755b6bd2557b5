from django.contrib import messages
from django.contrib.auth import views as auth_views
from django.contrib.auth.decorators import login_required
from django.shortcuts import get_object_or_404, redirect, render
from django.utils.translation import gettext as _
from django.views.decorators.http import require_POST
from django.views.i18n import set_language

from accounts import selectors, services
from accounts.errors import Forbidden, RateLimited, ValidationFailed
from accounts.gui import gui_actor, has_role, workspace_page
from accounts.middleware import LANGUAGE_SESSION_KEY, SESSION_KEY
from accounts.models import ApiKey, KeyScope, Membership, Role


class LoginView(auth_views.LoginView):
    """Django's sign-in page, with failed attempts limited per user name and per address (FACTORY_LOGIN_RATE)."""

    template_name = "accounts/login.html"
    redirect_authenticated_user = True

    def post(self, request, *args, **kwargs):
        try:
            services.check_sign_in_allowed(username=request.POST.get("username", ""),
                                           ip=request.META.get("REMOTE_ADDR"))
        except RateLimited as exc:
            response = self.render_to_response(self.get_context_data(throttled=exc.message), status=429)
            response["Retry-After"] = str(exc.retry_after)
            return response
        return super().post(request, *args, **kwargs)

    def form_invalid(self, form):
        services.record_failed_sign_in(username=self.request.POST.get("username", ""),
                                       ip=self.request.META.get("REMOTE_ADDR"))
        return super().form_invalid(form)


@login_required
@require_POST
def switch_workspace(request):
    workspace = selectors.workspace_of_member(user=request.user, workspace_id=request.POST.get("workspace"))
    if workspace is None:
        messages.error(request, _("That workspace does not exist or you are not a member of it."))
    else:
        request.session[SESSION_KEY] = workspace.pk
    return redirect(request.POST.get("next") or "dashboard")


@require_POST
def choose_language(request):
    """The language switch: Django's set_language (the language cookie, for the sign-in page too, and the redirect
    back), and for a signed-in user the choice kept on their profile and in this session."""
    language = request.POST.get("language", "")
    if request.user.is_authenticated:
        try:
            services.choose_language(user=request.user, language=language)
        except ValidationFailed as exc:
            messages.error(request, exc.message)
            return redirect(request.POST.get("next") or "dashboard")
        request.session[LANGUAGE_SESSION_KEY] = language
    return set_language(request)


ISSUED_KEY_SESSION = "issued_api_key"


@workspace_page
def api_keys(request):
    if request.method == "POST":
        issued = services.create_api_key(actor=gui_actor(request), workspace=request.workspace,
                                         name=request.POST.get("name", ""),
                                         role=request.POST.get("role") or Role.DEVELOPER,
                                         scope=request.POST.get("scope") or KeyScope.WORKSPACE)
        # Redirect so that reloading the page cannot create the key twice; the secret rides in the server-side
        # session for exactly one page view.
        request.session[ISSUED_KEY_SESSION] = {"name": issued.api_key.name, "secret": issued.secret}
        return redirect("api-keys")
    keys = selectors.api_keys_visible_to(user=request.user, workspace=request.workspace,
                                         role=request.workspace_role)
    return render(request, "accounts/api_keys.html", {
        "keys": keys, "issued": request.session.pop(ISSUED_KEY_SESSION, None), "roles": Role.choices,
        "may_make_platform_keys": services.is_platform_admin(gui_actor(request))})


@workspace_page
@require_POST
def revoke_api_key(request, key_id: int):
    api_key = get_object_or_404(ApiKey, pk=key_id, workspace=request.workspace)
    services.revoke_api_key(actor=gui_actor(request), api_key=api_key)
    messages.success(request, _("Key '%(name)s' revoked.") % {"name": api_key.name})
    return redirect("api-keys")


@workspace_page
def settings_page(request):
    if request.method == "POST":
        services.add_member(actor=gui_actor(request), workspace=request.workspace,
                            username=request.POST.get("username", "").strip(),
                            role=request.POST.get("role") or Role.DEVELOPER)
        messages.success(request, _("Member added."))
        return redirect("settings")
    return render(request, "accounts/settings.html", {
        "members": selectors.members_of(workspace=request.workspace),
        "roles": Role.choices,
        "can_manage": has_role(request, Role.ADMIN),
        "audit": selectors.audit_entries(workspace=request.workspace)[:20] if has_role(request, Role.ADMIN) else [],
    })


@workspace_page
@require_POST
def remove_member(request, membership_id: int):
    membership = get_object_or_404(Membership, pk=membership_id, workspace=request.workspace)
    services.remove_member(actor=gui_actor(request), membership=membership)
    messages.success(request, _("%(username)s removed.") % {"username": membership.user.username})
    return redirect("settings")


@login_required
@require_POST
def create_workspace(request):
    try:
        workspace = services.create_workspace(actor=gui_actor(request), name=request.POST.get("name", ""))
    except (Forbidden, ValidationFailed) as exc:
        messages.error(request, exc.message)
        return redirect("dashboard")
    request.session[SESSION_KEY] = workspace.pk
    return redirect("dashboard")
