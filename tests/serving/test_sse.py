import json

import pytest

from serving.sse import SSEParser, has_content, may_hold_usage_or_done

CHINESE = "你好，世界！检索增强生成"


def _stream(*chunks: dict, newline: str = "\n") -> bytes:
    events = [f"data: {json.dumps(chunk, ensure_ascii=False)}" for chunk in chunks] + ["data: [DONE]"]
    return "".join(event + newline * 2 for event in events).encode()


def _content(events) -> str:
    return "".join(c["choices"][0]["delta"]["content"] for e in events if (c := e.json()) and c.get("choices"))


@pytest.mark.parametrize("newline", ["\n", "\r\n", "\r"])
def test_chinese_text_split_at_every_byte_comes_out_whole(newline):
    raw = _stream(*({"choices": [{"delta": {"content": ch}}]} for ch in CHINESE), newline=newline)

    for cut in range(1, len(raw)):
        parser = SSEParser()
        events = parser.feed(raw[:cut]) + parser.feed(raw[cut:]) + parser.close()
        assert _content(events) == CHINESE and events[-1].is_done, f"split at byte {cut}"


def test_one_byte_at_a_time_gives_the_same_events_as_one_read():
    raw = _stream({"choices": [{"delta": {"content": CHINESE}}]}, {"choices": [], "usage": {"completion_tokens": 9}})
    whole = SSEParser().feed(raw)
    parser = SSEParser()
    trickled = [event for i in range(len(raw)) for event in parser.feed(raw[i:i + 1])]

    assert trickled == whole and len(whole) == 3
    assert whole[1].json()["usage"] == {"completion_tokens": 9}


def test_events_are_forwarded_as_sent_and_comments_and_odd_data_are_not_json():
    parser = SSEParser()
    events = parser.feed(b": keep-alive\n\nevent: error\ndata: {\"error\": 1}\n\ndata: [1, 2]\n\ndata: a\ndata: b\n\n")

    assert [e.encode() for e in events] == [b": keep-alive\n\n", b"event: error\ndata: {\"error\": 1}\n\n",
                                            b"data: [1, 2]\n\n", b"data: a\ndata: b\n\n"]
    assert [e.json() for e in events] == [None, {"error": 1}, None, None]
    assert events[3].data == "a\nb"


def test_a_stream_cut_off_without_a_blank_line_still_yields_its_last_event():
    parser = SSEParser()
    complete = parser.feed(b'data: {"choices": []}\n\ndata: {"cut": tr')
    last = parser.close()

    assert [e.json() for e in complete] == [{"choices": []}]
    assert [e.text for e in last] == ['data: {"cut": tr'] and last[0].json() is None


def test_the_relay_gets_each_read_cut_after_its_last_whole_event_and_the_bytes_as_they_came():
    raw = _stream(*({"choices": [{"delta": {"content": ch}}]} for ch in CHINESE), {"choices": [], "usage": {"n": 1}})

    for size in (1, 7, 100, len(raw)):
        parser = SSEParser()
        blocks = [parser.feed_bytes(raw[i:i + size]) for i in range(0, len(raw), size)]
        assert b"".join(blocks) + parser.close_bytes() == raw, f"reads of {size} bytes"
        assert all(block.endswith(b"\n\n") for block in blocks if block)


@pytest.mark.parametrize("chunk, content", [
    ({"choices": [{"delta": {"content": "猫"}}]}, True),
    ({"choices": [{"index": 0, "text": " Paris"}]}, True),
    ({"choices": [{"delta": {"role": "assistant", "content": None}}]}, False),
    ({"choices": [{"delta": {"content": ""}}]}, False),
    ({"choices": [{"delta": {"reasoning_content": "hmm"}}]}, False),
    ({"choices": [{"delta": {"tool_calls": [{"function": {"arguments": '{"content": "x", "text": "y"}'}}]}}]}, False),
    ({"choices": [{"delta": {}, "logprobs": {"content": [{"token": "a", "logprob": -0.1}]}}]}, False),
    ({"choices": [], "usage": {"completion_tokens": 3}}, False),
])
def test_content_is_read_from_a_chunk_s_bytes_as_json_would_read_it(chunk, content):
    for separators in ((",", ":"), (", ", ": ")):
        event = f"data: {json.dumps(chunk, ensure_ascii=False, separators=separators)}\n\n".encode()
        assert has_content(event) is content, event


def test_only_events_that_may_hold_the_usage_or_done_are_worth_parsing():
    assert may_hold_usage_or_done(b'data: {"choices": [], "usage": {"completion_tokens": 3}}\n\n')
    assert may_hold_usage_or_done(b"data: [DONE]\n\n")
    assert not may_hold_usage_or_done(b'data: {"choices": [{"delta": {"content": "a"}}], "usage": null}\n\n')
    assert not may_hold_usage_or_done(b'data: {"choices": [{"delta": {"content": "\\"usage\\": {"}}]}\n\n')
