"""Tools from what a user already has: an OpenAPI 3 or Swagger 2 spec (pasted, uploaded or fetched through the egress
guard), previewed, picked and renamed, then called; and a cURL command whose credentials become secrets."""

import html
import json
import re
from http.server import BaseHTTPRequestHandler

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.test import Client

from tests.conftest import local_http_server
from workbridge.models import ApiSpec, Secret, Tool

pytestmark = pytest.mark.django_db
SPECS, TOOLS = "/api/workbridge/specs/", "/api/workbridge/tools/"

SHOP_YAML = """
openapi: 3.0.3
info: {title: Shop, version: "1.2"}
servers: [{url: /v1}]
security: [{shopAuth: []}]
paths:
  /orders/{orderId}/notes:
    parameters:
      - {name: orderId, in: path, required: true, schema: {type: string}}
    post:
      operationId: addOrderNote
      summary: Add a note to an order.
      parameters:
        - {name: "page[size]", in: query, schema: {type: integer, minimum: 1}}
        - {name: X-Request-Id, in: header, schema: {type: string}}
      requestBody:
        required: true
        content:
          application/json:
            schema: {$ref: "#/components/schemas/Note"}
      responses: {"200": {description: ok}}
  /orders:
    get:
      operationId: listOrders
      description: Orders, newest first.
      parameters:
        - {name: status, in: query, schema: {type: string, enum: [open, shipped], nullable: true}}
        - {name: tags, in: query, schema: {type: array, items: {type: string}}}
        - {name: where, in: query, schema: {type: object, additionalProperties: {type: string}}}
      responses: {"200": {description: ok}}
  /uploads:
    post:
      operationId: upload
      requestBody:
        content:
          multipart/form-data:
            schema: {type: object}
      responses: {"200": {description: ok}}
components:
  securitySchemes:
    shopAuth: {type: http, scheme: bearer}
  schemas:
    Note:
      type: object
      required: [text]
      properties:
        text: {type: string, maxLength: 200}
        pinned: {type: boolean}
"""

SWAGGER = {
    "swagger": "2.0", "info": {"title": "Legacy", "version": "1"}, "host": "legacy.example.com",
    "basePath": "/api", "schemes": ["https"],
    "securityDefinitions": {"key": {"type": "apiKey", "in": "header", "name": "X-Api-Key"}},
    "security": [{"key": []}],
    "paths": {
        "/items/{id}": {"get": {"operationId": "getItem", "parameters": [
            {"name": "id", "in": "path", "required": True, "type": "integer"}], "responses": {"200": {
                "description": "ok"}}}},
        "/items": {"post": {"operationId": "createItems", "parameters": [
            {"name": "items", "in": "body", "required": True, "schema": {
                "type": "array", "items": {"$ref": "#/definitions/Item"}}}], "responses": {"200": {
                    "description": "ok"}}}},
        "/login": {"post": {"operationId": "login", "consumes": ["application/x-www-form-urlencoded"],
                            "parameters": [{"name": "user", "in": "formData", "type": "string", "required": True}],
                            "responses": {"200": {"description": "ok"}}}}},
    "definitions": {"Item": {"type": "object", "properties": {"name": {"type": "string"}}}},
}


# What httpbin's own spec (flasgger) does wrong, in little: a YAML number for the version, a field the format does not
# have, `type: int`, a path parameter not marked required, one docstring (and operationId) for every method, TRACE.
BINS_YAML = """
swagger: 2.0
info:
  title: Bins
  version: "1"
  contact: {responsibleDeveloper: A. Developer, url: "https://example.com/"}
paths:
  /delay/{delay}:
    get:
      operationId: delay
      parameters:
        - {in: path, name: delay, type: int}
      responses: {"200": {description: A delayed answer.}}
  /anything:
    get: &anything
      operationId: anything
      responses: {"200": {description: Anything passed in the request.}}
    post: *anything
    trace: *anything
  /items:
    post:
      operationId: addItem
      parameters:
        - {in: body, name: item, required: true, schema: {$ref: "#/definitions/Item"}}
      responses: {"200": {description: ok}}
definitions:
  Item:
    type: object
    properties:
      count: {type: int}
"""


class Echo(BaseHTTPRequestHandler):
    """Answers with what it received; /openapi.yaml serves the shop spec."""

    def _answer(self) -> None:
        if self.path == "/openapi.yaml":
            body, kind = SHOP_YAML.encode(), "application/yaml"
        else:
            length = int(self.headers.get("Content-Length") or 0)
            body = json.dumps({"method": self.command, "path": self.path, "auth": self.headers.get("Authorization"),
                               "request_id": self.headers.get("X-Request-Id"),
                               "body": self.rfile.read(length).decode() if length else None}).encode()
            kind = "application/json"
        self.send_response(200)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = _answer

    def log_message(self, *args) -> None:
        pass


@pytest.fixture(scope="module")
def shop():
    with local_http_server(Echo) as port:
        yield f"http://127.0.0.1:{port}"


@pytest.fixture
def dev(make_workspace, key_client, settings):
    settings.EGRESS_ALLOW = ["127.0.0.1/32"]
    return key_client("dev", make_workspace("Acme", owner="ann", dev="developer"))


def test_a_spec_is_previewed_then_the_chosen_operations_become_tools_that_call_the_api(shop, dev):
    preview = dev.post(f"{SPECS}preview/", {"text": SHOP_YAML, "base_url": shop}, format="json").json()
    by_operation = {draft["operation"]: draft for draft in preview["operations"]}

    assert preview["title"] == "Shop" and set(by_operation) == {"POST /orders/{orderId}/notes", "GET /orders"}
    assert preview["skipped"] == [{"operation": "POST /uploads", "path": "paths./uploads.post", "reason":
                                   "its body is multipart/form-data, and tools send JSON or form bodies."}]
    assert preview["repaired"] == []
    note = by_operation["POST /orders/{orderId}/notes"]
    assert note["name"] == "addOrderNote" and note["config"]["url"] == f"{shop}/v1/orders/{{orderId}}/notes"
    assert note["parameters"]["required"] == ["orderId", "text"]
    assert note["parameters"]["properties"]["text"] == {"type": "string", "maxLength": 200}
    assert note["config"]["query"] == {"page_size": "page[size]"}
    assert note["config"]["auth"] == {"type": "bearer", "secret": "SHOPAUTH"}
    assert by_operation["GET /orders"]["parameters"]["properties"]["status"]["type"] == ["string", "null"]
    assert not ApiSpec.objects.exists() and not Tool.objects.exists()

    spec = dev.post(SPECS, {"text": SHOP_YAML, "base_url": shop, "operations": [
        {"operation": "POST /orders/{orderId}/notes", "name": "add_note", "description": "Note an order."}]},
        format="json")
    assert spec.status_code == 201, spec.json()
    [tool] = spec.json()["tools"]
    assert tool["name"] == "add_note" and tool["operation"] == "POST /orders/{orderId}/notes"

    dev.post("/api/workbridge/secrets/", {"name": "SHOPAUTH", "value": "tok-123456789"}, format="json")
    called = dev.post(f"{TOOLS}{tool['id']}/invoke/", {"arguments": {
        "orderId": "A/7", "page_size": 5, "X_Request_Id": "r-1", "text": "你好", "pinned": True}},
        format="json").json()
    echoed = called["output"]
    assert called["invocation"]["status"] == "ok"
    assert echoed["path"] == "/v1/orders/A%2F7/notes?page%5Bsize%5D=5" and echoed["request_id"] == "r-1"
    assert echoed["auth"] == "Bearer ••••••••"  # sent, and masked where echoed (see test_tools)
    assert json.loads(echoed["body"]) == {"text": "你好", "pinned": True}
    assert Tool.objects.get().binding == "openapi" and Tool.objects.get().description == "Note an order."


def test_a_spec_is_fetched_through_the_egress_guard_and_uploaded_as_a_file(shop, dev, settings):
    fetched = dev.post(f"{SPECS}preview/", {"url": f"{shop}/openapi.yaml", "base_url": shop}, format="json")
    uploaded = dev.post(SPECS, {"file": SimpleUploadedFile("shop.yaml", SHOP_YAML.encode()), "base_url": shop},
                        format="multipart")
    settings.EGRESS_ALLOW = []
    refused = dev.post(f"{SPECS}preview/", {"url": f"{shop}/openapi.yaml"}, format="json")

    assert fetched.status_code == 200 and fetched.json()["title"] == "Shop"
    assert uploaded.status_code == 201 and uploaded.json()["source"] == "upload: shop.yaml"
    assert len(uploaded.json()["tools"]) == 2
    assert refused.status_code == 400 and "not a public address" in refused.json()["error"]["message"]


def test_swagger_2_operations_map_path_body_form_and_api_key_auth(dev):
    preview = dev.post(f"{SPECS}preview/", {"text": json.dumps(SWAGGER)}, format="json").json()
    drafts = {draft["name"]: draft for draft in preview["operations"]}

    assert drafts["getItem"]["config"]["url"] == "https://legacy.example.com/api/items/{id}"
    assert drafts["getItem"]["parameters"]["properties"]["id"] == {"type": "integer"}
    assert drafts["getItem"]["config"]["auth"] == {"type": "header", "name": "X-Api-Key", "secret": "KEY"}
    create = drafts["createItems"]
    assert create["config"]["body_arg"] == "body" and create["parameters"]["required"] == ["body"]
    assert create["parameters"]["properties"]["body"]["items"] == {"type": "object", "properties": {
        "name": {"type": "string"}}}
    assert drafts["login"]["config"]["body"] == "form" and drafts["login"]["parameters"]["required"] == ["user"]


def test_a_query_list_repeats_its_name_and_an_object_sends_each_key_as_openapi_does(shop, dev):
    spec = dev.post(SPECS, {"text": SHOP_YAML, "base_url": shop, "operations": [{"operation": "GET /orders"}]},
                    format="json").json()
    dev.post("/api/workbridge/secrets/", {"name": "SHOPAUTH", "value": "tok-123456789"}, format="json")

    called = dev.post(f"{TOOLS}{spec['tools'][0]['id']}/invoke/", {"arguments": {
        "status": "open", "tags": ["gift", "rush"], "where": {"city": "Oslo", "floor": "2"}}}, format="json").json()

    assert called["output"]["path"] == "/v1/orders?status=open&tags=gift&tags=rush&city=Oslo&floor=2"
    assert called["request"]["url"].endswith("/v1/orders?status=open&tags=gift&tags=rush&city=Oslo&floor=2")


def test_deleting_a_spec_deletes_its_tools(shop, dev):
    spec = dev.post(SPECS, {"text": SHOP_YAML, "base_url": shop}, format="json").json()
    assert Tool.objects.count() == 2
    assert dev.delete(f"{SPECS}{spec['id']}/").status_code == 204
    assert not Tool.objects.exists() and not ApiSpec.objects.exists()


BILLION_LAUGHS = "openapi: 3.0.0\n" + "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join(['*' + chr(97 + i)] * 9)}]\n" for i in range(8))


@pytest.mark.parametrize("source, message", [
    ({"text": "{{{ not: [yaml"}, "neither JSON nor YAML"),
    ({"text": "- just\n- a list\n"}, "expected an object at the top"),
    ({"text": json.dumps({"title": "x"})}, "neither an 'openapi' nor a 'swagger'"),
    ({"text": json.dumps({"openapi": "3.0.0", "paths": {}}), "strict": True}, "does not validate"),
    ({"text": json.dumps({"openapi": "3.0.0", "paths": {}})}, "it has no operations"),
    ({"text": json.dumps({"openapi": "4.0.0", "paths": {}})}, "its version is not OpenAPI 3.0, 3.1 or Swagger 2.0"),
    ({"text": json.dumps({"openapi": "3.0.0", "info": {"title": "t", "version": "1"}, "paths": {
        "/x": {"get": {"responses": {"200": {"$ref": "https://evil.example/r.json"}}}}}})},
     "refers to another document (https://evil.example/r.json)"),
    ({"text": json.dumps({"openapi": "3.0.0", "info": {"title": "t", "version": "1"}, "paths": {
        "/x": {"get": {"responses": {"200": {"description": "ok"}}}}}})}, "give the API's base URL"),
    ({"text": BILLION_LAUGHS}, "once its aliases are expanded"),
    ({"text": "openapi: 3.0.0", "url": "http://x.example/"}, "one of them"),
])
def test_a_spec_that_cannot_be_imported_is_a_400_saying_why(dev, source, message):
    response = dev.post(f"{SPECS}preview/", source, format="json")
    assert response.status_code == 400 and message in response.json()["error"]["message"], response.json()


def test_a_spec_that_does_not_validate_is_imported_with_what_was_skipped_and_repaired_listed(shop, dev):
    preview = dev.post(f"{SPECS}preview/", {"text": BINS_YAML, "base_url": shop}, format="json")
    assert preview.status_code == 200, preview.json()
    by_operation = {draft["operation"]: draft for draft in preview.json()["operations"]}

    assert set(by_operation) == {"GET /delay/{delay}", "GET /anything", "POST /anything", "POST /items"}
    assert by_operation["GET /delay/{delay}"]["parameters"] == {
        "type": "object", "properties": {"delay": {"type": "integer"}}, "required": ["delay"]}
    assert by_operation["POST /items"]["parameters"]["properties"] == {"count": {"type": "integer"}}
    assert [by_operation[key]["name"] for key in ("GET /anything", "POST /anything")] == ["anything", "anything_2"]
    assert preview.json()["skipped"] == [{"operation": "TRACE /anything", "path": "paths./anything.trace",
                                          "reason": "method not supported: tools send DELETE, GET, PATCH, POST, PUT."}]
    assert preview.json()["repaired"] == [
        {"path": "definitions.Item.properties.count.type", "reason": "'int' read as integer"},
        {"path": "info.contact.responsibleDeveloper", "reason": "not a field the format has here; ignored"},
        {"path": "paths./anything.post.operationId",
         "reason": "'anything' is also the operationId of GET /anything; the tool gets a numbered name"},
        {"path": "paths./delay/{delay}.get.parameters.0", "reason": "a path parameter is always required; read as "
                                                                    "required"},
        {"path": "paths./delay/{delay}.get.parameters.0.type", "reason": "'int' read as integer"},
        {"path": "swagger", "reason": "2.0 read as '2.0'"}]

    strict = dev.post(f"{SPECS}preview/", {"text": BINS_YAML, "base_url": shop, "strict": True}, format="json")
    assert strict.status_code == 400 and "its version is not text" in strict.json()["error"]["message"]
    spec = dev.post(SPECS, {"text": BINS_YAML, "base_url": shop}, format="json")
    assert spec.status_code == 201 and len(spec.json()["tools"]) == 4
    assert ApiSpec.objects.get().document["swagger"] == 2.0  # stored as given

    tools = {tool["operation"]: tool["id"] for tool in spec.json()["tools"]}

    def call(operation: str, arguments: dict) -> dict:
        called = dev.post(f"{TOOLS}{tools[operation]}/invoke/", {"arguments": arguments}, format="json").json()
        assert called["invocation"]["status"] == "ok", called
        return called["output"]

    assert call("GET /delay/{delay}", {"delay": 3})["path"] == "/delay/3"
    assert json.loads(call("POST /items", {"count": 2})["body"]) == {"count": 2}
    # No body declared: what the operation does not place goes in the query of a GET, and as JSON in a POST's body.
    got = call("GET /anything", {"note": "hi"})
    assert got["path"] == "/anything?note=hi" and got["body"] is None
    assert call("POST /anything", {"note": "hi"})["path"] == "/anything"
    assert json.loads(call("POST /anything", {"note": "hi"})["body"]) == {"note": "hi"}
    assert call("POST /anything", {})["body"] is None


def test_the_platform_s_own_schema_imports_strictly_with_nothing_repaired(dev):
    text = dev.get("/api/schema/", {"format": "json"}).content.decode()

    strict = dev.post(f"{SPECS}preview/", {"text": text, "strict": True, "base_url": "https://factory.example"},
                      format="json")

    assert strict.status_code == 200, strict.json()
    imported, skipped = strict.json()["operations"], strict.json()["skipped"]
    assert strict.json()["repaired"] == [] and len(imported) / (len(imported) + len(skipped)) >= 0.95
    assert {item["reason"] for item in skipped} == {
        "its body is multipart/form-data, and tools send JSON or form bodies."}
    [deploy] = [draft for draft in imported if draft["operation"] == "POST /api/enhancement/jobs/{id}/deploy/"]
    assert deploy["parameters"]["properties"]["node"] == {"type": "string", "default": "",
                                                          "description": "This server's node when blank"}


def test_a_default_that_does_not_fit_its_own_schema_is_dropped_and_named_where_strict_validation_refuses(dev):
    """drf-spectacular wrote `default: ''` beside `minLength: 1` for a field that refuses blanks: openapi-spec-validator
    refuses the whole document without saying where; read leniently, the default is dropped and named."""
    body = {"content": {"application/json": {"schema": {"$ref": "#/components/schemas/DeployRequest"}}}}
    spec = {"openapi": "3.0.3", "info": {"title": "Jobs", "version": "1"},
            "paths": {"/deploy": {"post": {"operationId": "deploy", "requestBody": body,
                                           "responses": {"200": {"description": "ok"}}}}},
            "components": {"schemas": {"DeployRequest": {"type": "object", "properties": {
                "node": {"type": "string", "minLength": 1, "default": ""}}}}}}

    strict = dev.post(f"{SPECS}preview/", {"text": json.dumps(spec), "strict": True}, format="json")
    preview = dev.post(f"{SPECS}preview/", {"text": json.dumps(spec), "base_url": "https://jobs.example"},
                       format="json")

    assert strict.status_code == 400 and "'' should be non-empty" in strict.json()["error"]["message"]
    assert preview.status_code == 200, preview.json()
    assert preview.json()["repaired"] == [
        {"path": "components.schemas.DeployRequest.properties.node.default",
         "reason": "the default \"\" does not fit its own schema ('' should be non-empty); dropped"}]
    [deploy] = preview.json()["operations"]
    assert deploy["parameters"]["properties"]["node"] == {"type": "string", "minLength": 1}


def _text(page) -> str:
    """The page as a person reads it: no tags, no entities."""
    return html.unescape(re.sub(r"<[^>]+>", "", page.content.decode()))


def test_the_import_page_shows_what_was_skipped_and_repaired_and_strict_refuses(shop, dev):
    page = Client()
    page.login(username="dev", password="correct-horse-battery")

    assert "Strict: refuse a spec that does not validate" in page.get("/tools/import/openapi/").content.decode()
    preview = page.post("/tools/import/openapi/", {"text": BINS_YAML, "base_url": shop})
    shown = _text(preview)
    assert preview.status_code == 200
    assert "paths./anything.trace (TRACE /anything): method not supported" in shown
    assert "6 problems the spec does not validate on" in shown
    assert "definitions.Item.properties.count.type: 'int' read as integer" in shown
    refused = page.post("/tools/import/openapi/", {"text": BINS_YAML, "base_url": shop, "strict": "on"}, follow=True)
    assert "its version is not text" in _text(refused)
    imported = page.post("/tools/import/openapi/", {"step": "import", "text": BINS_YAML, "base_url": shop,
                                                    "pick_0": "on", "name_0": "wait_a_bit"}, follow=True)
    assert "Imported Bins: 1 tool(s)." in _text(imported)
    assert Tool.objects.get().name == "wait_a_bit"


def test_a_curl_command_becomes_an_http_tool_whose_values_are_defaults_and_its_token_a_secret(shop, dev):
    command = (f"curl -sS -X POST '{shop}/orders?dry_run=true&limit=5' \\\n"
               "  -H 'Authorization: Bearer tok-SECRET-98765' -H 'Accept: application/json' \\\n"
               "  --data-raw '{\"sku\": \"A-1\", \"qty\": 2, \"gift\": {\"note\": \"hi\"}}'")

    preview = dev.post(f"{TOOLS}from-curl/", {"command": command, "preview": True}, format="json").json()
    assert preview["secrets"] == ["P_127_0_0_1_TOKEN"]
    assert "tok-SECRET" not in json.dumps(preview) and not Tool.objects.exists()
    # Every value is an optional argument's default; the query's stay text, the JSON body's keep their JSON type.
    assert "required" not in preview["parameters"]
    assert preview["parameters"]["properties"] == {
        "dry_run": {"type": "string", "default": "true"}, "limit": {"type": "string", "default": "5"},
        "sku": {"type": "string", "default": "A-1"}, "qty": {"type": "number", "default": 2},
        "gift": {"type": "object", "properties": {"note": {"type": "string"}}, "default": {"note": "hi"}}}
    assert preview["config"]["query"] == {"dry_run": "dry_run", "limit": "limit"}

    tool = dev.post(f"{TOOLS}from-curl/", {"command": command, "name": "place_order"}, format="json").json()
    called = dev.post(f"{TOOLS}{tool['id']}/invoke/", {"arguments": {
        "limit": "2", "sku": "B-2", "qty": 2.5, "gift": {"note": "生日快乐", "wrap": True}}}, format="json").json()

    echoed = called["output"]
    assert called["invocation"]["status"] == "ok", called
    assert echoed["path"] == "/orders?limit=2" and echoed["auth"] == "Bearer ••••••••"
    assert json.loads(echoed["body"]) == {"sku": "B-2", "qty": 2.5, "gift": {"note": "生日快乐", "wrap": True}}
    assert Secret.objects.get().value == "tok-SECRET-98765" and "tok-SECRET" not in json.dumps(called["request"])


def test_a_curl_with_a_user_and_form_data_uses_basic_auth_and_a_form_body(dev):
    draft = dev.post(f"{TOOLS}from-curl/", {"preview": True, "command":
                     "curl -u alice:pw-secret-1 -d name=Li -d age=30 https://crm.example.com/people"},
                     format="json").json()
    assert draft["config"]["method"] == "POST" and draft["config"]["body"] == "form"
    assert draft["config"]["auth"] == {"type": "basic", "username": "alice", "secret": "CRM_EXAMPLE_COM_PASSWORD"}
    assert draft["parameters"]["properties"]["age"] == {"type": "string", "default": "30"}


@pytest.mark.parametrize("command, message", [
    ("wget https://x.example/", "not a curl command"),
    ("curl 'https://x.example/", "does not split into words"),
    ("curl -F file=@report.pdf https://x.example/upload", "-F (a multipart form (file upload))"),
    ("curl -X POST", "has no URL"),
    ("curl --frobnicate https://x.example/", "--frobnicate is not one"),
    ("curl ftp://x.example/file", "is not an http(s) URL"),
])
def test_a_command_that_is_not_one_curl_request_is_a_400_saying_why(dev, command, message):
    response = dev.post(f"{TOOLS}from-curl/", {"command": command}, format="json")
    assert response.status_code == 400 and message in response.json()["error"]["message"], response.json()
