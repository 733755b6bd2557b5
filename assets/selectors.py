from django.db.models import Prefetch, QuerySet

from accounts.models import Workspace
from assets.models import Asset, AssetVersion


def assets(*, workspace: Workspace, kind: str | None = None) -> QuerySet[Asset]:
    """The workspace's assets, each with its versions (newest first) prefetched."""
    found = Asset.objects.filter(workspace=workspace).prefetch_related(
        Prefetch("versions", queryset=AssetVersion.objects.select_related("created_by")))
    return found.filter(kind=kind) if kind else found
