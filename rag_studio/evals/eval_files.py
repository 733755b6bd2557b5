"""Read uploaded evaluation sets: CSV with a header row, or JSON Lines (one object per line, .jsonl or .json).

Fields, matched case-insensitively (spaces and hyphens count as "_"):
- question (or query): required and non-empty.
- expected_answer (or answer, ground_truth): optional.
- expected_sources (or expected_source, sources, source, expected_document): optional document file names or chunk
  ids. Several are separated by "|" in one string (CSV cell or JSON string); JSON may also give a list of strings.
- evidence (or evidence_phrase): optional words of the answering passage. A hit counts as relevant when its text
  holds them (within the expected documents, when those are named): a question is then judged by its passage, not
  only its document, without anyone knowing chunk ids.
Other columns and keys are ignored. Errors name the line (1-based; a CSV header is line 1, a CSV record its first
line).
"""

import csv
import io
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import PurePath

MAX_EVAL_ITEMS = 5000
SOURCE_SEPARATOR = "|"

FIELD_ALIASES = {
    "question": ("question", "query"),
    "expected_answer": ("expected_answer", "answer", "ground_truth"),
    "expected_sources": ("expected_sources", "expected_source", "sources", "source", "expected_document"),
    "evidence": ("evidence", "evidence_phrase"),
}
FIELD_BY_ALIAS = {alias: field for field, aliases in FIELD_ALIASES.items() for alias in aliases}


@dataclass(frozen=True)
class EvalItemDraft:
    question: str
    expected_answer: str
    expected_sources: list[str]
    evidence: str = ""


class EvalFileError(ValueError):
    """A problem in an uploaded eval file; str() reads "line 7: missing 'question'", or just the message."""

    def __init__(self, line: int | None, message: str):
        super().__init__(message if line is None else f"line {line}: {message}")
        self.line = line


def parse_eval_file(content: bytes, filename: str) -> list[EvalItemDraft]:
    extension = PurePath(filename).suffix.lower()
    if extension not in (".csv", ".jsonl", ".json"):
        raise EvalFileError(None, f"{filename!r} is not a .csv, .jsonl or .json (JSON Lines) file")
    text = _decode(content)
    records = _csv_records(text) if extension == ".csv" else _json_lines_records(text)
    items = []
    for line, fields in records:
        if len(items) == MAX_EVAL_ITEMS:
            raise EvalFileError(line, f"more than {MAX_EVAL_ITEMS} items; split the file")
        items.append(_item(fields, line))
    if not items:
        raise EvalFileError(None, "the file has no items")
    return items


def _decode(content: bytes) -> str:
    # utf-8-sig drops the byte order mark that Excel writes at the start of CSV exports.
    try:
        return content.decode("utf-8-sig")
    except UnicodeDecodeError as error:
        # error.object, not content: the codec reports positions after the byte order mark it dropped.
        raise EvalFileError(error.object.count(b"\n", 0, error.start) + 1, "the file is not UTF-8 text") from None


def _canonical_names(names: list[str], line: int) -> dict[str, str]:
    """Map each known field to the column or key that gives it; two names for one field are an error."""
    found: dict[str, str] = {}
    for name in names:
        field = FIELD_BY_ALIAS.get(name.strip().lower().replace(" ", "_").replace("-", "_"))
        if field is None:
            continue
        if field in found:
            raise EvalFileError(line, f"both {found[field]!r} and {name!r} give {field!r}; keep one")
        found[field] = name
    return found


def _csv_records(text: str) -> Iterator[tuple[int, dict]]:
    """(line, fields by canonical name) for each non-blank record."""
    reader = csv.reader(io.StringIO(text, newline=""))
    try:
        yield from _csv_rows(reader)
    except csv.Error as error:  # a field over csv's size limit, a NUL byte
        raise EvalFileError(reader.line_num, f"not readable as CSV: {error}")


def _csv_rows(reader) -> Iterator[tuple[int, dict]]:
    header = next(reader, None)
    if header is None:
        return
    columns = _canonical_names(header, line=1)
    if "question" not in columns:
        raise EvalFileError(1, "no question column; name one 'question' or 'query'")
    positions = {field: header.index(name) for field, name in columns.items()}
    record_line = reader.line_num + 1
    for row in reader:
        if any(cell.strip() for cell in row):
            yield record_line, {field: row[position] if position < len(row) else ""
                                for field, position in positions.items()}
        record_line = reader.line_num + 1


def _json_lines_records(text: str) -> Iterator[tuple[int, dict]]:
    """(line, fields by canonical name) for each non-blank line."""
    for line_number, line in enumerate(text.split("\n"), start=1):   # not splitlines: JSON strings may hold U+2028
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            raise EvalFileError(line_number, f"not valid JSON ({error.msg})") from None
        except ValueError as error:  # an integer past Python's 4,300 digits
            raise EvalFileError(line_number, f"not acceptable JSON ({error})") from None
        if not isinstance(record, dict):
            raise EvalFileError(line_number, f"expected a JSON object, got {_json_type(record)}")
        yield line_number, {field: record[name] for field, name in _canonical_names(list(record), line_number).items()}


def _item(fields: dict, line: int) -> EvalItemDraft:
    question = _text_field(fields, "question", line)
    if not question:
        raise EvalFileError(line, "missing 'question'")
    return EvalItemDraft(question=question, expected_answer=_text_field(fields, "expected_answer", line),
                         expected_sources=_sources(fields.get("expected_sources"), line),
                         evidence=_text_field(fields, "evidence", line))


def _text_field(fields: dict, field: str, line: int) -> str:
    value = fields.get(field)
    if value is None:
        return ""
    # Numbers are fine answers in JSON ("answer": 42); booleans are more likely mistakes.
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise EvalFileError(line, f"{field!r} must be text, got {_json_type(value)}")
    return str(value).strip()


def _sources(value: object, line: int) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        value = value.split(SOURCE_SEPARATOR)
    elif not (isinstance(value, list) and all(isinstance(source, str) for source in value)):
        found = "a list with non-text items" if isinstance(value, list) else _json_type(value)
        raise EvalFileError(line, f"'expected_sources' must be a string or a list of strings, got {found}")
    return [source.strip() for source in value if source.strip()]


def _json_type(value: object) -> str:
    names = {dict: "an object", list: "an array", str: "a string", bool: "true/false", int: "a number",
             float: "a number", type(None): "null"}
    return names[type(value)]
