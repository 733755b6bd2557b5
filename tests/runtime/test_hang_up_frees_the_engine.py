"""Stop means stop: a client that hangs up mid-answer frees the engine's slot, on every path that streams an
answer (the gateway, the Playground, the RAG Studio chat, a published app's SSE and OpenAI-compatible streams).
Measured on the real SmolLM2 llama-server: its /metrics shows the slot busy while the answer streams, and idle
within a few seconds of the hang-up, long before the answer's max_tokens would have been written; the gateway
records the request as cut off by the client (499), not as a whole answer."""

import re
import time

import httpx
import pytest
from django.contrib.auth import get_user_model
from django.middleware.csrf import _get_new_csrf_string
from django.test import Client

from accounts.services import Actor, create_api_key, create_workspace
from rag_studio import services as rag_services
from rag_studio.models import DocumentStatus
from runtime import services
from serving.engines.base import auth_headers
from serving.models import Replica, RequestRecord
from serving.presets import SMOLLM2
from tests.conftest import deploy_presets, stop_engines_and_flush, wait_for
from tests.rag_studio.conftest import sample

pytestmark = pytest.mark.worker
# An answer that takes SmolLM2 on two cores far longer than the test waits for it to stop.
LONG_ANSWER_TOKENS = 2000
COUNTING = "Count from 1 to 5000, one number per line."
COUNTING_REQUEST = {"model": SMOLLM2, "stream": True, "max_tokens": LONG_ANSWER_TOKENS, "ignore_eos": True,
                    "messages": [{"role": "user", "content": COUNTING}]}
# Within seconds, and long before the answer would end (the decode steps after the hang-up are counted too): a
# busy 2-core box running the whole suite has taken over 5 s to pass the hang-up along.
FREED_WITHIN_S = 10.0
ATTEMPTS = 3


@pytest.fixture(scope="module")
def stack(shared_smollm2, celery_worker_process, web_server, django_db_blocker):
    with django_db_blocker.unblock():
        deploy_presets({SMOLLM2: 1})
        user = get_user_model().objects.create_user(username="stopper", password="x" * 12)
        owner = Actor(user=user)
        workspace = create_workspace(actor=owner, name="Stops")
        kb = rag_services.create_knowledge_base(actor=owner, workspace=workspace, name="Handbook")
        rag_services.upload_documents(actor=owner, kb=kb, uploads=[sample("northwind-support-faq.md")])
        wait_for(lambda: kb.documents.filter(status=DocumentStatus.INDEXED).exists(), timeout=120,
                 what="the worker to index the FAQ")
        # A prompt that makes the model write on and on, so that only a stop ends it early; one dense hit as its
        # context, so that the prompt does not move with the default fusion.
        config = rag_services.save_rag_config(
            actor=owner, workspace=workspace, name="Counter", knowledge_base=kb, template="basic", model=SMOLLM2,
            prompt="{context}\n\n" + COUNTING + " {question}", retrieval={"mode": "dense", "top_k": 1},
            generation={"temperature": 0, "max_tokens": LONG_ANSWER_TOKENS})
        app = services.publish_app(actor=owner, config=config, slug="counter")
        browser = Client()
        browser.force_login(user)
        yield {"url": web_server, "user": user, "config": config,
               "app_key": services.create_app_key(actor=owner, app=app, name="stops").secret,
               "api_key": create_api_key(actor=owner, workspace=workspace, name="stops").secret,
               "session": browser.cookies["sessionid"].value}
        stop_engines_and_flush(keep=SMOLLM2)


def _engine() -> tuple[str, dict]:
    replica = Replica.objects.get(deployment__workspace=None, deployment__name=SMOLLM2)
    return f"{replica.base_url.removesuffix('/v1')}/metrics", auth_headers(replica.api_key)


def _engine_figure(name: str) -> int:
    url, headers = _engine()
    metrics = httpx.get(url, headers=headers, timeout=5).text
    return int(float(re.search(rf"^llamacpp:{name} (\S+)$", metrics, re.M)[1]))


def busy_slots() -> int:
    return _engine_figure("requests_processing")


def _decode_steps() -> int:
    """llama_decode() calls so far: one a token while a single answer is being written."""
    return _engine_figure("n_decode_total")


def _hang_up_mid_answer(url: str, *, headers: dict, body: dict, token_marker: str) -> int:
    """Stream `body` to `url`, read until the answer's first words arrive, check the engine is writing, and hang
    up; then the engine's slot must be free within FREED_WITHIN_S, having written only a few more tokens (not the
    rest of the answer), and write nothing more after that. Returns the last request record's pk before the
    request that was cut off.

    An answer that the engine ends by itself before the client leaves (SmolLM2 may stop early where the path cannot
    ask for ignore_eos) proves nothing either way: it must be seen whole, to its end, and is tried again."""
    ended_early = []
    for _ in range(ATTEMPTS):
        wait_for(lambda: busy_slots() == 0, timeout=60, what="the engine to finish earlier work")
        since = _last_record_pk()
        with httpx.stream("POST", url, json=body, headers=headers, timeout=120) as response:
            assert response.status_code == 200, response.read().decode()
            received, stream = "", response.iter_text()
            for text in stream:
                received += text
                if received.count(token_marker) >= 3:
                    break
            else:
                pytest.fail(f"The stream ended before the answer was under way: {received[-500:]}")
            if busy_slots() != 1:
                rest = _rest_of(stream)
                assert "[DONE]" in rest or "event: done" in rest, (
                    f"The engine stopped writing but the stream did not end: {received[-400:]} ... {rest[-400:]}")
                ended_early.append(received[-200:] + " ... " + rest[-300:])
                wait_for(lambda: RequestRecord.objects.filter(pk__gt=since, stream=True).exists(),
                         what="the gateway's record of the answer that ended by itself")
                continue
            steps_at_hang_up = _decode_steps()
        wait_for(lambda: busy_slots() == 0, timeout=FREED_WITHIN_S, interval=0.1,
                 what="the engine's slot to be freed after the client hung up")
        steps_after = _decode_steps()
        assert steps_after - steps_at_hang_up < LONG_ANSWER_TOKENS / 4
        time.sleep(1)
        assert _decode_steps() == steps_after, "the engine went on writing after its slot was freed"
        return since
    pytest.fail(f"In {ATTEMPTS} tries the engine had always ended the answer before the client left: {ended_early}")


def _rest_of(stream, within_s: float = 15.0) -> str:
    """What a stream still sends within `within_s`: its end, where the engine stopped writing by itself."""
    rest, deadline = "", time.monotonic() + within_s
    for text in stream:
        rest += text
        if time.monotonic() > deadline:
            break
    return rest


def _cut_off_by_the_client(since_pk: int) -> RequestRecord:
    """The gateway's record of the request the engine was writing when the client left."""
    record = wait_for(lambda: RequestRecord.objects.filter(pk__gt=since_pk, stream=True).first(),
                      what="the gateway's record of the request")
    assert (record.status, record.error) == (499, "The client disconnected mid-stream.")
    return record


def _last_record_pk() -> int:
    return RequestRecord.objects.order_by("-pk").values_list("pk", flat=True).first() or 0


def test_the_gateway_stops_the_engine_when_an_openai_stream_is_abandoned(stack, live_db):
    since = _hang_up_mid_answer(f"{stack['url']}/v1/chat/completions",
                                headers={"Authorization": f"Bearer {stack['api_key']}"},
                                body=COUNTING_REQUEST, token_marker='"content"')
    _cut_off_by_the_client(since)


def _signed_in_headers(stack) -> dict:
    csrf = _get_new_csrf_string()
    return {"Cookie": f"sessionid={stack['session']}; csrftoken={csrf}", "X-CSRFToken": csrf,
            "Referer": f"{stack['url']}/"}


def test_stop_in_the_playground_stops_the_engine(stack, live_db):
    since = _hang_up_mid_answer(f"{stack['url']}/serving/playground/chat", headers=_signed_in_headers(stack),
                                body=COUNTING_REQUEST, token_marker='"content"')
    _cut_off_by_the_client(since)


def test_stop_in_the_rag_studio_chat_stops_the_engine(stack, live_db):
    since = _hang_up_mid_answer(f"{stack['url']}/rag/configs/{stack['config'].pk}/chat/stream",
                                headers=_signed_in_headers(stack), body={"query": "Start now."},
                                token_marker="event: token")
    _cut_off_by_the_client(since)


def test_a_published_apps_web_chat_stream_stops_the_engine_when_abandoned(stack, live_db):
    since = _hang_up_mid_answer(f"{stack['url']}/api/apps/counter/chat",
                                headers={"Authorization": f"Bearer {stack['app_key']}"},
                                body={"query": "Start now.", "stream": True}, token_marker="event: token")
    _cut_off_by_the_client(since)


def test_a_published_apps_openai_stream_stops_the_engine_when_abandoned(stack, live_db):
    since = _hang_up_mid_answer(f"{stack['url']}/api/apps/counter/v1/chat/completions",
                                headers={"Authorization": f"Bearer {stack['app_key']}"},
                                body={"model": "counter", "stream": True,
                                      "messages": [{"role": "user", "content": "Start now."}]},
                                token_marker='"content"')
    _cut_off_by_the_client(since)
