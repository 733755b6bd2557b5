"""Event-log messages (a deployment's history, a job's events, a document's ingestion log): written once, in
English, by a worker that has no reader's language, and shown in the language of whoever reads them later.

Each app declares its messages as LogMessage templates in its own `log_messages.py`, with %(name)s placeholders,
and writes them with the template's values filled in. `LogMessage("...")` is itself the catalogue's marker:
makemessages (accounts/management/commands/makemessages.py) takes its text as a msgid.

A page translates a stored message by finding the template it was made from and filling the template's
translation with the same values (each value translated too, where the catalogue has it: a stage name, a state,
another known message). A message of no known template is shown through the catalogue (a fixed sentence) or as
stored (an exception's text). Rows written before a template existed read in the reader's language as soon as the
template does."""

import html
import re

from django.utils.html import escape, format_html, strip_tags
from django.utils.module_loading import autodiscover_modules
from django.utils.safestring import SafeString, mark_safe
from django.utils.translation import gettext

_PLACEHOLDER = re.compile(r"%\((\w+)\)s")
_TEMPLATES: list["LogMessage"] = []
_discovered = False


class LogMessage:
    """One message of an event log, as its English template (also the catalogue's msgid)."""

    def __init__(self, template: str, *, verbatim: tuple[str, ...] = ()):
        """`verbatim`: the placeholders whose values are never translated (a node's id, a JSON key), even when
        they happen to be a word the catalogue has."""
        self.template, self.verbatim = template, verbatim
        parts = _PLACEHOLDER.split(template)
        self.pattern = re.compile("".join(re.escape(part) if i % 2 == 0 else f"(?P<{part}>.*?)"
                                          for i, part in enumerate(parts)), re.DOTALL)
        _TEMPLATES.append(self)

    def __call__(self, **values) -> str:
        """The message to store: the English template with `values` filled in."""
        return self.template % values


def rendered(stored: str) -> SafeString:
    """A stored event-log message as HTML in the active language, each value it carries (a worker, an address, an
    exception's text) in a `log-value` span: the words around the values are the GUI's, the values are not."""
    global _discovered
    if not _discovered:
        autodiscover_modules("log_messages")
        _discovered = True
    return _rendered(stored or "", as_value=False)


def _rendered(stored: str, *, as_value: bool) -> SafeString:
    for message in _TEMPLATES:
        if match := message.pattern.fullmatch(stored):
            values = {name: _value(value) if name in message.verbatim else _rendered(value, as_value=True)
                      for name, value in match.groupdict().items()}
            return mark_safe(escape(gettext(message.template)) % values)
    translated = gettext(stored) if stored else stored
    if as_value and translated == stored:
        return _value(stored)
    return escape(translated)


def _value(value: str) -> SafeString:
    return format_html('<span class="log-value">{}</span>', value)


def as_text(stored: str) -> str:
    """A stored message as plain text in the active language, for an API's readers (a page's script)."""
    return html.unescape(strip_tags(rendered(stored)))
