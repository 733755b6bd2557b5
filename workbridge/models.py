from django.conf import settings
from django.db import models

from accounts.models import Workspace


class EgressRule(models.Model):
    """A host (`api.corp.example`, `*.corp.example`) or network (`10.1.0.0/16`) the workspace's user-supplied URLs
    may reach though it is not public: an intranet API, say. Set by the workspace's admins."""

    workspace = models.ForeignKey(Workspace, on_delete=models.CASCADE, related_name="egress_rules")
    entry = models.CharField(max_length=255)
    note = models.CharField(max_length=200, blank=True)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["entry"]
        constraints = [models.UniqueConstraint(fields=["workspace", "entry"], name="unique_egress_rule")]

    def __str__(self) -> str:
        return self.entry
