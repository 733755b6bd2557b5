"""Normalises parsed text before chunking: Unicode forms, whitespace, PDF running headers and footers, and
paragraphs that repeat. Pages left empty are dropped.

Chinese text: full-width letters, digits and spaces become ASCII (＂ＮＷ－７＂ is "NW-7", an ideographic space a
space), Chinese punctuation stays as written; indentation before Chinese text goes (paragraphs open with two
ideographic spaces), and so do the spaces a PDF puts between every character of a line ("安 全 帽"); a PDF's line
breaks inside a Chinese sentence are joined, so that chunking never cuts a sentence at a wrapped line."""

import re
import unicodedata
from collections import Counter
from dataclasses import replace

from rag_studio.pipeline.chunking import heading_of
from rag_studio.pipeline.parsing import ParsedPage

# NFKC leaves CJK ideographs, kana and Hangul syllables alone, and usefully unifies what PDFs often extract instead
# of them (Kangxi radicals, compatibility ideographs, half-width kana). What it would damage is kept as written: the
# full-width punctuation of Chinese prose, which would become ASCII, and Hangul compatibility jamo. Other full-width
# forms are still normalised, so "ＮＷ－７" becomes "NW-7".
_KEEP_AS_WRITTEN = re.compile(r"[！（），：；？\u3130-\u318f]+")
# Control characters other than tab (newlines are gone by then), and soft hyphens, zero-width spaces and byte order
# marks, which split words invisibly.
_INVISIBLE = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u00ad\u200b\ufeff]")
_SPACES = re.compile(r"[ \t]+")
_CJK = "\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff"
_CJK_TEXT = f"[{_CJK}\u3000-\u303f\uff01-\uff0f\uff1a-\uff20“”‘’]"
# A line of single characters with spaces between them, as some PDFs extract letter-spaced Chinese.
_SPACED_OUT = re.compile(f"[{_CJK}](?: [{_CJK}]){{3,}}")
# A PDF line that a wrap (not the writer) ended: its last character is inside a Chinese sentence, and the next line
# goes on in Chinese. Only lines about as long as the page's longest are wraps; a shorter one ends a title or item.
_OPEN_ENDING = re.compile(f"[{_CJK}，、“‘（《]$")
_CHINESE_START = re.compile(f"[{_CJK}，、。”’）》]")
WRAPPED_LINE_SHARE = 0.8
WRAPPED_LINE_MIN_CHARS = 15

BOILERPLATE_MIN_PAGES = 3
BOILERPLATE_PAGE_SHARE = 0.6
# Running headers and footers sit at the top or bottom of a page; only that many lines at each end are candidates.
BOILERPLATE_EDGE_LINES = 3
DEDUPE_MIN_CHARS = 40


def clean_pages(pages: list[ParsedPage]) -> list[ParsedPage]:
    pages = [replace(page, text=_normalise_text(page.text)) for page in pages]
    if _is_paged(pages) and len(pages) >= BOILERPLATE_MIN_PAGES:
        pages = _without_running_lines(pages)
    if _is_paged(pages):
        pages = [replace(page, text=_join_wrapped_chinese_lines(page.text)) for page in pages]
    pages = _without_repeated_paragraphs(pages)
    return [page for page in pages if page.text]


def _normalise_text(text: str) -> str:
    lines = (_chinese_spacing(_SPACES.sub(" ", _INVISIBLE.sub("", line)).rstrip())
             for line in _nfkc(text).splitlines())
    return _collapse_blank_lines("\n".join(lines))


def _chinese_spacing(line: str) -> str:
    stripped = line.lstrip(" ")
    if stripped and re.match(_CJK_TEXT, stripped):
        line = stripped
    return _SPACED_OUT.sub(lambda run: run[0].replace(" ", ""), line)


def _join_wrapped_chinese_lines(text: str) -> str:
    lines = text.split("\n")
    if not any(_OPEN_ENDING.search(line) for line in lines):
        return text
    wrap_width = max(WRAPPED_LINE_MIN_CHARS, WRAPPED_LINE_SHARE * max(len(line) for line in lines))
    joined = [lines[0]]
    for previous, line in zip(lines, lines[1:]):
        if (len(previous) >= wrap_width and _OPEN_ENDING.search(previous) and _CHINESE_START.match(line)
                and not heading_of(line.strip())):
            joined[-1] += line
        else:
            joined.append(line)
    return "\n".join(joined)


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
