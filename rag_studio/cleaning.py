"""Normalises parsed text before chunking: Unicode forms, whitespace, PDF running headers and footers, and
paragraphs that repeat. Pages left empty are dropped."""

import re
import unicodedata
from collections import Counter
from dataclasses import replace

from rag_studio.parsing import ParsedPage

# NFKC leaves CJK ideographs, kana and Hangul syllables alone, and usefully unifies what PDFs often extract instead
# of them (Kangxi radicals, compatibility ideographs, half-width kana). What it would damage is kept as written: the
# full-width punctuation of Chinese prose, which would become ASCII, and Hangul compatibility jamo. Other full-width
# forms are still normalised, so "ＮＷ－７" becomes "NW-7".
_KEEP_AS_WRITTEN = re.compile(r"[！（），：；？\u3130-\u318f]+")
# Control characters other than tab (newlines are gone by then), and soft hyphens, zero-width spaces and byte order
# marks, which split words invisibly.
_INVISIBLE = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u00ad\u200b\ufeff]")
_SPACES = re.compile(r"[ \t]+")

BOILERPLATE_MIN_PAGES = 3
BOILERPLATE_PAGE_SHARE = 0.6
# Running headers and footers sit at the top or bottom of a page; only that many lines at each end are candidates.
BOILERPLATE_EDGE_LINES = 3
DEDUPE_MIN_CHARS = 40


def clean_pages(pages: list[ParsedPage]) -> list[ParsedPage]:
    pages = [replace(page, text=_normalise_text(page.text)) for page in pages]
    if _is_paged(pages) and len(pages) >= BOILERPLATE_MIN_PAGES:
        pages = _without_running_lines(pages)
    pages = _without_repeated_paragraphs(pages)
    return [page for page in pages if page.text]


def _normalise_text(text: str) -> str:
    lines = (_SPACES.sub(" ", _INVISIBLE.sub("", line)).rstrip() for line in _nfkc(text).splitlines())
    return _collapse_blank_lines("\n".join(lines))


def _nfkc(text: str) -> str:
    pieces, position = [], 0
    for run in _KEEP_AS_WRITTEN.finditer(text):
        pieces += [unicodedata.normalize("NFKC", text[position:run.start()]), run[0]]
        position = run.end()
    pieces.append(unicodedata.normalize("NFKC", text[position:]))
    return "".join(pieces)


def _collapse_blank_lines(text: str) -> str:
    return re.sub(r"\n{3,}", "\n\n", text).strip()


def _is_paged(pages: list[ParsedPage]) -> bool:
    return bool(pages) and all(page.page is not None for page in pages)


def _line_signature(line: str) -> str:
    # "Page 3 of 10" and "Page 4 of 10" are the same footer.
    return re.sub(r"\d+", "#", line.strip())


def _edge_indexes(lines: list[str]) -> list[int]:
    filled = [index for index, line in enumerate(lines) if line.strip()]
    return filled[:BOILERPLATE_EDGE_LINES] + filled[-BOILERPLATE_EDGE_LINES:]


def _without_running_lines(pages: list[ParsedPage]) -> list[ParsedPage]:
    """Drops header and footer lines that recur on most pages; the same line in the body of a page stays."""
    page_lines = [page.text.split("\n") for page in pages]
    counts = Counter(signature for lines in page_lines
                     for signature in {_line_signature(lines[index]) for index in _edge_indexes(lines)})
    running = {signature for signature, count in counts.items() if count >= BOILERPLATE_PAGE_SHARE * len(pages)}
    cleaned = []
    for page, lines in zip(pages, page_lines):
        dropped = {index for index in _edge_indexes(lines) if _line_signature(lines[index]) in running}
        kept = [line for index, line in enumerate(lines) if index not in dropped]
        cleaned.append(replace(page, text=_collapse_blank_lines("\n".join(kept))))
    return cleaned


def _without_repeated_paragraphs(pages: list[ParsedPage]) -> list[ParsedPage]:
    seen: set[str] = set()
    cleaned = []
    for page in pages:
        kept = []
        for paragraph in page.text.split("\n\n"):
            key = paragraph.strip()
            if len(key) >= DEDUPE_MIN_CHARS and key in seen:
                continue
            seen.add(key)
            kept.append(paragraph)
        cleaned.append(replace(page, text="\n\n".join(kept)))
    return cleaned
