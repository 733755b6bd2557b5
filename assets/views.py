from pathlib import Path

from django.contrib import messages
from django.http import FileResponse
from django.shortcuts import redirect, render
from django.utils.translation import gettext as _
from django.views.decorators.http import require_POST

from accounts.errors import ValidationFailed
from accounts.gui import gui_actor, has_role, workspace_page
from accounts.models import Role
from assets import bundles, selectors, signing
from assets.models import AssetKind


def bundle_download(path: Path, filename: str) -> FileResponse:
    """Send an exported bundle file and remove it: the open handle keeps its data readable until sent."""
    stream = open(path, "rb")
    path.unlink()
    return FileResponse(stream, as_attachment=True, filename=filename, content_type="application/zip")


@workspace_page
def assets_page(request):
    kind = request.GET.get("kind") if request.GET.get("kind") in AssetKind.values else None
    return render(request, "assets/home.html", {
        "assets": selectors.assets(workspace=request.workspace, kind=kind), "kinds": AssetKind.choices,
        "kind": kind, "public_key": signing.instance_public_key(), "fingerprint": signing.instance_fingerprint(),
        "can_import": has_role(request, Role.DEVELOPER)})


@workspace_page
@require_POST
def import_bundle(request):
    upload = request.FILES.get("bundle")
    if upload is None:
        raise ValidationFailed("Choose a bundle file to import.")
    outcome = bundles.import_bundle(actor=gui_actor(request), workspace=request.workspace, file=upload)
    names = ", ".join(f"{asset.get_kind_display()} '{asset.name}'" for asset in outcome.assets)
    messages.success(request, _("Imported %(names)s.") % {"names": names})
    for note in outcome.notes:
        messages.info(request, note)
    return redirect("assets")
