"""How much of real-world OpenAPI and Swagger documents the spec import makes into tools: per document its operations,
the tools made, the operations skipped and the problems repaired (read leniently, as the import does by default),
then the share of all operations imported. tests/workbridge/test_spec_corpus.py asserts that share (at least 95%)
on the same documents.

    .venv/bin/python -m bench.spec_corpus [--list]    (--list: every skipped operation and repair, with its reason)

The documents are made here, without network, from what the project installs:
- Swagger 2.0: the Swagger Petstore (shipped in jsonschema's benchmark data); an httpbin-style API written for
  flasgger the way httpbin's own docstrings are (`type: int`, path parameters not marked required, TRACE, fields
  the format does not have); two of this platform's REST apps described by drf-yasg.
- OpenAPI 3.0: this platform's /api/schema/ (drf-spectacular); a notes API written for flasgger in OpenAPI 3 mode;
  the gateway and app API description of bench/helpers/gateway_api.py.
- OpenAPI 3.1: this platform's schema as drf-spectacular writes 3.1; the OpenAI-compatible server of
  llama-cpp-python and Ray's sandbox API (both FastAPI apps shipped in those packages); a shop API written for
  FastAPI (forms, uploads, cookies, headers, enums, nested models).

Self-contained: Django is set up on a temporary data dir (no database is touched).
"""

import argparse
import json
import logging
import os
import tempfile
import warnings
from dataclasses import dataclass
from importlib import resources

from bench.helpers.gateway_api import GATEWAY_AND_APPS

BASE_URL = "https://api.example.com"  # every document is read as if it described this host


@dataclass
class Document:
    name: str
    text: str

    @property
    def version(self) -> str:
        document = json.loads(self.text)
        return f"{'Swagger' if 'swagger' in document else 'OpenAPI'} {document.get('swagger') or document['openapi']}"


@dataclass
class Tally:
    document: Document
    imported: list  # ToolDrafts
    skipped: list[dict]
    repaired: list[dict]

    @property
    def operations(self) -> int:
        return len(self.imported) + len(self.skipped)


def measure(document: Document) -> Tally:
    from workbridge.importers import openapi

    reading = openapi.read_spec(document.text, base_url=BASE_URL)
    return Tally(document=document, imported=reading.drafts, skipped=reading.skipped, repaired=reading.repaired)


def documents() -> list[Document]:
    return [petstore(), httpbin_style(), *platform_by_drf_yasg("workbridge", "rag_studio"), platform_schema("3.0.3"),
            flasgger_notes(),
            Document("AI Factory gateway and app API (bench/helpers/gateway_api.py)", json.dumps(GATEWAY_AND_APPS)),
            platform_schema("3.1.0"), llama_cpp_server(), ray_sandbox(), fastapi_shop()]


def petstore() -> Document:
    """The Petstore as petstore.swagger.io served it, kept by jsonschema to benchmark Swagger 2.0 validation."""
    data = resources.files("jsonschema") / "benchmarks" / "issue232" / "issue.json"
    return Document("Swagger Petstore (jsonschema's benchmark data)",
                    json.dumps(json.loads(data.read_text())[0]["tests"][0]["data"]))


def platform_schema(version: str) -> Document:
    """What /api/schema/ serves (drf-spectacular), in OpenAPI 3.0.3 as configured or in 3.1."""
    from drf_spectacular.drainage import GENERATOR_STATS
    from drf_spectacular.generators import SchemaGenerator
    from drf_spectacular.renderers import OpenApiJsonRenderer
    from drf_spectacular.settings import patched_settings

    with patched_settings({"OAS_VERSION": version}), GENERATOR_STATS.silence():  # its naming advice, not ours
        schema = SchemaGenerator().get_schema(request=None, public=True)
    return Document(f"AI Factory /api/schema/ (drf-spectacular, {version})",
                    OpenApiJsonRenderer().render(schema, renderer_context={}).decode())


def platform_by_drf_yasg(*apps: str) -> list[Document]:
    """Swagger 2.0 of some of this platform's REST apps, one document each (drf-yasg refuses the whole API: two
    apps have a JobSerializer)."""
    from importlib import import_module

    from django.urls import include, path

    with warnings.catch_warnings(action="ignore", category=DeprecationWarning):  # its validator's RefResolver
        from drf_yasg import openapi
        from drf_yasg.codecs import OpenAPICodecJson
        from drf_yasg.generators import OpenAPISchemaGenerator

    made = []
    quiet = logging.getLogger("drf_yasg")
    was = quiet.level
    quiet.setLevel(logging.CRITICAL)  # each view that needs a signed-in request would log a traceback
    try:
        for app in apps:
            generator = OpenAPISchemaGenerator(
                openapi.Info(title=f"AI Factory {app}", default_version="0.1.0"), url=BASE_URL,
                patterns=[path("api/", include(import_module(f"{app}.urls").api_urlpatterns))])
            schema = generator.get_schema(request=None, public=True)
            made.append(Document(f"AI Factory {app} API (drf-yasg)",
                                 OpenAPICodecJson(validators=[]).encode(schema).decode()))
    finally:
        quiet.setLevel(was)
    return made


def llama_cpp_server() -> Document:
    from fastapi import FastAPI
    from llama_cpp.server.app import router

    app = FastAPI(title="llama-cpp-python server")
    app.include_router(router)
    return Document("llama-cpp-python's OpenAI-compatible server (FastAPI)", json.dumps(app.openapi()))


def ray_sandbox() -> Document:
    from ray.experimental.sandbox.http.app import create_app

    app = create_app(handle_resolver=object())  # the resolver is only used by requests, none of which are made
    return Document("Ray's sandbox API (FastAPI)", json.dumps(app.openapi()))


def fastapi_shop() -> Document:
    from enum import Enum
    from typing import Annotated

    from fastapi import Body, Cookie, FastAPI, Form, Header, Path, Query, UploadFile
    from pydantic import BaseModel, Field

    class Size(str, Enum):
        small = "small"
        large = "large"

    class Address(BaseModel):
        street: str
        city: str
        postcode: str | None = None

    class Order(BaseModel):
        sku: str = Field(min_length=1)
        quantity: int = Field(1, ge=1)
        size: Size = Size.small
        gift_note: str | None = None
        ship_to: Address | None = None
        tags: list[str] = []

    class PlacedOrder(Order):
        id: int

    app = FastAPI(title="Shop", version="2.1.0", servers=[{"url": "https://shop.example.com/api"}])

    @app.get("/orders")
    def list_orders(status: Annotated[str | None, Query(pattern="^(open|shipped)$")] = None, page: int = 1,
                    x_request_id: Annotated[str | None, Header()] = None) -> list[PlacedOrder]: ...

    @app.post("/orders", status_code=201)
    def place_order(order: Order) -> PlacedOrder: ...

    @app.post("/orders/bulk", status_code=201)
    def place_orders(orders: list[Order]) -> list[PlacedOrder]: ...

    @app.get("/orders/{order_id}")
    def get_order(order_id: Annotated[int, Path(ge=1)]) -> PlacedOrder: ...

    @app.put("/orders/{order_id}")
    def replace_order(order_id: int, order: Order) -> PlacedOrder: ...

    @app.patch("/orders/{order_id}")
    def note_order(order_id: int, gift_note: Annotated[str, Body(embed=True)]) -> PlacedOrder: ...

    @app.delete("/orders/{order_id}", status_code=204)
    def cancel_order(order_id: int, reason: str | None = None) -> None: ...

    @app.post("/orders/{order_id}/receipt")
    def attach_receipt(order_id: int, receipt: UploadFile) -> dict: ...

    @app.get("/search")
    def search(q: str, tags: Annotated[list[str] | None, Query()] = None, size: Size | None = None) -> list[Order]: ...

    @app.post("/login")
    def login(username: Annotated[str, Form()], password: Annotated[str, Form()]) -> dict: ...

    @app.get("/cart")
    def cart(session: Annotated[str, Cookie()]) -> dict: ...

    @app.api_route("/health", methods=["GET", "HEAD"])
    def health() -> dict: ...

    with warnings.catch_warnings(action="ignore"):  # FastAPI warns that GET and HEAD /health share an operationId
        return Document("A shop API (FastAPI)", json.dumps(app.openapi()))


HTTPBIN_TEMPLATE = {
    "swagger": "2.0",
    "info": {"title": "httpbin-style", "description": "A simple HTTP Request & Response Service.", "version": "1.0",
             "contact": {"responsibleOrganization": "Example", "responsibleDeveloper": "A. Developer",
                         "url": "https://example.com/"}},
    "host": "httpbin.example.com", "basePath": "/", "schemes": ["https"], "protocol": "https",
}
EVERY_METHOD = ["GET", "POST", "PUT", "DELETE", "PATCH", "TRACE"]


def httpbin_style() -> Document:
    """An API documented the way httpbin documents itself with flasgger: YAML docstrings, some parameters OpenAPI 3
    style in a Swagger 2.0 document, and one docstring for every method of a route, TRACE included."""
    from flasgger import Swagger
    from flask import Flask

    app = Flask("httpbin_style")

    @app.route("/get")
    def view_get():
        """The request's query parameters.
        ---
        tags: [HTTP Methods]
        produces: [application/json]
        responses:
          200:
            description: The request's query parameters.
        """

    @app.route("/post", methods=["POST"])
    def view_post():
        """The request's POST parameters.
        ---
        tags: [HTTP Methods]
        responses:
          200:
            description: The request's POST parameters.
        """

    @app.route("/delete", methods=["DELETE"])
    def view_delete():
        """The request's DELETE parameters.
        ---
        tags: [HTTP Methods]
        responses:
          200:
            description: The request's DELETE parameters.
        """

    @app.route("/anything", methods=EVERY_METHOD)
    @app.route("/anything/<path:anything>", methods=EVERY_METHOD)
    def view_anything(anything=None):
        """Returns anything passed in request data.
        ---
        tags: [Anything]
        responses:
          200:
            description: Anything passed in request
        """

    @app.route("/status/<codes>", methods=EVERY_METHOD)
    def view_status(codes):
        """Return status code or random status code if more than one are given
        ---
        tags: [Status codes]
        parameters:
          - in: path
            name: codes
        responses:
          200:
            description: Success
        """

    @app.route("/delay/<delay>", methods=EVERY_METHOD)
    def view_delay(delay):
        """Returns a delayed response (max of 10 seconds).
        ---
        tags: [Dynamic data]
        parameters:
          - in: path
            name: delay
            type: int
        responses:
          200:
            description: A delayed response.
        """

    @app.route("/bytes/<n>")
    def view_bytes(n):
        """Returns n random bytes generated with given seed
        ---
        tags: [Dynamic data]
        parameters:
          - in: path
            name: n
            type: int
        produces: [application/octet-stream]
        responses:
          200:
            description: Bytes.
        """

    @app.route("/links/<n>/<offset>")
    def view_links(n, offset):
        """Generate a page containing n links to other pages which do the same.
        ---
        tags: [Dynamic data]
        parameters:
          - in: path
            name: n
            type: int
          - in: path
            name: offset
            type: int
        produces: [text/html]
        responses:
          200:
            description: HTML links.
        """

    @app.route("/base64/<value>")
    def view_base64(value):
        """Decodes base64url-encoded string.
        ---
        tags: [Dynamic data]
        parameters:
          - in: path
            name: value
            type: string
            default: SFRUUEJJTiBpcyBhd2Vzb21l
        produces: [text/html]
        responses:
          200:
            description: Decoded base64 content.
        """

    @app.route("/basic-auth/<user>/<passwd>")
    def view_basic_auth(user, passwd):
        """Prompts the user for authorization using HTTP Basic Auth.
        ---
        tags: [Auth]
        parameters:
          - in: path
            name: user
            type: string
          - in: path
            name: passwd
            type: string
        responses:
          200:
            description: Successful authentication.
        """

    @app.route("/bearer")
    def view_bearer():
        """Prompts the user for authorization using bearer authentication.
        ---
        tags: [Auth]
        parameters:
          - in: header
            name: Authorization
            schema:
              type: string
        responses:
          200:
            description: Successful authentication.
        """

    @app.route("/cache")
    def view_cache():
        """Returns a 304 if an If-Modified-Since header or If-None-Match is present.
        ---
        tags: [Response inspection]
        parameters:
          - in: header
            name: If-Modified-Since
          - in: header
            name: If-None-Match
        responses:
          200:
            description: Cached response
        """

    @app.route("/etag/<etag>")
    def view_etag(etag):
        """Assumes the resource has the given etag and responds to If-None-Match and If-Match headers.
        ---
        tags: [Response inspection]
        parameters:
          - in: header
            name: If-None-Match
          - in: header
            name: If-Match
        responses:
          200:
            description: Normal response
        """

    @app.route("/response-headers", methods=["GET", "POST"])
    def view_response_headers():
        """Returns a set of response headers from the query string.
        ---
        tags: [Response inspection]
        parameters:
          - in: query
            name: freeform
            explode: true
            allowEmptyValue: true
            schema:
              type: object
              additionalProperties:
                type: string
            style: form
        responses:
          200:
            description: Response headers
        """

    @app.route("/redirect-to", methods=EVERY_METHOD)
    def view_redirect_to():
        """302/3XX Redirects to the given URL.
        ---
        tags: [Redirects]
        produces: [text/html]
        get:
          parameters:
            - in: query
              name: url
              type: string
              required: true
            - in: query
              name: status_code
              type: int
        post:
          consumes: [application/x-www-form-urlencoded]
          parameters:
            - in: formData
              name: url
              type: string
              required: true
            - in: formData
              name: status_code
              type: int
              required: false
        responses:
          302:
            description: A redirection.
        """

    Swagger(app, template=HTTPBIN_TEMPLATE)
    return Document("httpbin-style API (flasgger)", app.test_client().get("/apispec_1.json").get_data(as_text=True))


NOTES_TEMPLATE = {
    "info": {"title": "Notes", "version": "0.3"},
    "servers": [{"url": "https://notes.example.com/v1"}],
    "components": {
        "securitySchemes": {"token": {"type": "http", "scheme": "bearer"}},
        "schemas": {"Note": {"type": "object", "required": ["title"], "properties": {
            "title": {"type": "string", "maxLength": 120}, "body": {"type": "string"},
            "pinned": {"type": "bool", "default": False}, "stars": {"type": "int", "minimum": 0}}}},
    },
    "security": [{"token": []}],
}


def flasgger_notes() -> Document:
    """A notes API documented with flasgger in OpenAPI 3 mode, its hand-written schema with Python's type names."""
    from flasgger import Swagger
    from flask import Flask

    app = Flask("notes")
    app.config["SWAGGER"] = {"openapi": "3.0.2", "title": "Notes", "uiversion": 3}

    @app.get("/notes")
    def list_notes():
        """Notes, newest first.
        ---
        parameters:
          - {in: query, name: tag, schema: {type: string}}
          - {in: query, name: limit, schema: {type: integer, maximum: 100}}
        responses:
          200:
            description: Notes
        """

    @app.post("/notes")
    def write_note():
        """Write a note.
        ---
        requestBody:
          required: true
          content:
            application/json:
              schema: {$ref: '#/components/schemas/Note'}
        responses:
          201:
            description: Written
        """

    @app.get("/notes/<int:note_id>")
    def read_note(note_id):
        """One note.
        ---
        parameters:
          - {in: path, name: note_id, required: true, schema: {type: integer}}
        responses:
          200:
            description: A note
        """

    @app.put("/notes/<int:note_id>")
    def rewrite_note(note_id):
        """Rewrite a note.
        ---
        parameters:
          - {in: path, name: note_id, required: true, schema: {type: integer}}
        requestBody:
          content:
            application/json:
              schema: {$ref: '#/components/schemas/Note'}
        responses:
          200:
            description: Rewritten
        """

    @app.delete("/notes/<int:note_id>")
    def delete_note(note_id):
        """Delete a note.
        ---
        parameters:
          - {in: path, name: note_id, required: true, schema: {type: integer}}
        responses:
          204:
            description: Deleted
        """

    @app.get("/notes/search")
    def search_notes():
        """Notes whose text has the words.
        ---
        parameters:
          - {in: query, name: q, required: true, schema: {type: str}}
        responses:
          200:
            description: Notes
        """

    @app.post("/notes/<int:note_id>/attachments")
    def attach_file(note_id):
        """Attach a file to a note.
        ---
        parameters:
          - {in: path, name: note_id, required: true, schema: {type: integer}}
        requestBody:
          content:
            multipart/form-data:
              schema:
                type: object
                properties:
                  file: {type: string, format: binary}
        responses:
          201:
            description: Attached
        """

    Swagger(app, template=NOTES_TEMPLATE)
    return Document("Notes API (flasgger, OpenAPI 3 mode)",
                    app.test_client().get("/apispec_1.json").get_data(as_text=True))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--list", action="store_true", help="every skipped operation and repair, with its reason")
    args = parser.parse_args()
    os.environ.setdefault("FACTORY_DATA_DIR", tempfile.mkdtemp(prefix="spec-corpus-"))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "factory.settings")
    import django

    django.setup()
    tallies = [measure(document) for document in documents()]
    print(f"{'document':<58}{'version':<14}{'operations':>11}{'imported':>9}{'skipped':>8}{'repaired':>9}")
    for tally in tallies:
        print(f"{tally.document.name[:57]:<58}{tally.document.version:<14}{tally.operations:>11}"
              f"{len(tally.imported):>9}{len(tally.skipped):>8}{len(tally.repaired):>9}")
        for item in tally.skipped + tally.repaired if args.list else ():
            print(f"    {item['path']}: {item['reason']}")
    operations, imported = sum(t.operations for t in tallies), sum(len(t.imported) for t in tallies)
    print(f"{len(tallies)} documents: {imported} of {operations} operations imported ({imported / operations:.1%})")


if __name__ == "__main__":
    main()
