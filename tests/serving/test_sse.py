import json

import pytest

from serving.sse import SSEParser

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
