"""The asset registry: every studio artefact is recorded with a version per distinct content, identified by the
sha256 of its canonical JSON. The studios call these from their own services, after their own role checks."""

import hashlib
import json

from django.db import transaction

from accounts.models import Workspace
from accounts.services import Actor
from assets.models import Asset, AssetKind, AssetVersion


def payload_checksum(payload: dict) -> str:
    """sha256 of the payload's canonical JSON (sorted keys, UTF-8): equal content always gives an equal sum."""
    return hashlib.sha256(json.dumps(payload, sort_keys=True, ensure_ascii=False).encode()).hexdigest()


def register_asset(*, workspace: Workspace, kind: str, ref_id, name: str, payload: dict,
                   summary: dict | None = None, actor: Actor | None = None) -> AssetVersion:
    """Record an artefact's current content. A new version is written only when the checksum changed; registering
    the same content again returns the latest version (and keeps the asset's name current)."""
    if kind not in AssetKind.values:
        raise ValueError(f"Unknown asset kind {kind!r}.")
    checksum = payload_checksum(payload)
    with transaction.atomic():
        asset, _ = Asset.objects.select_for_update().get_or_create(
            workspace=workspace, kind=kind, ref_id=str(ref_id), defaults={"name": name})
        latest = asset.versions.first()
        if latest is not None and latest.checksum == checksum:
            if asset.name != name:
                asset.name = name
                asset.save(update_fields=["name", "updated_at"])
            return latest
        asset.name, asset.latest_version = name, asset.latest_version + 1
        asset.save()
        return AssetVersion.objects.create(asset=asset, number=asset.latest_version, checksum=checksum,
                                           summary=summary or {}, created_by=actor.user if actor else None)


def forget_asset(*, workspace: Workspace, kind: str, ref_id) -> None:
    """Drop an artefact's registry entry and its history, when the artefact itself is deleted."""
    Asset.objects.filter(workspace=workspace, kind=kind, ref_id=str(ref_id)).delete()
