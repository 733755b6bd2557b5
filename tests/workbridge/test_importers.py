"""Tools from what a user already has: an OpenAPI 3 or Swagger 2 spec (pasted, uploaded or fetched through the egress
guard), previewed, picked and renamed, then called; and a cURL command whose credentials become secrets."""

import json
from http.server import BaseHTTPRequestHandler

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile

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
    assert preview["skipped"] == [{"operation": "POST /uploads", "reason":
                                   "its body is multipart/form-data, and tools send JSON or form bodies."}]
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
    ({"text": json.dumps({"openapi": "3.0.0", "paths": {}})}, "does not validate"),
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


def test_a_curl_command_becomes_an_http_tool_and_its_token_a_secret(shop, dev):
    command = (f"curl -sS -X POST '{shop}/orders?dry_run=true&limit=5' \\\n"
               "  -H 'Authorization: Bearer tok-SECRET-98765' -H 'Accept: application/json' \\\n"
               "  --data-raw '{\"sku\": \"A-1\", \"qty\": 2, \"gift\": {\"note\": \"hi\"}}'")

    preview = dev.post(f"{TOOLS}from-curl/", {"command": command, "preview": True}, format="json").json()
    assert preview["secrets"] == ["P_127_0_0_1_TOKEN"]
    assert "tok-SECRET" not in json.dumps(preview) and not Tool.objects.exists()
    assert preview["parameters"]["properties"]["qty"] == {"type": "integer", "examples": [2]}
    assert preview["parameters"]["properties"]["gift"]["required"] == ["note"]
    assert preview["config"]["query"] == {"dry_run": "dry_run", "limit": "limit"}

    tool = dev.post(f"{TOOLS}from-curl/", {"command": command, "name": "place_order"}, format="json").json()
    called = dev.post(f"{TOOLS}{tool['id']}/invoke/", {"arguments": {
        "dry_run": False, "limit": 1, "sku": "B-2", "qty": 3, "gift": {"note": "生日快乐"}}}, format="json").json()

    echoed = called["output"]
    assert echoed["path"] == "/orders?dry_run=false&limit=1" and echoed["auth"] == "Bearer ••••••••"
    assert json.loads(echoed["body"]) == {"sku": "B-2", "qty": 3, "gift": {"note": "生日快乐"}}
    assert Secret.objects.get().value == "tok-SECRET-98765" and "tok-SECRET" not in json.dumps(called["request"])


def test_a_curl_with_a_user_and_form_data_uses_basic_auth_and_a_form_body(dev):
    draft = dev.post(f"{TOOLS}from-curl/", {"preview": True, "command":
                     "curl -u alice:pw-secret-1 -d name=Li -d age=30 https://crm.example.com/people"},
                     format="json").json()
    assert draft["config"]["method"] == "POST" and draft["config"]["body"] == "form"
    assert draft["config"]["auth"] == {"type": "basic", "username": "alice", "secret": "CRM_EXAMPLE_COM_PASSWORD"}
    assert draft["parameters"]["properties"]["age"] == {"type": "integer", "examples": [30]}


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
