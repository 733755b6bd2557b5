"""A fake OpenAI-compatible engine that streams chat completions the way llama-server does, at a set pace and no
cost of its own worth measuring: one `data:` event per token (as llama-server's chunks read, role chunk first,
usage last when asked), in HTTP/1.1 chunked encoding, the connection closed after each streamed answer. It answers
`max_tokens` tokens whatever the prompt, due `--token-delay-ms` apart (0: as fast as the event loop turns), the
first `--first-token-ms` after the request. For the relay bench (bench/relay.py) and the gateway's tests, run as a
script (`started` does, and stops it on the way out):

    .venv/bin/python -m bench.helpers.fake_engine --port 9000 [--token-delay-ms 3] [--first-token-ms 0]

It prints `listening on <port>` once it accepts connections.
"""

import argparse
import asyncio
import json
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import uvloop

WORDS = [" the", " quick", " brown", " fox", " jumps", " over", " a", " lazy", " dog", ".", " It", " was", " 42",
         " 中文", " sunny", " day"]
SYSTEM_FINGERPRINT = "b6000-fake"


def _chunk(payload: str) -> bytes:
    """One HTTP/1.1 chunk holding one server-sent event."""
    event = f"data: {payload}\n\n".encode()
    return b"%x\r\n%b\r\n" % (len(event), event)


def _events(body: dict) -> tuple[list[bytes], bytes]:
    """The stream's chunks before the tokens' (the role chunk), one per token and after them; built up front so
    that the engine spends next to nothing per token."""
    created, ident, model = int(time.time()), f"chatcmpl-{uuid.uuid4().hex}", json.dumps(body.get("model", "fake"))
    tail = f'"created":{created},"id":"{ident}","model":{model},"system_fingerprint":"{SYSTEM_FINGERPRINT}",' \
           f'"object":"chat.completion.chunk"}}'

    def delta(delta_json: str, finish: str = "null") -> bytes:
        return _chunk(f'{{"choices":[{{"finish_reason":{finish},"index":0,"delta":{delta_json}}}],{tail}')

    tokens = int(body.get("max_tokens") or 16)
    words = [delta(json.dumps({"content": WORDS[i % len(WORDS)]}, ensure_ascii=False, separators=(",", ":")))
             for i in range(tokens)]
    end = [delta("{}", '"length"')]
    options = body.get("stream_options")
    if isinstance(options, dict) and options.get("include_usage"):
        usage = {"completion_tokens": tokens, "prompt_tokens": 11, "total_tokens": tokens + 11}
        end.append(_chunk(f'{{"choices":[],{tail[:-1]},"usage":{json.dumps(usage, separators=(",", ":"))}}}'))
    end.append(_chunk("[DONE]"))
    return [delta('{"role":"assistant","content":null}'), *words], b"".join(end) + b"0\r\n\r\n"


def _whole(body: dict) -> bytes:
    tokens = int(body.get("max_tokens") or 16)
    return json.dumps({
        "id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion", "created": int(time.time()),
        "model": body.get("model", "fake"),
        "choices": [{"index": 0, "finish_reason": "length", "message": {
            "role": "assistant", "content": "".join(WORDS[i % len(WORDS)] for i in range(tokens))}}],
        "usage": {"completion_tokens": tokens, "prompt_tokens": 11, "total_tokens": tokens + 11},
    }, ensure_ascii=False).encode()


async def _read_request(reader: asyncio.StreamReader) -> tuple[str, dict] | None:
    """The request's path and JSON body, or None when the client closed the connection."""
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except (asyncio.IncompleteReadError, ConnectionError):
        return None
    lines = head.decode("latin-1").split("\r\n")
    path = lines[0].split(" ")[1]
    headers = dict(line.lower().split(": ", 1) for line in lines[1:] if ": " in line)
    length = int(headers.get("content-length", "0"))
    content = await reader.readexactly(length) if length else b"{}"
    return path, json.loads(content or b"{}")


class Engine:
    def __init__(self, token_delay_s: float, first_token_s: float):
        self.token_delay_s, self.first_token_s = token_delay_s, first_token_s

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while (request := await _read_request(reader)) is not None:
                path, body = request
                if body.get("stream"):
                    await self._stream(writer, body)
                    return  # llama-server closes the connection after a streamed answer
                content = _whole(body) if path.endswith("/completions") else b'{"object":"list","data":[]}'
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%b"
                             % (len(content), content))
                await writer.drain()
        except ConnectionError:
            pass
        finally:
            writer.close()

    async def _stream(self, writer: asyncio.StreamWriter, body: dict) -> None:
        tokens, end = _events(body)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
                     b"Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n" + tokens[0])
        # Each token is due at its time from the start, so a late wake-up (a busy box) is made up, as an engine
        # that keeps its pace; waiting a whole delay after each write would let every delay add up.
        due = time.monotonic() + self.first_token_s
        for token in tokens[1:]:
            await asyncio.sleep(max(0.0, due - time.monotonic()))
            writer.write(token)
            await writer.drain()
            due += self.token_delay_s
        writer.write(end)
        await writer.drain()


@contextmanager
def started(*, token_delay_ms: float, first_token_ms: float = 0.0) -> Iterator[str]:
    """The engine in a process of its own; yields its base URL (`http://127.0.0.1:<port>/v1`)."""
    engine = subprocess.Popen([sys.executable, "-m", __name__, "--token-delay-ms", str(token_delay_ms),
                               "--first-token-ms", str(first_token_ms)], stdout=subprocess.PIPE, text=True,
                              cwd=Path(__file__).resolve().parents[2])
    try:
        line = engine.stdout.readline()
        if not line.startswith("listening on "):
            raise RuntimeError(f"The fake engine did not start (it said {line!r}).")
        yield f"http://127.0.0.1:{int(line.split()[-1])}/v1"
    finally:
        engine.terminate()
        engine.wait(timeout=10)


async def main(port: int, token_delay_s: float, first_token_s: float) -> None:
    engine = Engine(token_delay_s, first_token_s)
    server = await asyncio.start_server(engine.serve, "127.0.0.1", port, backlog=1024)
    print(f"listening on {server.sockets[0].getsockname()[1]}", flush=True)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--port", type=int, default=0, help="0: a free port, printed")
    parser.add_argument("--token-delay-ms", type=float, default=3.0)
    parser.add_argument("--first-token-ms", type=float, default=0.0)
    args = parser.parse_args()
    uvloop.run(main(args.port, args.token_delay_ms / 1000, args.first_token_ms / 1000))
