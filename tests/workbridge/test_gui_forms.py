"""The tool and MCP server forms in the GUI: a new HTTP tool starts as a GET with no auth and no body, and a save the
platform refuses comes back with everything as it was typed and the reason beside the field it is about."""

import json

import lxml.html
import pytest
from django.test import Client

from workbridge.models import McpServer, Tool

pytestmark = pytest.mark.django_db

SCHEMA = {"type": "object", "required": ["city"], "properties": {
    "city": {"type": "string", "description": "A city's name."}, "days": {"type": "integer", "default": 1}}}
TYPED = {"name": "forecast", "description": "Tomorrow's weather for a city.", "parameters": json.dumps(SCHEMA),
         "method": "POST", "url": "https://weather.example.com/forecast/{city}", "body": "json",
         "auth_type": "bearer", "auth_secret": "", "headers": "Accept: application/json", "query": "days",
         "timeout_s": "12", "max_output_bytes": "2048"}


@pytest.fixture
def signed_in(make_workspace, settings) -> Client:
    settings.EGRESS_ALLOW = []
    make_workspace("Acme", owner="ann")
    client = Client()
    client.login(username="ann", password="correct-horse-battery")
    return client


def _page(response):
    return lxml.html.fromstring(response.content.decode())


def _selected(page, name: str) -> str:
    [option] = page.xpath(f"//select[@name='{name}']/option[@selected]")
    return option.get("value") or option.text


def _error_after(page, field_xpath: str) -> str:
    """The error shown right after the field (its next sibling paragraph)."""
    [field] = page.xpath(field_xpath)
    following = field.getnext()
    assert following is not None and "field-error" in following.get("class", ""), "no error beside the field"
    return following.text_content()


def test_a_new_http_tool_starts_as_a_get_with_no_auth_and_no_body(signed_in):
    page = _page(signed_in.get("/tools/new/http/"))
    assert (_selected(page, "method"), _selected(page, "auth_type"), _selected(page, "body")) == ("GET", "none",
                                                                                                  "none")
    # The argument table and the raw schema it writes, for experts.
    assert page.xpath("//table[@class='params']") and page.xpath("//details[@class='raw-schema']//textarea")


def test_a_refused_tool_keeps_what_was_typed_and_shows_the_reason_beside_the_field(signed_in):
    response = signed_in.post("/tools/new/http/", TYPED | {"name": "forecast-tomorrow"})

    assert response.status_code == 400 and not Tool.objects.exists()
    page = _page(response)
    assert page.xpath("//input[@name='name']")[0].value == "forecast-tomorrow"
    assert "not" in _error_after(page, "//input[@name='name']") and "forecast-tomorrow" in _error_after(
        page, "//input[@name='name']")
    assert page.xpath("//textarea[@name='description']")[0].text == TYPED["description"]
    assert json.loads(page.xpath("//textarea[@name='parameters']")[0].text) == SCHEMA
    assert page.xpath("//input[@name='url']")[0].value == TYPED["url"]
    assert page.xpath("//input[@name='query']")[0].value == "days"
    assert page.xpath("//textarea[@name='headers']")[0].text.strip() == "Accept: application/json"
    assert (_selected(page, "method"), _selected(page, "auth_type"), _selected(page, "body")) == ("POST", "bearer",
                                                                                                  "json")
    assert page.xpath("//input[@name='timeout_s']")[0].value == "12"


def test_a_schema_that_is_not_json_is_refused_beside_the_raw_schema_as_typed(signed_in):
    broken = '{"type": "object", "properties": {'
    response = signed_in.post("/tools/new/http/", TYPED | {"parameters": broken})

    assert response.status_code == 400
    page = _page(response)
    assert page.xpath("//textarea[@name='parameters']")[0].text == broken
    [error] = page.xpath("//fieldset[@data-schema-editor]/p[contains(@class, 'field-error')]")
    assert "not valid JSON" in error.text_content()


def test_a_taken_name_and_a_refused_edit_keep_the_form_open_with_what_was_typed(signed_in):
    assert signed_in.post("/tools/new/http/", TYPED | {"auth_type": "none"}).status_code == 302
    taken = signed_in.post("/tools/new/http/", TYPED | {"auth_type": "none", "description": "Another."})
    assert taken.status_code == 409
    assert "already has a tool called" in _error_after(_page(taken), "//input[@name='name']")

    tool = Tool.objects.get()
    edited = signed_in.post(f"/tools/{tool.pk}/", TYPED | {"auth_type": "none", "url": "ftp://weather.example.com/",
                                                           "description": "Edited."})
    assert edited.status_code == 400
    page = _page(edited)
    assert page.xpath("//details[@id='edit-tool']")[0].get("open") is not None
    assert page.xpath("//details[@id='edit-tool']//input[@name='url']")[0].value == "ftp://weather.example.com/"
    assert page.xpath("//details[@id='edit-tool']//textarea[@name='description']")[0].text == "Edited."
    assert "'url' must be an http(s) URL" in page.xpath("//p[contains(@class, 'field-error')]")[0].text_content()
    assert Tool.objects.get().description == TYPED["description"]


def test_a_refused_mcp_server_keeps_what_was_typed_and_a_name_with_a_dash_is_accepted(signed_in, settings):
    typed = {"name": "time-zones", "transport": "http", "url": "http://127.0.0.1:9/mcp"}
    response = signed_in.post("/tools/mcp/", typed)

    assert response.status_code == 400 and not McpServer.objects.exists()
    page = _page(response)
    assert page.xpath("//input[@id='mcp-name']")[0].value == "time-zones"
    assert page.xpath("//input[@id='mcp-url']")[0].value == typed["url"]
    assert _selected(page, "transport") == "http"
    assert "not a public address" in _error_after(page, "//input[@id='mcp-url']")

    settings.EGRESS_ALLOW = ["127.0.0.1/32"]
    saved = signed_in.post("/tools/mcp/", typed)
    assert saved.status_code == 302 and McpServer.objects.get().name == "time-zones"
    bad_name = signed_in.post("/tools/mcp/", typed | {"name": "-time"})
    assert bad_name.status_code == 400
    assert "letters, digits, '_' and '-'" in _error_after(_page(bad_name), "//input[@id='mcp-name']")
