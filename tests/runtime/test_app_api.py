"""The public API of published apps without a model behind it: who may call, what a bad call gets back,
retrieval, feedback into eval sets, the web chat's origin rules and rate limits. Calls go through the server's
own front end (factory/asgi.py, which serves /api/apps/ past Django), except where Django's view is the point."""

import asyncio
import json

import httpx
import pytest
from django.core.signals import request_started
from django.test import Client

from factory.asgi import application
from rag_studio import services as rag_services
from rag_studio.models import DocumentStatus, EvalSetSource
from rag_studio.pipeline.ingestion import ingest
from runtime import services
from runtime.models import Channel, Trace, TraceStatus
from tests.conftest import wait_for
from tests.rag_studio.conftest import SAMPLE_FILES, sample
from tests.runtime.conftest import save_config

pytestmark = pytest.mark.django_db(transaction=True)


def call(method: str, path: str, *, key: str | None = None, content: bytes = b"", origin: str | None = None,
         host: str = "testserver") -> httpx.Response:
    headers = {"Host": host, "Content-Type": "application/json"}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    if origin:
        headers["Origin"] = origin

    async def send() -> httpx.Response:
        transport = httpx.ASGITransport(app=application)
        async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as client:
            return await client.request(method, path, content=content, headers=headers)

    return asyncio.run(send())


def post(path: str, body=None, *, raw: bytes | None = None, **options) -> httpx.Response:
    return call("POST", path, content=raw if raw is not None else json.dumps(body or {}).encode(), **options)


def error_of(response) -> tuple[int, str]:
    return response.status_code, response.json()["error"]["message"]


def test_each_bad_call_gets_its_own_clear_status(ann, app, app_key, config):
    other = services.publish_app(actor=ann, config=config, slug="other")
    other_key = services.create_app_key(actor=ann, app=other, name="other").secret
    revoked = services.create_app_key(actor=ann, app=app, name="old")
    services.revoke_app_key(actor=ann, app_key=revoked.app_key)
    chat = "/api/apps/handbook/chat"

    assert error_of(post("/api/apps/nope/chat", {"query": "hi"}, key=app_key)) == (404, "No app named 'nope'.")
    status, message = error_of(post(chat, {"query": "hi"}))
    assert status == 401 and "Missing app key" in message
    assert error_of(post(chat, {"query": "hi"}, key="afa_123.nope"))[0] == 401
    assert error_of(post(chat, {"query": "hi"}, key=revoked.secret)) == (401, "This app key has been revoked.")
    status, message = error_of(post(chat, {"query": "hi"}, key=other_key))
    assert status == 403 and "another app" in message
    for body, expected in (({"query": ""}, "non-empty"), ({"query": "x" * 4001}, "limit is 4000"),
                           ({}, "non-empty"), ({"query": "hi", "stream": "yes"}, "'stream'")):
        status, message = error_of(post(chat, body, key=app_key))
        assert status == 400 and expected in message, (body, message)
    status, message = error_of(post(chat, raw=b"{not json", key=app_key))
    assert status == 400 and "not valid JSON" in message
    status, message = error_of(post(chat, {"query": "hi", "conversation_id": "0" * 32}, key=app_key))
    assert status == 404 and "Conversation" in message

    services.update_app(actor=ann, app=app, enabled=False)
    status, message = error_of(post(chat, {"query": "hi"}, key=app_key))
    assert status == 403 and "disabled" in message
    assert not Trace.objects.exists()


def test_the_openai_endpoint_answers_errors_in_openais_format(app, app_key):
    base = "/api/apps/handbook/v1"
    cases = [
        (post(f"{base}/chat/completions", {"messages": []}, key=app_key), 400, "invalid_request_error"),
        (post(f"{base}/chat/completions", {"messages": [{"role": "user", "content": 5}]}, key=app_key), 400,
         "invalid_request_error"),
        (post(f"{base}/chat/completions", {"messages": [{"role": "assistant", "content": "hi"}]}, key=app_key),
         400, "invalid_request_error"),
        (post(f"{base}/chat/completions", raw=b"[1,", key=app_key), 400, "invalid_request_error"),
        (post(f"{base}/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}), 401,
         "authentication_error"),
        (post(f"{base}/embeddings", {"input": "x"}, key=app_key), 404, "not_found_error"),
    ]
    for response, status, kind in cases:
        error = response.json()["error"]
        assert response.status_code == status and error["type"] == kind, error
        assert error["message"] and "code" in error and "param" in error
    models = call("GET", f"{base}/models", key=app_key).json()
    assert [m["id"] for m in models["data"]] == ["handbook"]


def test_retrieve_shows_what_the_pinned_config_finds_and_is_traced(ann, kb, smollm2):
    # Committed uploads may be taken by a Celery worker another test module started; either way they get indexed.
    for outcome in rag_services.upload_documents(actor=ann, kb=kb, uploads=[sample(n) for n in SAMPLE_FILES]):
        ingest(outcome.document.pk, "pytest")
    wait_for(lambda: kb.documents.filter(status=DocumentStatus.INDEXED).count() == 3, timeout=120,
             what="the samples to be indexed")
    app = services.publish_app(actor=ann, config=save_config(ann, kb), slug="handbook")
    app_key = services.create_app_key(actor=ann, app=app, name="intranet").secret
    response = post("/api/apps/handbook/retrieve", {"query": "How many days of annual leave?"}, key=app_key)
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["hits"][0]["document"] == "northwind-employee-handbook.pdf"
    assert set(body["hits"][0]["scores"]) == {"dense", "keyword", "fused", "rerank"}
    assert body["timings_ms"]["retrieval"] > 0
    trace = Trace.objects.get(public_id=body["message_id"])
    assert (trace.channel, trace.status, trace.app_key.name) == (Channel.RETRIEVE, TraceStatus.OK, "intranet")
    assert trace.hits[0]["document"] == "northwind-employee-handbook.pdf" and trace.latency_ms > 0


def test_the_server_answers_the_app_api_past_django_with_the_same_checks(app, app_key, settings):
    handled_by_django = []

    def count(sender, **kwargs) -> None:
        handled_by_django.append(sender)

    request_started.connect(count)
    try:
        assert error_of(post("/api/apps/handbook/chat", {"query": ""}, key=app_key))[0] == 400
        status, message = error_of(post("/api/apps/handbook/nothing-here", key=app_key))
        assert status == 404 and "Unknown endpoint" in message
        assert error_of(call("GET", "/api/apps/", key=app_key))[0] == 404
        settings.ALLOWED_HOSTS = ["factory.example"]
        refused = post("/api/apps/handbook/chat", {"query": "hi"}, key=app_key, host="evil.example")
        assert (refused.status_code, refused.text) == (400, "Invalid host header")
        settings.ALLOWED_HOSTS = ["*"]
        settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 1000
        assert error_of(post("/api/apps/handbook/chat", {"query": "x" * 2000}, key=app_key))[0] == 413
    finally:
        request_started.disconnect(count)
    assert handled_by_django == []


def test_django_serves_the_same_api_for_runserver_wsgi_and_its_test_client(app, app_key):
    chat = Client().post("/api/apps/handbook/chat", data={"query": ""}, content_type="application/json",
                         HTTP_AUTHORIZATION=f"Bearer {app_key}")
    assert chat.status_code == 400 and chat.json() == post("/api/apps/handbook/chat", {"query": ""},
                                                           key=app_key).json()
    models = Client().get("/api/apps/handbook/v1/models", HTTP_AUTHORIZATION=f"Bearer {app_key}")
    assert [m["id"] for m in models.json()["data"]] == ["handbook"]
    unknown = Client().post("/api/apps/handbook/v1/embeddings", data={}, content_type="application/json",
                            HTTP_AUTHORIZATION=f"Bearer {app_key}")
    assert unknown.status_code == 404 and unknown.json()["error"]["type"] == "not_found_error"


def test_an_integer_of_5000_digits_is_a_400_for_a_key_and_for_the_public_web_chat_token(app, app_key, settings):
    settings.PUBLIC_URL = "http://factory.example"
    body = b'{"query": "hi", "user": ' + b"1" * 5000 + b"}"
    for key, origin in ((app_key, None), (app.widget_token, "http://factory.example")):
        status, message = error_of(post("/api/apps/handbook/chat", raw=body, key=key, origin=origin))
        assert status == 400 and "digits" in message


def test_a_key_over_its_rate_limit_gets_429_with_retry_after(ann, app):
    issued = services.create_app_key(actor=ann, app=app, name="tight", rate_limit=2)
    answers = [post("/api/apps/handbook/chat", {"query": ""}, key=issued.secret) for _ in range(3)]
    assert [a.status_code for a in answers] == [400, 400, 429]
    assert 1 <= int(answers[2].headers["Retry-After"]) <= 60
    assert "2 requests per minute" in answers[2].json()["error"]["message"]
    roomy = services.create_app_key(actor=ann, app=app, name="roomy").secret
    assert post("/api/apps/handbook/chat", {"query": ""}, key=roomy).status_code == 400


def test_the_web_chat_token_works_only_from_allowed_origins(ann, app, settings):
    # The web chat's own origin comes from settings, never from the Host header the caller chose.
    settings.PUBLIC_URL = "http://factory.example:8000/"
    services.update_app(actor=ann, app=app, allowed_origins=["http://intranet.example:8080/"])
    app.refresh_from_db()
    assert app.allowed_origins == ["http://intranet.example:8080"]
    chat, token = "/api/apps/handbook/chat", app.widget_token
    status, message = error_of(post(chat, {"query": ""}, key=token, origin="http://evil.example"))
    assert status == 403 and "http://evil.example" in message
    assert error_of(post(chat, {"query": ""}, key=token))[0] == 403  # no Origin: not a browser on the list
    allowed = post(chat, {"query": ""}, key=token, origin="http://intranet.example:8080")
    assert allowed.status_code == 400
    assert allowed.headers["Access-Control-Allow-Origin"] == "http://intranet.example:8080"
    assert post(chat, {"query": ""}, key=token, origin="http://factory.example:8000").status_code == 400
    status, message = error_of(post(chat, {"query": ""}, key=token, origin="http://testserver"))
    assert status == 403 and "http://testserver" in message
    preflight = call("OPTIONS", chat, origin="http://intranet.example:8080")
    assert preflight.status_code == 204 and "Authorization" in preflight.headers["Access-Control-Allow-Headers"]
    assert "Access-Control-Allow-Origin" not in call("OPTIONS", chat, origin="http://evil.example").headers

    services.rotate_widget_token(actor=ann, app=app)
    status, message = error_of(post(chat, {"query": ""}, key=token, origin="http://intranet.example:8080"))
    assert status == 401 and "rotated" in message


def test_the_widget_page_may_be_framed_only_by_allowed_origins(ann, app):
    services.update_app(actor=ann, app=app, allowed_origins=["https://intranet.example"])
    app.refresh_from_db()
    page = Client().get(f"/apps/handbook/widget?token={app.widget_token}")
    assert page.status_code == 200
    assert page["Content-Security-Policy"] == "frame-ancestors 'self' https://intranet.example"
    assert "X-Frame-Options" not in page
    assert Client().get("/apps/handbook/widget?token=afw_wrong").status_code == 403
    script = Client().get("/apps/handbook/embed.js")
    assert script["Content-Type"].startswith("text/javascript")
    assert "http://testserver/apps/handbook/widget" in script.content.decode()


def _trace(app, query="How many days of annual leave?", **fields) -> Trace:
    return Trace.objects.create(app=app, release=app.current_release, channel=Channel.CHAT, query=query,
                                answer="Ten days [1].", citations=[{"n": 1, "document": "handbook.pdf"}], **fields)


def test_feedback_on_an_answer_and_a_down_vote_into_an_eval_set(ann, app, app_key, kb):
    trace = _trace(app)
    feedback = "/api/apps/handbook/feedback"
    response = post(feedback, {"message_id": str(trace.public_id), "rating": "up"}, key=app_key)
    assert response.status_code == 200 and response.json()["rating"] == "up"
    response = post(feedback, {"message_id": str(trace.public_id), "rating": "down", "comment": "It is 25 days"},
                    key=app_key)
    assert response.json() == {"message_id": str(trace.public_id), "rating": "down", "comment": "It is 25 days"}
    trace.refresh_from_db()
    assert (trace.feedback.rating, trace.feedback.comment) == (-1, "It is 25 days")
    assert error_of(post(feedback, {"message_id": str(trace.public_id), "rating": "meh"}, key=app_key))[0] == 400
    status, message = error_of(post(feedback, {"message_id": "nope", "rating": "up"}, key=app_key))
    assert status == 404 and "nope" in message

    item = services.feedback_to_eval_item(actor=ann, feedback=trace.feedback, expected_answer="25 days a year.")
    assert (item.question, item.expected_answer, item.expected_sources) == (
        "How many days of annual leave?", "25 days a year.", ["handbook.pdf"])
    assert item.eval_set.source == EvalSetSource.FEEDBACK and item.eval_set.knowledge_base == kb
    again = services.feedback_to_eval_item(actor=ann, feedback=trace.feedback, expected_answer="25.",
                                           expected_sources=[])
    assert again.eval_set == item.eval_set and item.eval_set.items.count() == 2


def _widget_post(app, origin: str, client: tuple[str, int], conversation_id: str | None = None) -> httpx.Response:
    body = {"query": ""} | ({"conversation_id": conversation_id} if conversation_id else {})

    async def send() -> httpx.Response:
        transport = httpx.ASGITransport(app=application, client=client)
        async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as http:
            return await http.post("/api/apps/handbook/chat", content=json.dumps(body).encode(), headers={
                "Authorization": f"Bearer {app.widget_token}", "Origin": origin,
                "Content-Type": "application/json"})

    return asyncio.run(send())


def test_one_caller_cannot_use_up_the_web_chat_for_every_visitor(ann, app, settings):
    settings.PUBLIC_URL = "http://factory.example"
    services.update_app(actor=ann, app=app, rate_limit=2)
    app.refresh_from_db()
    noisy, visitor = ("203.0.113.7", 5000), ("198.51.100.9", 5000)

    answers = [_widget_post(app, "http://factory.example", noisy).status_code for _ in range(3)]
    assert answers == [400, 400, 429]
    assert _widget_post(app, "http://factory.example", visitor).status_code == 400


def test_the_web_chat_is_limited_per_conversation_too(ann, app, settings):
    settings.PUBLIC_URL = "http://factory.example"
    settings.WIDGET_RATE_PER_CONVERSATION = "2/minute"
    addresses = [(f"198.51.100.{n}", 5000) for n in range(1, 5)]
    statuses = [_widget_post(app, "http://factory.example", address, "c0ffee").status_code for address in addresses]
    assert statuses[:2] == [400, 400] and statuses[2] == 429
    refused = _widget_post(app, "http://factory.example", addresses[3], "c0ffee")
    assert "this conversation" in refused.json()["error"]["message"]
    assert _widget_post(app, "http://factory.example", addresses[3], "another").status_code == 400


def test_redis_down_is_a_503_with_retry_after_not_a_500(app, app_key, settings):
    settings.REDIS_URL = "redis://127.0.0.1:1/0"  # nothing listens on port 1
    response = post("/api/apps/handbook/chat", {"query": "hi"}, key=app_key)
    assert response.status_code == 503 and int(response.headers["Retry-After"]) >= 1
    assert "Redis" in response.json()["error"]["message"]
