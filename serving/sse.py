"""An incremental server-sent-events parser for relaying and reading OpenAI-style streams.

Network reads split the stream anywhere: inside an event, inside a line, inside a multi-byte UTF-8 character
(Chinese text). The parser works on bytes and cuts only after an event's closing blank line, which never falls
inside a character, so each event is decoded whole; each read is scanned only from where the previous scan
stopped, so a long event arriving in many small reads costs linear time. The gateway relays the cut bytes as they
came (`feed_bytes`) and reads only what it needs of them (`has_content`, `events_of`); httpx-sse does the same for
httpx responses, but only as an iterator over a response, and decodes every event.
"""

import json
import re
from dataclasses import dataclass

DONE = "[DONE]"
# After a key, a non-empty string value; after "usage", an object (OpenAI's streams send `"usage": null` in every
# other chunk once asked for the usage).
_STRING_VALUE = re.compile(rb'\s*:\s*"(?!")')
_OBJECT_VALUE = re.compile(rb"\s*:\s*\{")


@dataclass(frozen=True)
class Event:
    """One event: its text as sent (without the blank line that ends it) and the joined `data:` lines."""

    text: str
    data: str

    def encode(self) -> bytes:
        return f"{self.text}\n\n".encode()

    @property
    def is_done(self) -> bool:
        return self.data.strip() == DONE

    def json(self) -> dict | None:
        """The data as a JSON object, or None for [DONE], comments and anything that is not one."""
        if not self.data or self.is_done:
            return None
        try:
            value = json.loads(self.data)
        except json.JSONDecodeError:
            return None
        return value if isinstance(value, dict) else None


def _has_key(data: bytes, key: bytes, value: re.Pattern) -> bool:
    """Whether JSON `data` has the key `key` (quoted) with a value that starts as `value` says: found with
    bytes.find, which scans far faster than a regular expression, and not inside a string, where a key's quotes
    would be escaped."""
    at = data.find(key)
    while at >= 0:
        end = at + len(key)
        if data[at - 1:at] != b"\\" and value.match(data, end):
            return True
        at = data.find(key, end)
    return False


def has_content(event: bytes) -> bool:
    """Whether an OpenAI stream chunk, as bytes, has content in a choice (a chat's `delta.content`, a completion's
    `text`, non-empty): the question the relay asks of every token, answered without json.loads, which costs
    several times as much."""
    return _has_key(event, b'"content"', _STRING_VALUE) or _has_key(event, b'"text"', _STRING_VALUE)


def may_hold_usage_or_done(block: bytes) -> bool:
    """Whether whole events, as bytes, may hold the stream's usage or its [DONE]: the events worth parsing."""
    return b"[DONE]" in block or _has_key(block, b'"usage"', _OBJECT_VALUE)


def _data_of(text: str) -> str:
    lines = []
    for line in text.split("\n"):
        if line.startswith("data:"):
            value = line[5:]
            lines.append(value[1:] if value.startswith(" ") else value)
    return "\n".join(lines)


def events_of(block: bytes) -> list[Event]:
    """The events of whole events' bytes, as `feed_bytes` cuts them."""
    return [Event(text=text, data=_data_of(text)) for part in block.split(b"\n\n")
            if (text := part.decode("utf-8", errors="replace").strip("\n"))]


class SSEParser:
    def __init__(self) -> None:
        self._buffer = bytearray()
        self._scanned = 0
        # A CR that ends a read may be the first half of a CRLF; it waits for the next read to tell.
        self._pending_cr = False

    def feed_bytes(self, raw: bytes) -> bytes:
        """The whole events that `raw` completes, as their bytes (lines ended by LF), each ended by its blank line;
        b"" when it completes none."""
        if self._pending_cr:
            raw, self._pending_cr = b"\r" + raw, False
        if b"\r" in raw:  # CRLF and lone CR end lines too
            if raw.endswith(b"\r"):
                raw, self._pending_cr = raw[:-1], True
            raw = raw.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        if not self._buffer and raw.endswith(b"\n\n"):
            return raw  # one read, whole events: the usual case, without a copy
        self._buffer += raw
        end = self._buffer.rfind(b"\n\n", max(self._scanned - 1, 0))
        if end < 0:
            self._scanned = len(self._buffer)
            return b""
        block = bytes(self._buffer[:end + 2])
        del self._buffer[:end + 2]
        self._scanned = len(self._buffer)
        return block

    def feed(self, raw: bytes) -> list[Event]:
        """The events that `raw` completes, in order."""
        return events_of(self.feed_bytes(raw))

    def close_bytes(self) -> bytes:
        """Whatever the stream left without a closing blank line, as a last event's bytes (b"" when nothing)."""
        rest = bytes(self._buffer).strip(b"\n")
        self._buffer, self._scanned, self._pending_cr = bytearray(), 0, False
        return rest + b"\n\n" if rest else b""

    def close(self) -> list[Event]:
        """Whatever the stream left without a closing blank line, as a last event."""
        return events_of(self.close_bytes())
