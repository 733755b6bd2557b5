"""Reading uploaded instruction data: alpaca, ShareGPT or OpenAI-messages JSONL, or CSV with a column mapping, into
one shape, a list of conversations [{"role", "content"}, ...]. Every refusal names the line (or CSV row) and the
problem, in the words a person would fix it by."""

import csv
import io
import json
from dataclasses import dataclass

ROLES = ("system", "user", "assistant")
SHAREGPT_ROLES = {"system": "system", "human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant",
                  "model": "assistant"}
# A sample's text beyond this many characters is refused rather than silently cut: over-long samples are usually a
# broken export (a whole file pasted into one answer).
MAX_SAMPLE_CHARS = 32_000
MAX_ERRORS_SHOWN = 20


class DatasetInvalid(ValueError):
    def __init__(self, errors: list[str]):
        shown = errors[:MAX_ERRORS_SHOWN]
        more = f" (and {len(errors) - len(shown)} more)" if len(errors) > len(shown) else ""
        super().__init__("; ".join(shown) + more)
        self.errors = errors


@dataclass(frozen=True)
class ColumnMapping:
    """Which CSV columns hold the prompt, an optional extra input, the answer and an optional system message."""

    instruction: str = "instruction"
    output: str = "output"
    input: str = ""
    system: str = ""


def detect_format(first_record: dict) -> str:
    if "messages" in first_record:
        return "messages"
    if "conversations" in first_record:
        return "sharegpt"
    if "instruction" in first_record or "output" in first_record:
        return "alpaca"
    return ""


def _check_conversation(messages: list[dict], where: str) -> list[str]:
    problems = []
    if not messages:
        return [f"{where}: the conversation is empty"]
    for index, message in enumerate(messages):
        role, content = message.get("role"), message.get("content")
        if role not in ROLES:
            problems.append(f"{where}: message {index + 1} has role '{role}'; the roles are system, user and "
                            f"assistant")
        elif not isinstance(content, str) or not content.strip():
            problems.append(f"{where}: message {index + 1} ({role}) is empty")
        elif role == "system" and index != 0:
            problems.append(f"{where}: a system message may only come first")
    if problems:
        return problems
    turns = [m["role"] for m in messages if m["role"] != "system"]
    if not turns or turns[-1] != "assistant":
        problems.append(f"{where}: the conversation does not end with an assistant answer")
    if any(a == b for a, b in zip(turns, turns[1:])):
        problems.append(f"{where}: user and assistant messages must alternate")
    if turns and turns[0] != "user":
        problems.append(f"{where}: the first message after the system message must be the user's")
    length = sum(len(m["content"]) for m in messages)
    if length > MAX_SAMPLE_CHARS:
        problems.append(f"{where}: the sample is {length} characters long, over the limit of {MAX_SAMPLE_CHARS}")
    return problems


def _from_alpaca(record: dict, where: str) -> list[dict]:
    instruction, extra, output = record.get("instruction"), record.get("input", ""), record.get("output")
    if not isinstance(instruction, str) or not isinstance(output, str):
        raise DatasetInvalid([f"{where}: an alpaca record needs 'instruction' and 'output' strings"])
    prompt = f"{instruction.strip()}\n\n{extra.strip()}" if isinstance(extra, str) and extra.strip() else instruction
    messages = [{"role": "system", "content": record["system"]}] if record.get("system") else []
    return messages + [{"role": "user", "content": prompt.strip()}, {"role": "assistant", "content": output.strip()}]


def _from_sharegpt(record: dict, where: str) -> list[dict]:
    turns = record.get("conversations")
    if not isinstance(turns, list):
        raise DatasetInvalid([f"{where}: 'conversations' must be a list"])
    messages = []
    for index, turn in enumerate(turns):
        speaker = turn.get("from") if isinstance(turn, dict) else None
        if speaker not in SHAREGPT_ROLES:
            raise DatasetInvalid([f"{where}: turn {index + 1} is from '{speaker}'; ShareGPT speakers are system, "
                                  f"human and gpt"])
        messages.append({"role": SHAREGPT_ROLES[speaker], "content": turn.get("value")})
    return messages


def _from_messages(record: dict, where: str) -> list[dict]:
    messages = record.get("messages")
    if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
        raise DatasetInvalid([f"{where}: 'messages' must be a list of {{role, content}} objects"])
    return [{"role": m.get("role"), "content": m.get("content")} for m in messages]


READERS = {"alpaca": _from_alpaca, "sharegpt": _from_sharegpt, "messages": _from_messages}


def parse_jsonl(data: bytes, *, declared_format: str = "") -> tuple[str, list[list[dict]]]:
    """The format (declared, or detected from the first record) and every conversation; DatasetInvalid lists the
    lines that are broken."""
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise DatasetInvalid([f"the file is not UTF-8 text (byte {exc.start})"])
    conversations, errors, source_format = [], [], declared_format
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        where = f"line {number}"
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            errors.append(f"{where}: not valid JSON ({exc.msg} at column {exc.colno})")
            continue
        if not isinstance(record, dict):
            errors.append(f"{where}: each line must be a JSON object")
            continue
        if not source_format:
            source_format = detect_format(record)
            if not source_format:
                raise DatasetInvalid([f"{where}: cannot tell the format; give 'messages' (OpenAI), 'conversations' "
                                      f"(ShareGPT) or 'instruction'/'output' (alpaca)"])
        try:
            messages = READERS[source_format](record, where)
        except DatasetInvalid as exc:
            errors.extend(exc.errors)
            continue
        problems = _check_conversation(messages, where)
        if problems:
            errors.extend(problems)
        else:
            conversations.append(messages)
    if errors:
        raise DatasetInvalid(errors)
    if not conversations:
        raise DatasetInvalid(["the file holds no samples"])
    return source_format, conversations


def parse_csv(data: bytes, *, mapping: ColumnMapping) -> list[list[dict]]:
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise DatasetInvalid([f"the file is not UTF-8 text (byte {exc.start})"])
    reader = csv.DictReader(io.StringIO(text))
    columns = reader.fieldnames or []
    missing = [name for name in (mapping.instruction, mapping.output, mapping.input, mapping.system)
               if name and name not in columns]
    if missing:
        raise DatasetInvalid([f"the CSV has no column {', '.join(repr(m) for m in missing)}; its columns are "
                              f"{', '.join(columns) or 'none'}"])
    conversations, errors = [], []
    # Row 1 is the header, so the first record is on row 2, as a spreadsheet numbers it.
    for number, row in enumerate(reader, start=2):
        record = {"instruction": row.get(mapping.instruction) or "", "output": row.get(mapping.output) or "",
                  "input": row.get(mapping.input) or "" if mapping.input else "",
                  "system": row.get(mapping.system) or "" if mapping.system else ""}
        messages = _from_alpaca(record, f"row {number}")
        problems = _check_conversation(messages, f"row {number}")
        if problems:
            errors.extend(problems)
        else:
            conversations.append(messages)
    if errors:
        raise DatasetInvalid(errors)
    if not conversations:
        raise DatasetInvalid(["the file holds no samples"])
    return conversations
