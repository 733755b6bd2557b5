"""An incremental server-sent-events parser for relaying and reading OpenAI-style streams.

Network reads split the stream anywhere: inside an event, inside a line, inside a multi-byte UTF-8 character
(Chinese text). The bytes are decoded incrementally, so a character split across two reads is decoded whole, and
each read is scanned only from where the previous scan stopped, so a long event arriving in many small reads costs
linear time. httpx-sse does the same for httpx responses but only as an iterator over a response; the gateway needs
to feed reads it also forwards, and to keep each event's text to forward or drop it.
"""

import codecs
import json
from dataclasses import dataclass

DONE = "[DONE]"


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


def _data_of(text: str) -> str:
    lines = []
    for line in text.split("\n"):
        if line.startswith("data:"):
            value = line[5:]
            lines.append(value[1:] if value.startswith(" ") else value)
    return "\n".join(lines)


class SSEParser:
    def __init__(self) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._buffer = ""
        self._scanned = 0
        # A CR that ends a read may be the first half of a CRLF; it waits for the next read to tell.
        self._pending_cr = False

    def feed(self, raw: bytes) -> list[Event]:
        """The events that `raw` completes, in order."""
        text = self._decoder.decode(raw)
        if self._pending_cr:
            text, self._pending_cr = "\r" + text, False
        if text.endswith("\r"):
            text, self._pending_cr = text[:-1], True
        if "\r" in text:  # CRLF and lone CR end lines too
            text = text.replace("\r\n", "\n").replace("\r", "\n")
        self._buffer += text
        events = []
        while True:
            end = self._buffer.find("\n\n", max(self._scanned - 1, 0))
            if end < 0:
                self._scanned = len(self._buffer)
                return events
            block, self._buffer, self._scanned = self._buffer[:end], self._buffer[end + 2:], 0
            if block.strip("\n"):
                events.append(Event(text=block, data=_data_of(block)))

    def close(self) -> list[Event]:
        """Whatever the stream left without a closing blank line, as a last event."""
        rest = (self._buffer + self._decoder.decode(b"", final=True)).strip("\n")
        self._buffer, self._scanned, self._pending_cr = "", 0, False
        return [Event(text=rest, data=_data_of(rest))] if rest else []
