"""Every user-visible string of every template is translatable: text between tags and the attributes people read
(placeholder, title, aria-label, alt, a button's value) must come from {% translate %} or {% blocktranslate %}, or
be a name, code, a number or punctuation (tests/i18n/english.py)."""

from html.parser import HTMLParser
from pathlib import Path

import pytest
from django.template.base import Lexer, TokenType

from tests.i18n.english import PLACEHOLDER, english_words

TEMPLATES = Path(__file__).resolve().parents[2] / "templates"
# Files that are not HTML pages: the embed script is JavaScript served as a template.
NOT_HTML = {"runtime/embed.js"}
VISIBLE_ATTRIBUTES = {"placeholder", "title", "aria-label", "alt"}
# Text inside these is code or data, not prose.
CODE_ELEMENTS = {"script", "style", "code", "pre", "textarea"}


def template_with_tags_replaced(source: str) -> str:
    """The template's text with every variable and translated string as a placeholder, translated blocks and
    comments gone, and other tags removed: what is left as literal text is what nobody translates."""
    pieces, skipping = [], None
    for token in Lexer(source).tokenize():
        content = token.contents.split()
        name = content[0] if content else ""
        if skipping:
            if token.token_type == TokenType.BLOCK and name == skipping:
                skipping = None
            continue
        if token.token_type == TokenType.TEXT:
            pieces.append(token.contents)
        elif token.token_type == TokenType.VAR:
            pieces.append(PLACEHOLDER)
        elif token.token_type == TokenType.BLOCK:
            if name in ("blocktranslate", "blocktrans"):
                pieces.append(PLACEHOLDER)
                skipping = "endblocktranslate" if name == "blocktranslate" else "endblocktrans"
            elif name == "comment":
                skipping = "endcomment"
            elif name in ("translate", "trans"):
                pieces.append(PLACEHOLDER)
    return "".join(pieces)


class VisibleText(HTMLParser):
    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.texts: list[str] = []
        self._code_depth = 0

    def handle_starttag(self, tag, attrs):
        if tag in CODE_ELEMENTS:
            self._code_depth += 1
        attributes = dict(attrs)
        for name, value in attrs:
            if value and (name in VISIBLE_ATTRIBUTES or (name == "label" and tag in ("optgroup", "option"))
                          or (name == "value" and tag == "input" and attributes.get("type") in ("submit", "button"))):
                self.texts.append(value)

    def handle_endtag(self, tag):
        if tag in CODE_ELEMENTS and self._code_depth:
            self._code_depth -= 1

    def handle_data(self, data):
        if not self._code_depth and data.strip():
            self.texts.append(data.strip())


def untranslated(path: Path) -> list[str]:
    parser = VisibleText()
    parser.feed(template_with_tags_replaced(path.read_text()))
    parser.close()
    return [text for text in parser.texts if english_words(text)]


def template_paths() -> list[Path]:
    return sorted(path for path in TEMPLATES.rglob("*") if path.is_file()
                  and str(path.relative_to(TEMPLATES)) not in NOT_HTML)


@pytest.mark.parametrize("path", template_paths(), ids=lambda path: str(path.relative_to(TEMPLATES)))
def test_template_has_no_untranslated_text(path):
    assert untranslated(path) == []


def test_the_check_finds_untranslated_text_and_passes_translated_text(tmp_path):
    page = tmp_path / "page.html"
    page.write_text('{% load i18n %}<h1>{% translate "Knowledge bases" %}</h1><p>{{ kb.name }} · 42 ms</p>'
                    '<input placeholder="e.g. handbook"><button>{% blocktranslate %}Delete {{ name }}'
                    '{% endblocktranslate %}</button><code>max_tokens</code><td>TTFT p50</td><p>Sign in</p>'
                    '{# a comment #}{% comment %}Nothing shown{% endcomment %}')
    assert untranslated(page) == ["e.g. handbook", "Sign in"]
