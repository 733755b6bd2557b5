"""Turns an uploaded file into text for ingestion: one ParsedPage per PDF page, per image frame (a TIFF's pages), per
XLSX sheet, and one otherwise.

Structure that a chunker can use survives as Markdown: DOCX and HTML headings become "#" lines, table rows become
" | "-joined cells, and CSV/XLSX rows become "column: value; ..." lines that make sense on their own.

Pages OCR has to read (`needs_ocr`: a PDF page without a usable text layer, every image frame) are only marked
here, after the knowledge base's OCR mode; the OCR stage reads them (rag_studio/pipeline/ocr/).
"""

import csv
import io
import re
import unicodedata
import warnings
import zipfile
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from datetime import date, datetime, time
from pathlib import Path

import docx
import openpyxl
from bs4 import BeautifulSoup, Tag
from bs4.element import PreformattedString
from charset_normalizer import from_bytes
from django.conf import settings
from docx.table import Table
from docx.text.paragraph import Paragraph
from openpyxl.worksheet._reader import WorkSheetParser
from PIL import Image
from pypdf import PasswordType, PdfReader

from rag_studio.pipeline.ocr import OCR_MODES


@dataclass(frozen=True)
class ParsedPage:
    text: str
    page: int | None  # 1-based page number for PDF and image frames; None for formats without pages
    needs_ocr: bool = False  # its text is to come from OCR: a scanned page, or a text layer of garbage


class ParseError(Exception):
    """A file that cannot be ingested. `code` is machine-readable; str(exc) and `.reason` are sentences a user can
    read. Codes: unsupported_type, empty_file, encrypted_pdf, corrupt_file, wrong_encoding, no_text,
    archive_bomb, ocr_off, too_many_pages, image_too_large, ocr_timeout."""

    def __init__(self, code: str, reason: str):
        super().__init__(reason)
        self.code = code
        self.reason = reason


KIND_BY_EXTENSION = {
    ".pdf": "pdf",
    ".docx": "docx",
    ".html": "html",
    ".htm": "html",
    ".md": "markdown",
    ".markdown": "markdown",
    ".txt": "text",
    ".csv": "csv",
    ".xlsx": "xlsx",
    ".png": "image",
    ".jpg": "image",
    ".jpeg": "image",
    ".tif": "image",
    ".tiff": "image",
    ".webp": "image",
    ".bmp": "image",
}
SUPPORTED_EXTENSIONS = set(KIND_BY_EXTENSION)
SUPPORTED_TYPES_SENTENCE = "upload PDF, DOCX, HTML, Markdown, TXT, CSV, XLSX or an image (PNG, JPEG, TIFF, WebP, BMP)"
# The formats Pillow may open an image as, whatever its name says: its other readers include EPS, which runs
# Ghostscript.
IMAGE_FORMATS = ("PNG", "JPEG", "TIFF", "WEBP", "BMP")
OCR_KINDS = ("pdf", "image")
# A PDF text layer shorter than this (in letters and digits) is read by OCR instead: a scan whose only text is a
# stamped page number, say. Nothing is lost when the page really holds so little: OCR reads it as well.
MIN_TEXT_LAYER_CHARS = 20
# A text layer is garbage (fonts without a Unicode map extract as private-use or control characters) when more
# than this share of it is such characters, or less than MIN_LETTER_SHARE is letters and digits.
MAX_BROKEN_SHARE = 0.1
MIN_LETTER_SHARE = 0.5

# A guess from charset-normalizer is only taken when at most this share of the decoded text looks like mojibake.
MAX_ENCODING_CHAOS = 0.1
# Control characters that never occur in text; a stray form feed or DOS end-of-file mark is tolerated.
_BINARY_CONTROLS = re.compile(r"[\x00-\x08\x0e-\x19\x1b-\x1f\x7f]")
_BOMS = ((b"\xef\xbb\xbf", "utf-8-sig"), (b"\xff\xfe", "utf-16"), (b"\xfe\xff", "utf-16"))
# DOCX and XLSX are zip archives: a few KB can declare gigabytes of XML. Their readers load it whole, so the
# archive is checked first. Real documents stay far below these; bombs are compressed a thousand times or more.
MAX_ARCHIVE_MEMBERS = 10_000
MAX_COMPRESSION_RATIO = 200
RATIO_CHECKED_ABOVE_BYTES = 1 << 20  # small members (styles, a short sheet) may compress as well as they like
ARCHIVE_KINDS = ("docx", "xlsx")

_BOILERPLATE_HTML_TAGS = ["head", "script", "style", "noscript", "template", "nav", "header", "footer"]
_HEADING_HTML_TAGS = ["h1", "h2", "h3", "h4", "h5", "h6"]
_PARAGRAPH_HTML_TAGS = ["p", "div", "section", "article", "main", "aside", "blockquote", "pre", "dl", "figure",
                        "figcaption", "address", "form", "fieldset", "hr"]
_LINE_HTML_TAGS = ["ul", "ol", "dt", "dd"]
# Placeholders for line breaks, paragraph breaks and list-item starts while markup is turned into text.
_LINE, _PARAGRAPH, _ITEM = "\x1e", "\x1d", "\x1f"
_MARKS = _LINE + _PARAGRAPH + _ITEM


def file_kind(filename: str) -> str:
    extension = Path(filename).suffix.lower()
    if extension not in KIND_BY_EXTENSION:
        shown = f"{extension} files" if extension else "Files without an extension"
        raise ParseError("unsupported_type", f"{shown} are not supported; {SUPPORTED_TYPES_SENTENCE}.")
    return KIND_BY_EXTENSION[extension]


def parse_document(path: Path, filename: str, *, ocr_mode: str = "auto") -> list[ParsedPage]:
    """The file's pages; with `ocr_mode` (a knowledge base's OCR mode: auto, always or never), those OCR is to read
    are marked `needs_ocr`."""
    kind = file_kind(filename)
    if path.stat().st_size == 0:
        raise ParseError("empty_file", "The file is empty (0 bytes).")
    if kind in ARCHIVE_KINDS:
        check_archive(path, kind)
    pages = _marked_for_ocr(PARSERS[kind](path), kind, ocr_mode)
    if not any(page.text.strip() or page.needs_ocr for page in pages):
        if kind == "pdf":
            raise ParseError("no_text", "The PDF has no text layer (it is a scan), and OCR is off for this "
                                        "knowledge base; turn OCR on in its settings, then retry the document.")
        raise ParseError("no_text", "The file contains no text to ingest.")
    return pages


def _marked_for_ocr(pages: list[ParsedPage], kind: str, mode: str) -> list[ParsedPage]:
    """Which pages OCR reads: in auto mode those the parser marked (every image frame, PDF pages without a usable
    text layer), in always mode every page of a PDF or image, in never mode none."""
    if mode not in OCR_MODES:
        raise ValueError(f"Unknown OCR mode {mode!r}")
    if kind not in OCR_KINDS:
        return pages
    if mode == "never":
        if kind == "image":
            raise ParseError("ocr_off", "Images are read by OCR, which is off for this knowledge base; turn OCR "
                                        "on in its settings, then retry the document.")
        return [replace(page, needs_ocr=False) for page in pages]
    if mode == "always":
        pages = [replace(page, needs_ocr=True) for page in pages]
    scanned, limit = sum(page.needs_ocr for page in pages), settings.RAG_OCR_MAX_PAGES
    if scanned > limit:
        raise ParseError("too_many_pages", f"{scanned:,} pages of the {'PDF' if kind == 'pdf' else 'image'} "
                                           f"need OCR; OCR reads at most {limit:,} pages of a document "
                                           f"(FACTORY_RAG_OCR_MAX_PAGES). Split it and upload the parts.")
    return pages


@contextmanager
def _reading(reason: str) -> Iterator[None]:
    """Turns whatever a reader library raises on a damaged file into a corrupt_file error with `reason`."""
    try:
        yield
    except ParseError:
        raise
    except Exception as exc:  # the readers raise many kinds of errors on truncated or mislabelled files
        raise ParseError("corrupt_file", reason) from exc


def check_archive(path: Path, kind: str) -> None:
    """Refuse a DOCX/XLSX whose zip would unpack to more than the reader should hold: too many members, too many
    bytes in all, or a member inflating far more than documents do. The sizes are the archive's own declarations,
    which zipfile enforces when it inflates (it stops at the declared size), so they are upper bounds."""
    try:
        with zipfile.ZipFile(path) as archive:
            members = archive.infolist()
    except (zipfile.BadZipFile, OSError, ValueError):
        return  # not a zip at all: its reader says so in its own words
    if len(members) > MAX_ARCHIVE_MEMBERS:
        raise ParseError("archive_bomb", f"The {kind.upper()} holds {len(members)} files; documents hold far "
                                         f"fewer (the limit is {MAX_ARCHIVE_MEMBERS}).")
    total = sum(member.file_size for member in members)
    limit = settings.RAG_MAX_UNPACKED_BYTES
    if total > limit:
        raise ParseError("archive_bomb", f"The {kind.upper()} would unpack to {_size(total)}; the limit is "
                                         f"{_size(limit)} (FACTORY_RAG_MAX_UNPACKED_BYTES).")
    for member in members:
        ratio = member.file_size / max(1, member.compress_size)
        if member.file_size > RATIO_CHECKED_ABOVE_BYTES and ratio > MAX_COMPRESSION_RATIO:
            raise ParseError("archive_bomb", f"{member.filename} inside the {kind.upper()} inflates {ratio:,.0f} "
                                             f"times (to {_size(member.file_size)}); documents compress at most "
                                             f"about {MAX_COMPRESSION_RATIO} times.")


def _size(count: int) -> str:
    return f"{count / 2**20:,.1f} MiB" if count >= 2**20 else f"{count / 2**10:,.0f} KiB"


# --- PDF ---

def _parse_pdf(path: Path) -> list[ParsedPage]:
    with path.open("rb") as handle:
        # The specification allows some bytes before the header; anything else is not a PDF.
        if b"%PDF-" not in handle.read(1024):
            raise ParseError("corrupt_file", "The file is named .pdf but is not a PDF document.")
    with _reading("The PDF is damaged or truncated and cannot be read; export or download it again."):
        reader = PdfReader(path)
        # PDFs with only an owner password (e.g. "no printing") open in every viewer, so they are read too.
        if reader.is_encrypted and reader.decrypt("") == PasswordType.NOT_DECRYPTED:
            raise ParseError("encrypted_pdf",
                             "The PDF is password-protected; remove the password and upload it again.")
        texts = [page.extract_text() for page in reader.pages]
    return [ParsedPage(text, number, needs_ocr=not usable_text_layer(text))
            for number, text in enumerate(texts, start=1)]


def usable_text_layer(text: str) -> bool:
    """Whether a PDF page's extracted text is worth keeping rather than reading the page by OCR."""
    characters = [character for character in text if not character.isspace()]
    letters = sum(unicodedata.category(character)[0] in "LN" for character in characters)
    if letters < MIN_TEXT_LAYER_CHARS:
        return False
    broken = sum(unicodedata.category(character) in ("Co", "Cn", "Cc", "Cs") or character == "\ufffd"
                 for character in characters)
    return broken <= MAX_BROKEN_SHARE * len(characters) and letters >= MIN_LETTER_SHARE * len(characters)


# --- Images ---

def open_image(path: Path) -> Image.Image:
    """The image, its header read (frames are decoded when used), in one of IMAGE_FORMATS. Pillow's own guard
    against decompression bombs (twice its default of about 89 megapixels) stays in place; RAG_OCR_MAX_PIXELS is
    checked on each frame's size (`check_image`)."""
    Image.init()  # registers every reader (Pillow loads only the commonest by itself); `formats` picks among them
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", Image.DecompressionBombWarning)  # the limit that counts is ours
        try:
            return Image.open(path, formats=IMAGE_FORMATS)
        except Image.DecompressionBombError:
            raise ParseError("image_too_large", f"The image has over {_megapixels(2 * Image.MAX_IMAGE_PIXELS)}; "
                                                f"the limit is {_megapixels(settings.RAG_OCR_MAX_PIXELS)} "
                                                f"(FACTORY_RAG_OCR_MAX_PIXELS).")


def check_image(image: Image.Image, page: int, pages: int) -> None:
    width, height = image.size
    if width * height > settings.RAG_OCR_MAX_PIXELS:
        where = f"Page {page} of the image is" if pages > 1 else "The image is"
        raise ParseError("image_too_large", f"{where} {width:,} × {height:,} pixels "
                                            f"({_megapixels(width * height)}); the limit is "
                                            f"{_megapixels(settings.RAG_OCR_MAX_PIXELS)} (FACTORY_RAG_OCR_MAX_PIXELS).")


def _megapixels(pixels: float) -> str:
    return f"{pixels / 1e6:,.{0 if pixels >= 1e7 else 1}f} megapixels"


def _parse_image(path: Path) -> list[ParsedPage]:
    """One page per frame, each to be read by OCR; the frames' count and sizes are checked here, before any is
    decoded."""
    with _reading("The file is not a PNG, JPEG, TIFF, WebP or BMP image, or it is damaged; export it again."), \
            open_image(path) as image:
        pages = getattr(image, "n_frames", 1)
        if pages > settings.RAG_OCR_MAX_PAGES:
            raise ParseError("too_many_pages", f"The image has {pages:,} pages; OCR reads at most "
                                               f"{settings.RAG_OCR_MAX_PAGES:,} pages of a document "
                                               f"(FACTORY_RAG_OCR_MAX_PAGES). Split it and upload the parts.")
        for page in range(1, pages + 1):
            image.seek(page - 1)
            check_image(image, page, pages)
    return [ParsedPage("", page, needs_ocr=True) for page in range(1, pages + 1)]


# --- DOCX ---

def _parse_docx(path: Path) -> list[ParsedPage]:
    with _reading("The file is not a valid Word document (.docx); older .doc files must be saved as .docx first."):
        document = docx.Document(str(path))
        blocks = [_docx_block_text(block) for block in document.iter_inner_content()]
    return [ParsedPage("\n\n".join(block for block in blocks if block), None)]


def _docx_block_text(block: Paragraph | Table) -> str:
    if isinstance(block, Table):
        rows = (" | ".join(_one_line(cell.text) for cell in row.cells) for row in block.rows)
        return "\n".join(row for row in rows if row.strip(" |"))
    text = block.text.strip()
    level = _docx_heading_level(block)
    return f"{'#' * level} {_one_line(text)}" if text and level else text


def _docx_heading_level(paragraph: Paragraph) -> int | None:
    name = paragraph.style.name if paragraph.style is not None else ""
    if name == "Title":
        return 1
    match = re.fullmatch(r"Heading (\d+)", name)
    return min(int(match[1]), 6) if match else None


# --- HTML ---

def _parse_html(path: Path) -> list[ParsedPage]:
    soup = BeautifulSoup(_decode_text(path.read_bytes()), "lxml")
    for tag in soup.find_all(_BOILERPLATE_HTML_TAGS):
        tag.decompose()
    # Comments, the doctype and processing instructions are markup, not content.
    for string in soup.find_all(string=lambda string: isinstance(string, PreformattedString)):
        string.extract()
    _collapse_html_whitespace(soup)
    # Innermost first, so that a table nested in another is already text when its container is read.
    for table in reversed(soup.find_all("table")):
        table.replace_with(f"{_PARAGRAPH}{_html_table_text(table)}{_PARAGRAPH}")
    for heading in soup.find_all(_HEADING_HTML_TAGS):
        level = int(heading.name[1])
        heading.replace_with(f"{_PARAGRAPH}{'#' * level} {_one_line(heading.get_text(' '))}{_PARAGRAPH}")
    for tag, mark in _html_block_marks(soup):
        tag.insert_before(mark)
        tag.insert_after(mark)
    for item in soup.find_all("li"):
        item.insert_before(_ITEM)
    for line_break in soup.find_all("br"):
        line_break.replace_with(_LINE)
    return [ParsedPage(_resolve_breaks(soup.get_text()).strip(), None)]


def _html_block_marks(soup: BeautifulSoup) -> Iterator[tuple[Tag, str]]:
    for tag in soup.find_all(_PARAGRAPH_HTML_TAGS):
        yield tag, _PARAGRAPH
    for tag in soup.find_all(_LINE_HTML_TAGS):
        yield tag, _LINE


def _resolve_breaks(text: str) -> str:
    """Turns each run of break marks, and the whitespace around it, into one line break or one blank line.

    Marks pile up where blocks nest (</p></li></ul>), and adding up newlines would give ragged blank lines. A run
    that starts a list item becomes "- ", after a blank line only where a paragraph ended, as in Markdown.
    """
    def resolve(run: re.Match) -> str:
        before_item, item, _ = run[0].partition(_ITEM)
        gap = "\n\n" if _PARAGRAPH in before_item else "\n"
        return f"{gap}- " if item else gap

    return re.sub(rf"\s*[{_MARKS}][\s{_MARKS}]*", resolve, text)


def _collapse_html_whitespace(soup: BeautifulSoup) -> None:
    """Source line breaks inside HTML text are just spaces; only the markup decides where lines end."""
    for string in soup.find_all(string=True):
        if string.find_parent("pre") is None:
            string.replace_with(re.sub(r"\s+", " ", string))


def _html_table_text(table: Tag) -> str:
    rows = (" | ".join(_one_line(cell.get_text(" ")) for cell in row.find_all(["th", "td"]))
            for row in table.find_all("tr"))
    return "\n".join(row for row in rows if row.strip(" |"))


# --- Markdown, TXT, CSV and XLSX ---

def _parse_plain_text(path: Path) -> list[ParsedPage]:
    return [ParsedPage(_decode_text(path.read_bytes()), None)]


def _parse_csv(path: Path) -> list[ParsedPage]:
    text = _decode_text(path.read_bytes())
    with _reading("The CSV file is malformed and cannot be read."):
        rows = list(csv.reader(io.StringIO(text), dialect=_csv_dialect(text)))
    return [ParsedPage("\n".join(_records(rows)), None)]


def _csv_dialect(text: str) -> type[csv.Dialect]:
    # Spreadsheets in many locales export with ";" rather than ",".
    try:
        return csv.Sniffer().sniff(text[:8192], delimiters=",;\t|")
    except csv.Error:
        return csv.excel


def _parse_xlsx(path: Path) -> list[ParsedPage]:
    # An open file, not the path: uploads are stored under their sha256 without an extension, and openpyxl refuses
    # a path that does not end in .xlsx.
    with _reading("The file is not a valid Excel workbook (.xlsx); older .xls files must be saved as .xlsx first."), \
            path.open("rb") as stream:
        workbook = openpyxl.load_workbook(stream, read_only=True, data_only=True)
        try:
            sheets = [(sheet.title, list(_sheet_rows(workbook, sheet))) for sheet in workbook.worksheets]
        finally:
            workbook.close()
    return [ParsedPage(f"## Sheet: {title}\n\n" + "\n".join(records), None)
            for title, rows in sheets if (records := _sparse_records(rows))]


def _sheet_rows(workbook, sheet) -> Iterator[dict[int, str]]:
    """Each row's non-empty cells as {column number: text}.

    openpyxl's row iterators pad every row to the sheet's declared width and fill in missing rows, so a sheet
    declaring <dimension ref="A1:XFD1048576"/> becomes 10^6 x 16,384 cells. Its sheet parser (the one those
    iterators read from) yields only the cells the XML holds, which is what is read here.
    """
    with workbook._archive.open(sheet._worksheet_path) as source:
        parser = WorkSheetParser(source, workbook.shared_strings, data_only=True, epoch=workbook.epoch,
                                 date_formats=workbook._date_formats, timedelta_formats=workbook._timedelta_formats)
        for _, cells in parser.parse():
            row = {cell["column"]: text for cell in cells if (text := _cell_text(cell["value"])).strip()}
            if row:
                yield row


def _cell_text(value) -> str:
    if value is None:
        return ""
    if isinstance(value, float) and value.is_integer():
        return str(int(value))  # Excel stores every number as a float; 150.0 kg was typed as 150
    if isinstance(value, datetime):
        # A date typed into a cell comes back as a datetime at midnight.
        return value.date().isoformat() if value.time() == time.min else value.isoformat(sep=" ")
    if isinstance(value, (date, time)):
        return value.isoformat()
    return str(value)


def _records(rows: Iterable[list[str]]) -> list[str]:
    """Rows under a header row as 'column: value; ...' lines, so that each row is retrievable on its own."""
    rows = [row for row in rows if any(cell.strip() for cell in row)]
    if not rows:
        return []
    header, *body = rows
    names = [_one_line(name) for name in header]

    def column(index: int) -> str:
        return names[index] if index < len(names) and names[index] else f"column {index + 1}"

    return ["; ".join(f"{column(index)}: {_one_line(value)}" for index, value in enumerate(row) if value.strip())
            for row in body]


def _sparse_records(rows: list[dict[int, str]]) -> list[str]:
    """`_records` for rows given as {column number: text} (only the cells that hold something)."""
    if not rows:
        return []
    header, *body = rows
    names = {column: _one_line(name) for column, name in header.items()}
    return ["; ".join(f"{names.get(column) or f'column {column}'}: {_one_line(row[column])}" for column in sorted(row))
            for row in body]


def _one_line(text: str) -> str:
    return " ".join(text.split())


# --- Encodings ---

def _decode_text(data: bytes) -> str:
    text = _decode_unicode(data)
    if text is None:
        text = _confident_guess(data)
    if text is None or _looks_binary(text):
        raise ParseError("wrong_encoding", "The file is not UTF-8 text and its encoding could not be detected; "
                                           "save it as UTF-8 and upload it again.")
    return text


def _decode_unicode(data: bytes) -> str | None:
    for bom, encoding in _BOMS:
        if data.startswith(bom):
            try:
                return data.decode(encoding)
            except UnicodeDecodeError:
                return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def _confident_guess(data: bytes) -> str | None:
    """charset-normalizer's best reading, but only when no other reading of the bytes scores as well.

    Short texts are often ambiguous (a few GBK characters are equally valid Korean cp949), and a wrong guess would
    put mojibake into the index; the user is better served by a request to save the file as UTF-8.
    """
    # UTF-16/32 are only trusted with a byte order mark, which _decode_unicode already handled.
    matches = [match for match in from_bytes(data) if not match.encoding.startswith(("utf_16", "utf_32"))]
    if not matches:
        return None
    best, *others = matches
    tied = any((other.chaos, other.coherence) == (best.chaos, best.coherence) for other in others)
    return None if best.chaos > MAX_ENCODING_CHAOS or tied else str(best)


def _looks_binary(text: str) -> bool:
    return "\x00" in text or len(_BINARY_CONTROLS.findall(text)) > len(text) / 100


PARSERS = {
    "pdf": _parse_pdf,
    "image": _parse_image,
    "docx": _parse_docx,
    "html": _parse_html,
    "markdown": _parse_plain_text,
    "text": _parse_plain_text,
    "csv": _parse_csv,
    "xlsx": _parse_xlsx,
}
