"""What an evaluation scenario expects, in words for the evaluation page and its report: its answer checks (one
phrase per kind of agent_studio.services.SCENARIO_CHECK_KINDS), the tool calls and the memory writes it expects."""

import json

from django import template
from django.utils.translation import gettext_lazy as _

register = template.Library()

CHECKS = {
    "contains": _("contains “%(value)s”"),
    "not_contains": _("does not contain “%(value)s”"),
    "regex": _("matches the regex %(value)s"),
    "json_field": _("has the JSON field %(path)s equal to %(value)s"),
    "judge": _("meets, as a judge model reads it: %(value)s"),
}


def _text(value) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


@register.filter
def describe_check(check: dict) -> str:
    """An answer check as a phrase ("contains “4”"). A kind without a phrase shows as stored rather than failing
    the page: the scenarios were valid when they were saved, whatever kinds exist now."""
    phrase = CHECKS.get(check.get("kind"))
    if phrase is None:
        return _text(check)
    return phrase % {"value": _text(check.get("value", "")), "path": _text(check.get("path", ""))}


@register.filter
def describe_call(expected: dict) -> str:
    """An expected tool call: its name, with the arguments it must be given (among those it is sent)."""
    arguments = ", ".join(f"{name}={json.dumps(value, ensure_ascii=False)}"
                          for name, value in (expected.get("arguments") or {}).items())
    return f"{expected['name']}({arguments})"


@register.filter
def describe_memory(expected: dict) -> str:
    """An expected memory write: the variable, and the value it must get where the scenario names one."""
    return f"{expected['name']} = {_text(expected['value'])}" if "value" in expected else expected["name"]
