"""Split parsed documents into chunks for embedding and retrieval.

Modes (config["mode"]; see validate_chunking for every setting):
- recursive: LangChain's RecursiveCharacterTextSplitter, trying paragraphs, lines, sentences, clauses, words and
  finally characters, with separators for mixed English/Chinese text: a Chinese sentence ends at 。！？； or an
  ellipsis, with any closing quote or bracket after it, so a chunk never begins with the quote that ends the
  sentence before it, and a sentence is only cut when it alone is longer than the chunk.
- heading: one section per heading: Markdown headings (the parsers emit DOCX/HTML headings as Markdown too) and, in
  plain text and PDFs, Chinese ones: 第一章 (level 1), 第一节 (2), 第一条 and 一、 (3), （一） (4), 1.1 (by depth);
  a section longer than chunk_size is split recursively.
- parent_child: large parent chunks that retrieval returns, each split into small children that are embedded.
- delimiter: split exactly on a user-given string; a piece longer than chunk_size is split recursively.

Guarantees: each page is chunked on its own, so no chunk crosses a page boundary; chunks are stripped of surrounding
whitespace, never empty, and `page.text[chunk.start:chunk.end] == chunk.text` exactly.
"""

import re
from collections.abc import Iterator
from dataclasses import dataclass

from langchain_text_splitters import RecursiveCharacterTextSplitter

from rag_studio.pipeline.parsing import ParsedPage

CHUNK_MODES = ("recursive", "heading", "parent_child", "delimiter")
DEFAULT_CHUNKING = {"mode": "recursive", "chunk_size": 800, "chunk_overlap": 100}   # sizes in characters

MIN_CHUNK_SIZE = 50
MAX_CHUNK_SIZE = 8000

# The settings each mode uses besides "mode", with their defaults; validate_chunking returns exactly these.
# The empty delimiter is a placeholder that validation rejects: delimiter mode has no sensible default.
MODE_SETTINGS = {
    "recursive": {"chunk_size": 800, "chunk_overlap": 100},
    "heading": {"chunk_size": 800, "chunk_overlap": 100, "max_heading_level": 6},
    "parent_child": {"parent_size": 2000, "child_size": 400, "child_overlap": 50},
    "delimiter": {"delimiter": "", "chunk_size": 800, "chunk_overlap": 100},
}
KNOWN_SETTINGS = {"mode"}.union(*MODE_SETTINGS.values())

# Coarsest first: paragraphs, lines, Chinese and English sentence ends, clauses, words, then single characters.
# Regular expressions, each kept at the end of the piece before it: a Chinese sentence end takes the closing quotes
# and brackets after it (“好。”), so the next piece starts with the next sentence.
_CLOSERS = "”’」』）》】〕)\"'"
SEPARATORS = ["\n\n", "\n", f"(?<=……)(?![{_CLOSERS}])|(?<=[。！？][{_CLOSERS}])|(?<=[。！？])(?![{_CLOSERS}。！？])",
              r"\. ", "! ", r"\? ", f"(?<=；)(?![{_CLOSERS}])|(?<=；[{_CLOSERS}])", ";", "，", ", ", " ", ""]

# An ATX heading ("## Title", optionally closed by "##"), matched on a line with its indentation stripped.
HEADING_LINE = re.compile(r"(#{1,6})[ \t]+(.+?)(?:[ \t]+#+)?")
# Chinese headings in plain text and PDFs, with their level: 第一章 总则, 第二节 巡检, 第三条 …, 一、目的, （一）范围,
# 2.1 点检. A line like these is a heading only when it is short and does not end a sentence: "（一）进入车间必须
# 佩戴安全帽。" is a list item of the body.
_NUMERAL = "[一二三四五六七八九十百零〇两\\d]+"
CHINESE_HEADINGS = [
    (re.compile(f"第{_NUMERAL}[编篇部章](?:分)?"), 1),
    (re.compile(f"第{_NUMERAL}节"), 2),
    (re.compile(f"第{_NUMERAL}条"), 3),
    (re.compile("[一二三四五六七八九十]+[、．]"), 3),
    (re.compile("[（(][一二三四五六七八九十]+[）)]"), 4),
]
_NUMBERED_HEADING = re.compile(r"(\d+(?:\.\d+)+)\.?(?=[ \t　]|[\u4e00-\u9fff])")
_CJK = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff]")
CHINESE_HEADING_MAX_CHARS = 40
_SENTENCE_END = tuple("。！？；，：:,;.!?")
CODE_FENCES = ("```", "~~~")


@dataclass
class ChunkDraft:
    text: str
    page: int | None
    start: int            # character offset of the chunk in its page's text (so the GUI can show the source location)
    end: int
    heading: str          # heading path like "Security policy > Passwords" when known, else ""
    parent: int | None    # index (into the returned list) of this chunk's parent chunk, parent_child mode only
    searchable: bool      # False for parent chunks: they are stored and returned, but not embedded/indexed


def validate_chunking(config: dict) -> dict:
    """Return the config with defaults filled in and only the settings its mode uses; raise ValueError naming the
    bad setting. Settings of other modes are accepted and dropped (a form may send them all); unknown names are not.

    All sizes are characters and whole numbers:
    - recursive: chunk_size 50..8000 (default 800), chunk_overlap 0..chunk_size-1 (default 100).
    - heading: chunk_size and chunk_overlap as above, for splitting sections longer than chunk_size; max_heading_level
      1..6 (default 6): deeper headings do not start a section and stay inside their section's text.
    - parent_child: parent_size 51..8000 (default 2000), child_size 50..parent_size-1 (default 400), child_overlap
      0..child_size-1 (default 50). Parents do not overlap, so retrieved parents never repeat text.
    - delimiter: "delimiter", a non-empty string, required; chunk_size and chunk_overlap as above: a piece longer than
      chunk_size is still split recursively.
    """
    unknown = set(config) - KNOWN_SETTINGS
    if unknown:
        raise ValueError(f"unknown chunking setting(s): {', '.join(sorted(unknown))}")
    mode = config.get("mode", DEFAULT_CHUNKING["mode"])
    if mode not in CHUNK_MODES:
        raise ValueError(f"mode must be one of {', '.join(CHUNK_MODES)}; got {mode!r}")
    normalised = {"mode": mode} | {name: config.get(name, default) for name, default in MODE_SETTINGS[mode].items()}
    if mode == "parent_child":
        _require_whole_number(normalised, "parent_size", MIN_CHUNK_SIZE + 1, MAX_CHUNK_SIZE)
        _require_whole_number(normalised, "child_size", MIN_CHUNK_SIZE, normalised["parent_size"] - 1)
        _require_whole_number(normalised, "child_overlap", 0, normalised["child_size"] - 1)
        return normalised
    _require_whole_number(normalised, "chunk_size", MIN_CHUNK_SIZE, MAX_CHUNK_SIZE)
    _require_whole_number(normalised, "chunk_overlap", 0, normalised["chunk_size"] - 1)
    if mode == "heading":
        _require_whole_number(normalised, "max_heading_level", 1, 6)
    if mode == "delimiter" and not (isinstance(normalised["delimiter"], str) and normalised["delimiter"]):
        raise ValueError(f"delimiter must be a non-empty string in delimiter mode; got {normalised['delimiter']!r}")
    return normalised


def _require_whole_number(config: dict, name: str, low: int, high: int) -> None:
    value = config[name]
    # bool is an int subclass; True is no chunk size.
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ValueError(f"{name} must be a whole number from {low} to {high}; got {value!r}")


def chunk_pages(pages: list[ParsedPage], config: dict) -> list[ChunkDraft]:
    """Chunk each page on its own, in page order; config is validated first (see validate_chunking)."""
    config = validate_chunking(config)
    if config["mode"] == "parent_child":
        return _parent_child_chunks(pages, config)
    find_spans = {"recursive": _recursive_mode_spans, "heading": _heading_mode_spans,
                  "delimiter": _delimiter_mode_spans}[config["mode"]]
    return [_chunk(page, start, end, heading=heading)
            for page in pages for start, end, heading in find_spans(page.text, config)]


def _chunk(page: ParsedPage, start: int, end: int, heading: str = "", parent: int | None = None,
           searchable: bool = True) -> ChunkDraft:
    return ChunkDraft(text=page.text[start:end], page=page.page, start=start, end=end, heading=heading, parent=parent,
                      searchable=searchable)


def _recursive_spans(text: str, start: int, end: int, size: int, overlap: int) -> list[tuple[int, int]]:
    """(start, end) offsets in text of the recursive chunks of text[start:end].

    keep_separator="end" keeps each sentence end with its sentence and, because nothing is re-inserted between
    pieces, makes every chunk a stripped substring of the input, which add_start_index then locates.
    """
    splitter = RecursiveCharacterTextSplitter(separators=SEPARATORS, is_separator_regex=True, keep_separator="end",
                                              chunk_size=size, chunk_overlap=overlap, add_start_index=True)
    spans = []
    for document in splitter.create_documents([text[start:end]]):
        chunk_start = start + document.metadata["start_index"]
        spans.append((chunk_start, chunk_start + len(document.page_content)))
    return spans


def _recursive_mode_spans(text: str, config: dict) -> Iterator[tuple[int, int, str]]:
    for start, end in _recursive_spans(text, 0, len(text), config["chunk_size"], config["chunk_overlap"]):
        yield start, end, ""


def _heading_mode_spans(text: str, config: dict) -> Iterator[tuple[int, int, str]]:
    for section_start, section_end, heading in _heading_sections(text, config["max_heading_level"]):
        for start, end in _recursive_spans(text, section_start, section_end, config["chunk_size"],
                                           config["chunk_overlap"]):
            yield start, end, heading


def _heading_sections(text: str, max_level: int) -> list[tuple[int, int, str]]:
    """(start, end, heading path) of each section: a heading line up to the next heading of level <= max_level.

    Written here rather than with MarkdownHeaderTextSplitter because that one rewrites whitespace, so its chunks
    could not be mapped back to the page. A heading with no body of its own (a title right above a subsection)
    stays attached to the next section, so no chunk is a bare title. "#" lines inside code fences are code.
    """
    sections = []
    open_headings: list[tuple[int, str]] = []   # (level, title) from the outermost heading down
    section_start, section_heading, section_has_body = 0, "", False
    in_code_block = False
    line_start = 0
    for line in text.splitlines(keepends=True):
        stripped = line.strip()
        if stripped.startswith(CODE_FENCES):
            in_code_block = not in_code_block
        heading = None if in_code_block else heading_of(stripped)
        if heading and heading[0] <= max_level:
            if section_has_body:
                sections.append((section_start, line_start, section_heading))
                section_start, section_has_body = line_start, False
            level, title = heading
            open_headings = [(open_level, title) for open_level, title in open_headings if open_level < level]
            open_headings.append((level, title))
            section_heading = " > ".join(title for _, title in open_headings)
        elif stripped:
            section_has_body = True
        line_start += len(line)
    sections.append((section_start, len(text), section_heading))
    return sections


def heading_of(line: str) -> tuple[int, str] | None:
    """(level, title) when the stripped line is a Markdown heading or a Chinese one (CHINESE_HEADINGS)."""
    markdown = HEADING_LINE.fullmatch(line)
    if markdown:
        return len(markdown.group(1)), markdown.group(2)
    if len(line) > CHINESE_HEADING_MAX_CHARS or line.endswith(_SENTENCE_END) or not _CJK.search(line):
        return None
    for pattern, level in CHINESE_HEADINGS:
        if pattern.match(line):
            return level, line
    numbered = _NUMBERED_HEADING.match(line)
    if numbered:
        return numbered.group(1).count(".") + 1, line
    return None


def _delimiter_mode_spans(text: str, config: dict) -> Iterator[tuple[int, int, str]]:
    delimiter = config["delimiter"]
    piece_start = 0
    for piece in text.split(delimiter):
        # Pieces within chunk_size come back whole (stripped, or nothing if blank); longer ones are split.
        for start, end in _recursive_spans(text, piece_start, piece_start + len(piece), config["chunk_size"],
                                           config["chunk_overlap"]):
            yield start, end, ""
        piece_start += len(piece) + len(delimiter)


def _parent_child_chunks(pages: list[ParsedPage], config: dict) -> list[ChunkDraft]:
    """Each parent is followed by its children in the returned list."""
    chunks: list[ChunkDraft] = []
    for page in pages:
        for parent_start, parent_end in _recursive_spans(page.text, 0, len(page.text), config["parent_size"], 0):
            parent_index = len(chunks)
            chunks.append(_chunk(page, parent_start, parent_end, searchable=False))
            chunks.extend(_chunk(page, start, end, parent=parent_index)
                          for start, end in _recursive_spans(page.text, parent_start, parent_end,
                                                             config["child_size"], config["child_overlap"]))
    return chunks
