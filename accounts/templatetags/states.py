"""Machine states and stages (ready, indexed, failed, embed…) as words in the page's language. The value itself
stays in the badge's class for styling, in data attributes and in the API: only what a person reads changes."""

from django import template
from django.utils.translation import gettext_lazy as _

register = template.Library()

STATE_LABELS = {
    "pending": _("pending"), "queued": _("queued"), "starting": _("starting"), "running": _("running"),
    "processing": _("processing"), "ready": _("ready"), "draining": _("draining"), "stopped": _("stopped"),
    "succeeded": _("succeeded"), "done": _("done"), "failed": _("failed"), "cancelled": _("cancelled"),
    "error": _("error"), "ok": _("ok"), "healthy": _("healthy"), "unhealthy": _("unhealthy"),
    "uploaded": _("uploaded"), "indexed": _("indexed"), "awaiting": _("awaiting"),
    "awaiting_approval": _("awaiting approval"), "generated": _("generated"),
    # ingestion stages
    "parse": _("parse"), "clean": _("clean"), "screen": _("screen"), "chunk": _("chunk"), "embed": _("embed"),
    "index": _("index"),
    # screening actions
    "allow": _("allow"), "flag": _("flag"), "redact": _("redact"), "reject": _("reject"),
}


@register.filter
def state_label(value) -> str:
    """The translated word for a known state; anything else as it is."""
    return STATE_LABELS.get(str(value), value)
