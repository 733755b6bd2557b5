"""Issue 13, hole 11: crafted input gets a clear 4xx naming the problem, never a 500."""

import asyncio
import threading

import httpx
import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.db import IntegrityError
from django.test import Client

from accounts.models import Membership
from accounts.services import Actor, create_api_key
from factory.asgi import application
from rag_studio.evals.eval_files import EvalFileError, parse_eval_file
from tests.rag_studio.conftest import SAMPLES, presets  # noqa: F401  (the preset models, registered)


@pytest.fixture
def chat_deployment(presets, settings):  # noqa: F811
    """The deployment RAG configs name, created (never started: these requests are refused before any answer)."""
    from accounts.services import SYSTEM
    from cluster import inventory
    from cluster.services import register_node
    from serving.services import create_deployment

    node = register_node(name=settings.NODE_NAME, resources=inventory.probe())
    return create_deployment(actor=SYSTEM, workspace=None, model=presets["smollm2-135m-instruct"],
                             name="smollm2-135m-instruct", replicas=[(node, 1.0)])

BIG_INTEGER = b"1" * 5000  # past Python's 4,300-digit limit on int(): a ValueError, not a JSONDecodeError


def _post(path: str, content: bytes, key: str, origin: str | None = None) -> httpx.Response:
    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
    if origin:
        headers["Origin"] = origin

    async def send():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=application),
                                     base_url="http://testserver") as client:
            return await client.post(path, content=content, headers=headers)

    return asyncio.run(send())


@pytest.mark.django_db(transaction=True)
def test_an_integer_of_5000_digits_is_a_400_on_the_gateway(make_workspace):
    workspace = make_workspace("Acme", owner="ann")
    key = create_api_key(actor=Actor(user=workspace.memberships.get().user), workspace=workspace,
                         name="k").secret
    body = b'{"model": "x", "messages": [{"role": "user", "content": "hi"}], "max_tokens": ' + BIG_INTEGER + b"}"
    gateway = _post("/v1/chat/completions", body, key)
    assert gateway.status_code == 400 and gateway.json()["error"]["code"] == "invalid_json"
    assert "digits" in gateway.json()["error"]["message"]


def test_an_eval_file_with_a_5000_digit_integer_names_its_line():
    content = b'{"question": "q", "expected_answer": "a"}\n{"question": "q", "n": ' + BIG_INTEGER + b"}\n"
    with pytest.raises(EvalFileError) as error:
        parse_eval_file(content, "set.jsonl")
    assert "line 2" in str(error.value)


@pytest.mark.django_db
def test_a_role_that_is_not_one_of_ours_is_refused_with_a_message_and_cannot_be_stored(make_workspace):
    workspace = make_workspace("Acme", owner="ann", bob="developer")
    client = Client()
    client.login(username="ann", password="correct-horse-battery")
    page = client.post("/settings/", {"username": "bob", "role": "superadmin"}, follow=True)
    assert page.status_code == 200 and "&#x27;superadmin&#x27; is not a role" in page.content.decode()
    with pytest.raises(IntegrityError):
        Membership.objects.filter(workspace=workspace, user__username="bob").update(role="bogus")


@pytest.mark.django_db
def test_the_config_chat_stream_refuses_a_body_that_is_not_an_object_or_a_history_that_is_not_a_list(
        make_workspace, chat_deployment):
    from rag_studio import services

    workspace = make_workspace("Acme", owner="ann")
    actor = Actor(user=workspace.memberships.get().user)
    kb = services.create_knowledge_base(actor=actor, workspace=workspace, name="Docs")
    config = services.save_rag_config(actor=actor, workspace=workspace, name="QA", knowledge_base=kb,
                                      template="citations", model="smollm2-135m-instruct")
    client = Client()
    client.login(username="ann", password="correct-horse-battery")
    url = f"/rag/configs/{config.pk}/chat/stream"
    for body in (b"[1, 2]", b'{"query": "hi", "history": "not a list"}', b'{"query": "hi", "history": 7}',
                 b'{"query": ' + BIG_INTEGER + b"}"):
        response = client.post(url, data=body, content_type="application/json")
        assert response.status_code == 400, body[:40]
        assert response.json()["error"]["message"]


@pytest.mark.django_db
def test_a_broken_delimiter_escape_is_explained_on_the_page(make_workspace, presets):  # noqa: F811  (pytest fixture)
    from rag_studio import services

    workspace = make_workspace("Acme", owner="ann")
    kb = services.create_knowledge_base(actor=Actor(user=workspace.memberships.get().user), workspace=workspace,
                                        name="Docs")
    client = Client()
    client.login(username="ann", password="correct-horse-battery")
    page = client.post(f"/rag/kb/{kb.pk}/settings/", {"chunk_mode": "delimiter", "delimiter": "\\x"}, follow=True,
                       HTTP_REFERER=f"/rag/kb/{kb.pk}/")
    assert page.status_code == 200 and "broken escape" in page.content.decode()


@pytest.mark.django_db
def test_a_rag_config_posted_without_a_prompt_gets_the_default(make_workspace, key_client, chat_deployment):
    client = key_client("ann", make_workspace("Acme", owner="ann"))
    kb = client.post("/api/rag/knowledge-bases/", {"name": "Docs"}, format="json").json()["id"]
    response = client.post("/api/rag/configs/", {"name": "QA", "knowledge_base": kb,
                                                 "model": "smollm2-135m-instruct"}, format="json")
    assert response.status_code == 201 and response.json()["prompt"] == ""


@pytest.mark.django_db(transaction=True)
def test_the_same_file_uploaded_twice_at_once_is_stored_once(make_workspace, key_client, presets):  # noqa: F811  (pytest fixture)
    client = key_client("ann", make_workspace("Acme", owner="ann"))
    kb = client.post("/api/rag/knowledge-bases/", {"name": "Docs"}, format="json").json()["id"]
    faq = (SAMPLES / "northwind-support-faq.md").read_bytes()
    start, statuses = threading.Barrier(4), []

    def upload() -> None:
        start.wait()
        response = client.post(f"/api/rag/knowledge-bases/{kb}/documents/",
                               {"files": [SimpleUploadedFile("faq.md", faq)]}, format="multipart")
        statuses.append((response.status_code, response.json()[0]["status"]))

    threads = [threading.Thread(target=upload) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(statuses) == [(201, "duplicate")] * 3 + [(201, "queued")]
    assert len(client.get(f"/api/rag/knowledge-bases/{kb}/documents/").json()) == 1
