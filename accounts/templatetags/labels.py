"""Machine words as words in the page's language: states and stages (ready, indexed, embed…), the values of
settings that forms list as they are stored (recursive, hybrid, rrf, pii, redact…) and what screening finds (email,
cn_id, ignore_instructions…). The value itself stays in the
option's value, the badge's class, data attributes and the API: only what a person reads changes."""

from django import template
from django.utils.translation import gettext_lazy as _, pgettext_lazy

from accounts.log_messages import rendered

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
    "parse": _("parse"), "ocr": _("OCR"), "clean": _("clean"), "screen": _("screen"), "chunk": _("chunk"),
    "embed": _("embed"), "index": _("index"),
    # retrieval's timings (hit testing)
    "hydrate": _("reading chunks"), "fuse": _("fusion"), "rerank": _("rerank"), "total": _("total"),
    # chunking modes, retrieval modes, fusion and rerank kinds
    "recursive": _("recursive"), "heading": _("by heading"), "parent_child": _("parent-child"),
    "delimiter": _("delimiter"), "dense": _("dense"), "keyword": _("keyword"), "hybrid": _("hybrid"),
    "weighted": _("weighted"), "rrf": _("reciprocal rank (RRF)"), "none": _("none"), "llm": _("LLM"),
    "zscore_candidates": _("z-score among the candidates"), "zscore": _("z-score"),
    "max": _("relative to the best hit"),
    "cross_encoder": _("cross-encoder"),
    # screening categories and actions
    "pii": _("personal data"), "secret": _("secrets"), "injection": _("injected instructions"),
    "allow": _("allow"), "flag": _("flag"), "redact": _("redact"), "reject": _("reject"),
    # what screening finds (rag_studio/pipeline/screening.py's detectors)
    "email": _("email address"), "phone": _("phone number"), "cn_mobile": _("mobile number (China)"),
    "cn_landline": _("landline number (China)"), "cn_service_number": _("400 service number"),
    "cn_id": _("resident ID number (China)"), "card": _("bank card number"), "iban": _("IBAN"),
    "ssn": _("social security number (US)"), "password": _("password"), "config_secret": _("secret in a config"),
    "connection_string": _("connection string with a password"), "private_key": _("private key"),
    "jwt": _("JWT"), "aws_access_key": _("AWS access key"), "aws_secret_key": _("AWS secret key"),
    "github_token": _("GitHub token"), "stripe_key": _("Stripe key"), "slack_token": _("Slack token"),
    "google_api_key": _("Google API key"), "openai_key": _("OpenAI key"),
    "ignore_instructions": _("asks to ignore instructions"), "role_override": _("tries to change the model's role"),
    "role_markup": _("fake role markup"), "prompt_leak": _("asks for the system prompt"),
    "hide_from_user": _("asks to hide something from the user"),
    # learning-rate schedules
    "linear": _("linear"), "cosine": _("cosine"), "constant": _("constant"),
    "constant_with_warmup": _("constant with warm-up"),
    # what an asset version's summary and a compression job's settings name
    "embedding_model": _("embedding model"), "documents": _("documents"), "config_version": _("config version"),
    "knowledge_base": _("knowledge base"), "template": _("template"), "model": _("model"), "version": _("version"),
    "binding": _("binding"), "method": _("method"), "release": _("release"), "rag_config_version": _("config version"),
    "agent_version": _("agent version"), "samples": _("samples"), "format": _("format"), "file": _("file"),
    "sparsity": _("sparsity"), "recovery_steps": _("recovery steps"), "mode": _("mode"), "teacher": _("teacher"),
    "deployment": _("deployment"), "temperature": _("temperature"), "alpha": _("alpha"),
    "max_prompts": _("prompts"), "magnitude": _("magnitude"), "mlp_channels": _("MLP channels"),
    "sequence": _("sequence-level"), "logits": _("logits"),
    # agent, RAG and tool templates and bindings as summaries store them
    "tool_calling": _("tool calling"), "plan_execute": _("plan and execute"), "team": _("team"),
    "basic": _("basic QA"), "citations": _("QA with citations"), "conversational": _("conversational"),
    "multi_query": _("multi-query"), "python": _("Python function"), "openapi": _("OpenAPI operation"),
    "mcp": _("MCP server tool"),
    # model groups: policies, members and how calibration scores an answer (serving/groups/scoring.py)
    "route": _("route"), "cascade": _("cascade"), "speculative": _("speculative"), "big": _("big"),
    "small": _("small"), "token_f1": _("token F1 against the big model's answer"),
    "exact_match": _("exact match with the big model's answer"), "judge": _("judge"),
    # the pool's priority classes (cluster/scheduling/)
    "low": pgettext_lazy("priority class", "low"), "normal": pgettext_lazy("priority class", "normal"),
    "high": pgettext_lazy("priority class", "high"), "urgent": pgettext_lazy("priority class", "urgent"),
    # JSON Schema types of tool arguments and agent variables
    "string": _("text"), "number": _("number"), "integer": _("whole number"), "boolean": _("yes/no"),
    "json": _("JSON"), "array": _("list"), "object": _("object"),
}


@register.filter
def log_message(value) -> str:
    """A stored event-log message in the reader's language, as HTML (accounts/log_messages.py)."""
    return rendered(value)


@register.filter
def label(value) -> str:
    """The translated word for a known machine word; anything else as it is."""
    return LABELS.get(str(value), value)
