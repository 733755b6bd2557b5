from django.conf import settings

from workbridge.egress import Allowlist
from workbridge.models import EgressRule


def allowlist_for(*, workspace_id: int | None) -> Allowlist:
    """What a workspace's user-supplied URLs may reach beyond public addresses: the platform's FACTORY_EGRESS_ALLOW
    and the workspace's own rules. Shared (platform) objects get the platform's only."""
    entries = list(settings.EGRESS_ALLOW)
    if workspace_id is not None:
        entries += EgressRule.objects.filter(workspace_id=workspace_id).values_list("entry", flat=True)
    return Allowlist.of(entries)
