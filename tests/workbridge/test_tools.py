"""HTTP tools: defined through the API, versioned, called with checked arguments through the egress guard with
secrets from the workspace, every call recorded with secrets masked, and handed to LangChain."""

import hashlib
import json
import time
from http.server import BaseHTTPRequestHandler

import pytest
from django.test import Client

from assets.models import Asset
from tests.conftest import local_http_server
from workbridge.models import Invocation

pytestmark = pytest.mark.django_db
TOOLS, SECRETS = "/api/workbridge/tools/", "/api/workbridge/secrets/"
TOKEN = "tok-SECRET-4242-abcdef"


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


class Echo(BaseHTTPRequestHandler):
    """Answers with what it received; /orders/missing is a 404 and /slow takes 2 s."""

    def _echo(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        if self.path.startswith("/slow"):
            time.sleep(2)
        received = {"auth": self.headers.get("Authorization"), "key": self.headers.get("X-Api-Key")}
        body = json.dumps({"method": self.command, "path": self.path, **received,
                           # What the server really got, as a digest: the echoed values come back masked.
                           "received_sha256": {name: value and _sha256(value) for name, value in received.items()},
                           "request_id": self.headers.get("X-Request-Id"),
                           "body": self.rfile.read(length).decode() if length else None}).encode()
        self.send_response(404 if "missing" in self.path else 200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = _echo

    def log_message(self, *args) -> None:
        pass


@pytest.fixture(scope="module")
def shop():
    with local_http_server(Echo) as port:
        yield f"http://127.0.0.1:{port}"


@pytest.fixture
def acme(make_workspace, settings):
    settings.EGRESS_ALLOW = ["127.0.0.1/32"]
    return make_workspace("Acme", owner="ann", dev="developer", viewer="viewer")


@pytest.fixture
def dev(acme, key_client):
    client = key_client("dev", acme)
    assert client.post(SECRETS, {"name": "SHOP_TOKEN", "value": TOKEN}, format="json").status_code == 201
    return client


def _note_tool(shop: str, **config) -> dict:
    return {"name": "add_note", "description": "Add a note to an order.",
            "parameters": {"type": "object", "required": ["order_id", "text"], "properties": {
                "order_id": {"type": "string"}, "text": {"type": "string", "maxLength": 200},
                "notify": {"type": "boolean"}}},
            "config": {"method": "POST", "url": f"{shop}/orders/{{order_id}}/notes", "query": ["notify"],
                       "auth": {"type": "bearer", "secret": "SHOP_TOKEN"}, **config}}


def test_a_call_fills_the_url_query_and_body_and_sends_the_secret_the_record_never_shows_it(shop, dev):
    tool = dev.post(TOOLS, _note_tool(shop), format="json").json()

    called = dev.post(f"{TOOLS}{tool['id']}/invoke/", {"arguments": {
        "order_id": "A 7/1", "text": "你好 world", "notify": True}}, format="json").json()

    echoed = called["output"]
    assert echoed["method"] == "POST" and echoed["path"] == "/orders/A%207%2F1/notes?notify=true"
    assert echoed["received_sha256"]["auth"] == _sha256(f"Bearer {TOKEN}")
    # The service echoed the secret: the invoke API's answer shows it masked, like the record.
    assert echoed["auth"] == "Bearer ••••••••" and json.loads(echoed["body"]) == {"text": "你好 world"}
    assert called["invocation"]["status"] == "ok" and called["invocation"]["http_status"] == 200
    assert called["request"]["headers"]["Authorization"] == "Bearer ••••••••"
    record = Invocation.objects.get()
    assert TOKEN not in json.dumps([record.arguments, record.result_excerpt, record.error, called["request"]])
    assert "••••••••" in record.result_excerpt and record.caller == "api" and record.latency_ms > 0


def test_secrets_are_shown_masked_and_a_header_or_query_key_is_masked_too(shop, dev):
    listed = dev.get(SECRETS).json()["results"]
    assert listed == [{"id": listed[0]["id"], "name": "SHOP_TOKEN", "masked": "••••••••cdef",
                       "updated_at": listed[0]["updated_at"]}]
    header = dev.post(TOOLS, _note_tool(shop, auth={"type": "header", "name": "X-Api-Key", "secret": "SHOP_TOKEN"}),
                      format="json").json()
    called = dev.post(f"{TOOLS}{header['id']}/invoke/", {"arguments": {"order_id": "1", "text": "x"}},
                      format="json").json()
    assert called["output"]["received_sha256"]["key"] == _sha256(TOKEN)
    assert called["output"]["key"] == "••••••••" and called["request"]["headers"]["X-Api-Key"] == "••••••••"


def test_arguments_go_out_under_their_wire_names_in_the_query_and_headers_and_one_can_be_the_whole_body(shop, dev):
    """What an imported spec needs: `page[size]` is not an argument name, a header parameter, an array body."""
    tool = dev.post(TOOLS, {
        "name": "tag_orders", "description": "Tag orders.",
        "parameters": {"type": "object", "required": ["orders"], "properties": {
            "page_size": {"type": "integer"}, "request_id": {"type": "string"},
            "orders": {"type": "array", "items": {"type": "string"}}}},
        "config": {"method": "POST", "url": f"{shop}/orders/tags", "query": {"page_size": "page[size]"},
                   "header_args": {"request_id": "X-Request-Id"}, "body_arg": "orders"}}, format="json").json()

    echoed = dev.post(f"{TOOLS}{tool['id']}/invoke/", {"arguments": {
        "page_size": 5, "request_id": "req-1", "orders": ["A1", "B2"]}}, format="json").json()["output"]

    assert echoed["path"] == "/orders/tags?page%5Bsize%5D=5" and echoed["request_id"] == "req-1"
    assert json.loads(echoed["body"]) == ["A1", "B2"]


@pytest.mark.parametrize("change, message", [
    ({"name": "add note"}, "function name"),
    ({"description": " "}, "may not be blank"),
    ({"parameters": {"type": "object", "properties": {"x": {"type": "nonsense"}}}}, "not a valid JSON Schema"),
    ({"parameters": {"type": "array"}}, "of type object"),
    ({"config": {"method": "FETCH", "url": "http://x.example/"}}, "'method' must be one of"),
    ({"config": {"method": "GET", "url": "ftp://x.example/"}}, "'url' must be an http(s) URL"),
    ({"config": {"method": "GET", "url": "http://[::1/"}}, "'url' must be an http(s) URL"),
    ({"config": {"method": "GET", "url": "http://x.example/{nope}"}}, "not a required argument"),
    ({"config": {"method": "GET", "url": "http://x.example/", "body": "json"}}, "'none' for GET"),
    ({"config": {"method": "GET", "url": "http://x.example/", "auth": {"type": "bearer"}}}, "'auth.secret'"),
    ({"timeout_s": 0}, "The timeout must be within"),
    ({"config": {"method": "GET", "url": "http://x.example/", "query": {"nope": "q"}}}, "'query' must map"),
    ({"config": {"method": "GET", "url": "http://x.example/", "header_args": {"text": ""}}}, "'header_args' must map"),
    ({"config": {"method": "POST", "url": "http://x.example/", "body_arg": "nope"}}, "'body_arg' must name"),
    ({"binding": "openapi"}, "has a spec exactly when"),
    ({"binding": "mcp", "config": {"tool": "x"}}, "has a mcp_server exactly when"),
])
def test_a_tool_that_cannot_work_is_refused_when_saved(shop, dev, change, message):
    response = dev.post(TOOLS, _note_tool(shop) | change, format="json")
    assert response.status_code == 400 and message in response.json()["error"]["message"]


@pytest.mark.parametrize("arguments, message", [
    ({"order_id": "1"}, "'text' is a required property"),
    ({"order_id": "1", "text": "x" * 201}, "at text: "),
    ({"order_id": 1, "text": "x"}, "at order_id: 1 is not of type 'string'"),
])
def test_arguments_that_break_the_schema_are_a_400_and_nothing_is_sent(shop, dev, arguments, message):
    tool = dev.post(TOOLS, _note_tool(shop), format="json").json()
    response = dev.post(f"{TOOLS}{tool['id']}/invoke/", {"arguments": arguments}, format="json")
    assert response.status_code == 400 and message in response.json()["error"]["message"]
    assert not Invocation.objects.exists()


def test_error_statuses_timeouts_and_refused_hosts_are_failed_invocations_with_the_reason(shop, dev, settings):
    slow = dev.post(TOOLS, _note_tool(shop, url=f"{shop}/slow/{{order_id}}") | {"name": "slow", "timeout_s": 0.5},
                    format="json").json()
    tool = dev.post(TOOLS, _note_tool(shop), format="json").json()

    missing = dev.post(f"{TOOLS}{tool['id']}/invoke/", {"arguments": {"order_id": "missing", "text": "x"}},
                       format="json").json()
    timed_out = dev.post(f"{TOOLS}{slow['id']}/invoke/", {"arguments": {"order_id": "1", "text": "x"}},
                         format="json").json()
    settings.EGRESS_ALLOW = []
    refused = dev.post(f"{TOOLS}{tool['id']}/invoke/", {"arguments": {"order_id": "1", "text": "x"}},
                       format="json").json()

    assert (missing["invocation"]["status"], missing["invocation"]["error"]) == ("failed", "POST answered 404")
    assert "did not answer within 0.5 s" in timed_out["invocation"]["error"]
    assert "127.0.0.1, which is not a public address" in refused["invocation"]["error"]
    failed = dev.get(f"{TOOLS}{tool['id']}/invocations/?status=failed").json()["results"]
    assert len(failed) == 2


def test_each_change_is_a_version_and_viewers_only_read(shop, dev, acme):
    tool = dev.post(TOOLS, _note_tool(shop), format="json").json()
    dev.put(f"{TOOLS}{tool['id']}/", _note_tool(shop) | {"description": "Add a note to an order, briefly."},
            format="json")
    viewer = Client()
    viewer.login(username="viewer", password="correct-horse-battery")

    assert Asset.objects.get(kind="tool", ref_id=str(tool["id"])).latest_version == 2
    assert viewer.get(TOOLS).json()["results"][0]["name"] == "add_note"
    assert viewer.post(f"{TOOLS}{tool['id']}/invoke/", {"arguments": {"order_id": "1", "text": "x"}},
                       content_type="application/json").status_code == 403
    assert dev.post(TOOLS, _note_tool(shop), format="json").status_code == 409
    assert dev.delete(f"{TOOLS}{tool['id']}/").status_code == 204 and not Asset.objects.exists()


def test_langchain_gets_the_tools_and_failures_come_back_as_messages(shop, dev, acme):
    from django.contrib.auth import get_user_model

    from accounts.services import Actor
    from workbridge.langchain_tools import as_langchain_tools
    from workbridge.models import Tool

    dev.post(TOOLS, _note_tool(shop), format="json")
    actor = Actor(user=get_user_model().objects.get(username="dev"))
    [note] = as_langchain_tools(actor=actor, tools=Tool.objects.filter(workspace=acme), caller="agent:test")

    done = json.loads(note.invoke({"order_id": "9", "text": "shipped"}))
    broken = note.invoke({"order_id": "9"})
    missing = note.invoke({"order_id": "missing", "text": "x"})

    assert note.name == "add_note" and note.args["order_id"] == {"type": "string"}
    assert done["path"] == "/orders/9/notes" and broken.startswith("Tool error: The arguments do not fit")
    assert missing == "Tool error: POST answered 404"
    assert Invocation.objects.filter(caller="agent:test").count() == 2


def test_another_workspace_cannot_see_call_change_or_delete_the_tools_and_secrets(shop, dev, make_workspace,
                                                                                  key_client):
    tool = dev.post(TOOLS, _note_tool(shop), format="json").json()
    secret = dev.get(SECRETS).json()["results"][0]
    stranger = key_client("zed", make_workspace("Other", owner="zed"))

    assert stranger.get(TOOLS).json()["results"] == [] and stranger.get(SECRETS).json()["results"] == []
    assert stranger.get(f"{TOOLS}{tool['id']}/").status_code == 404
    assert stranger.post(f"{TOOLS}{tool['id']}/invoke/", {"arguments": {"order_id": "1", "text": "x"}},
                         format="json").status_code == 404
    assert stranger.put(f"{TOOLS}{tool['id']}/", _note_tool(shop), format="json").status_code == 404
    assert stranger.delete(f"{TOOLS}{tool['id']}/").status_code == 404
    assert stranger.delete(f"{SECRETS}{secret['id']}/").status_code == 404
    assert not Invocation.objects.exists() and dev.get(f"{TOOLS}{tool['id']}/").status_code == 200


def test_an_answer_that_breaks_the_output_schema_is_a_failed_call_and_a_bad_output_schema_a_400(shop, dev):
    checked = dev.post(TOOLS, _note_tool(shop) | {"output_schema": {
        "type": "object", "required": ["note_id"], "properties": {"note_id": {"type": "integer"}}}}, format="json")
    assert checked.status_code == 201, checked.json()
    bad = dev.post(TOOLS, _note_tool(shop) | {"name": "other", "output_schema": {"type": "nope"}}, format="json")
    assert bad.status_code == 400 and "'output_schema' is not a valid JSON Schema" in bad.json()["error"]["message"]

    called = dev.post(f"{TOOLS}{checked.json()['id']}/invoke/", {"arguments": {"order_id": "1", "text": "x"}},
                      format="json").json()

    assert called["invocation"]["status"] == "failed"
    assert "does not fit the tool's output schema at the answer: 'note_id' is a required property" in \
        called["invocation"]["error"]
