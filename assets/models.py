from django.conf import settings
from django.db import models
from django.utils.translation import gettext_lazy as _

from accounts.models import Workspace


class AssetKind(models.TextChoices):
    KNOWLEDGE_BASE = "knowledge_base", _("Knowledge base")
    RAG_CONFIG = "rag_config", _("RAG config")
    APP = "app", _("App")
    AGENT = "agent", _("Agent")
    TOOL = "tool", _("Tool")
    DATASET = "dataset", _("Dataset")
    WORKFLOW = "workflow", _("Workflow")


class Asset(models.Model):
    """A studio artefact in the registry. `ref_id` is the artefact's primary key in its own app: the registry sits
    below the studios, so it names them instead of pointing at them."""

    workspace = models.ForeignKey(Workspace, on_delete=models.CASCADE, related_name="assets")
    kind = models.CharField(max_length=32, choices=AssetKind.choices)
    ref_id = models.CharField(max_length=64)
    name = models.CharField(max_length=200)
    latest_version = models.PositiveIntegerField(default=0)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["kind", "name"]
        constraints = [models.UniqueConstraint(fields=["workspace", "kind", "ref_id"], name="unique_asset_ref")]

    def __str__(self) -> str:
        return f"{self.get_kind_display()} {self.name}"


class AssetVersion(models.Model):
    """One content state of an asset: the sha256 of its canonical JSON payload, and a summary to show."""

    asset = models.ForeignKey(Asset, on_delete=models.CASCADE, related_name="versions")
    number = models.PositiveIntegerField()
    checksum = models.CharField(max_length=64)
    summary = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True,
                                   related_name="+")

    class Meta:
        ordering = ["-number"]
        constraints = [models.UniqueConstraint(fields=["asset", "number"], name="unique_asset_version")]

    def __str__(self) -> str:
        return f"{self.asset.name} v{self.number}"
