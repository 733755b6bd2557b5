"""Machine words as words in the page's language: states and stages (ready, indexed, embed…), and the values of
settings that forms list as they are stored (recursive, hybrid, rrf, pii, redact…). The value itself stays in the
option's value, the badge's class, data attributes and the API: only what a person reads changes."""

from django import template
from django.utils.translation import gettext_lazy as _

register = template.Library()

LABELS = {
    # states
    "pending": _("pending"), "queued": _("queued"), "starting": _("starting"), "running": _("running"),
    "processing": _("processing"), "ready": _("ready"), "draining": _("draining"), "stopped": _("stopped"),
    "succeeded": _("succeeded"), "done": _("done"), "failed": _("failed"), "cancelled": _("cancelled"),
    "error": _("error"), "ok": _("ok"), "healthy": _("healthy"), "unhealthy": _("unhealthy"),
    "uploaded": _("uploaded"), "indexed": _("indexed"), "awaiting": _("awaiting"),
    "awaiting_approval": _("awaiting approval"), "generated": _("generated"),
    # what a deployment serves
    "chat": _("chat"), "completion": _("completion"), "embeddings": _("embeddings"),
    # ingestion stages
    "parse": _("parse"), "clean": _("clean"), "screen": _("screen"), "chunk": _("chunk"), "embed": _("embed"),
    "index": _("index"),
    # chunking modes, retrieval modes, fusion and rerank kinds
    "recursive": _("recursive"), "heading": _("by heading"), "parent_child": _("parent-child"),
    "delimiter": _("delimiter"), "dense": _("dense"), "keyword": _("keyword"), "hybrid": _("hybrid"),
    "weighted": _("weighted"), "rrf": _("reciprocal rank (RRF)"), "none": _("none"), "llm": _("LLM"),
    "cross_encoder": _("cross-encoder"),
    # screening categories and actions
    "pii": _("personal data"), "secret": _("secrets"), "injection": _("injected instructions"),
    "allow": _("allow"), "flag": _("flag"), "redact": _("redact"), "reject": _("reject"),
    # learning-rate schedules
    "linear": _("linear"), "cosine": _("cosine"), "constant": _("constant"),
    "constant_with_warmup": _("constant with warm-up"),
}


@register.filter
def label(value) -> str:
    """The translated word for a known machine word; anything else as it is."""
    return LABELS.get(str(value), value)
