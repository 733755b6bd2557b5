"""The Work Bridge tour in Chromium: import an API's spec served on loopback (allowlisted by an admin in the GUI), pick
and rename an operation, try it with the form made from its schema; write a python tool and run it; keep a secret
that is shown masked; then see the failed call in the filtered invocation log."""

import json

import pytest
from playwright.sync_api import expect

from tests.conftest import JsonService, local_http_server
from tests.e2e.conftest import sign_in

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

SPEC = {
    "openapi": "3.1.0", "info": {"title": "Weather", "version": "2"}, "servers": [{"url": "/api"}],
    "paths": {"/forecast/{city}": {"get": {
        "operationId": "getForecast", "summary": "Tomorrow's forecast for a city.",
        "parameters": [{"name": "city", "in": "path", "required": True, "schema": {"type": "string"}},
                       {"name": "days", "in": "query", "schema": {"type": "integer", "default": 1}}],
        "responses": {"200": {"description": "ok"}}}}},
}


class WeatherApi(JsonService):
    def answer(self) -> dict:
        return SPEC if self.path == "/openapi.json" else {"path": self.path, "sky": "sunny"}


def test_import_a_spec_try_its_tool_write_a_python_tool_and_read_the_log(browser_page, make_workspace):
    make_workspace("Acme", owner="ann")
    page = browser_page
    sign_in(page)
    page.get_by_role("navigation", name="Main").get_by_role("link", name="Work Bridge").click()
    expect(page.get_by_role("heading", name="Work Bridge", exact=True)).to_be_visible()

    with local_http_server(WeatherApi) as port:
        page.get_by_label("Host or network").fill("127.0.0.1")
        page.get_by_role("button", name="Allow").click()
        expect(page.locator("tr[data-rule='127.0.0.1/32']")).to_be_visible()

        page.get_by_role("link", name="Import OpenAPI / Swagger").click()
        page.get_by_label("…or its URL (fetched through the egress guard)").fill(
            f"http://127.0.0.1:{port}/openapi.json")
        page.get_by_role("button", name="Read the spec").click()
        expect(page.locator(".msg.error")).to_contain_text("give the API's base URL")
        page.get_by_label("…or its URL (fetched through the egress guard)").fill(
            f"http://127.0.0.1:{port}/openapi.json")
        page.get_by_label("Base URL of the API").fill(f"http://127.0.0.1:{port}")
        page.get_by_role("button", name="Read the spec").click()
        row = page.locator("tr[data-operation='GET /forecast/{city}']")
        row.locator("input[name='name_0']").fill("forecast")
        page.get_by_role("button", name="Import the ticked operations").click()
        expect(page.locator(".msg.success")).to_contain_text("Imported Weather: 1 tool(s).")

        page.locator("tr[data-tool='forecast']").get_by_role("link").click()
        page.get_by_label("city *").fill("上海")
        expect(page.get_by_label("days")).to_have_value("1")
        page.get_by_role("button", name="Call the tool").click()
        expect(page.locator(".result [data-status]")).to_have_text("ok")
        expect(page.locator("pre.output")).to_contain_text("/api/forecast/%E4%B8%8A%E6%B5%B7?days=1")
        expect(page.locator("pre.request")).to_contain_text('"method": "GET"')

    page.get_by_role("link", name="← Work Bridge").click()
    page.get_by_label("Name", exact=True).last.fill("SHOP_TOKEN")
    page.get_by_label("Value").fill("tok-very-secret-9876")
    page.get_by_role("button", name="Save secret").click()
    expect(page.locator("tr[data-secret='SHOP_TOKEN']")).to_contain_text("••••••••9876")
    expect(page.locator("body")).not_to_contain_text("tok-very-secret")

    page.get_by_role("link", name="+ Python tool").click()
    page.get_by_label("Name (a function name").fill("word_count")
    page.get_by_label("Description, written for the model").fill("Counts the words of a text.")
    page.get_by_text("Raw JSON Schema (for experts)").click()
    page.get_by_label("Arguments: a JSON Schema").fill(json.dumps(
        {"type": "object", "required": ["text"], "properties": {"text": {"type": "string"}}}))
    page.get_by_label("Code: def run").fill("def run(args):\n    return {'words': len(args['text'].split())}\n")
    page.get_by_role("button", name="Save tool").click()
    expect(page.locator(".msg.success")).to_contain_text("Saved the tool word_count.")
    page.get_by_label("text *").fill("one two three")
    page.get_by_role("button", name="Call the tool").click()
    expect(page.locator("pre.output")).to_contain_text('"words": 3')

    page.get_by_label("text *").fill("x")
    page.get_by_text("Edit the tool").click()
    page.get_by_label("Code: def run").fill("def run(args):\n    raise ValueError('no words today')\n")
    page.get_by_role("button", name="Save: a new version").click()
    page.get_by_label("text *").fill("four")
    page.get_by_role("button", name="Call the tool").click()
    expect(page.locator(".result .error-text")).to_contain_text("ValueError: no words today")
    page.get_by_label("Status").select_option("failed")
    expect(page.locator("table.invocations tbody tr")).to_have_count(1)
    expect(page.locator("table.invocations")).to_contain_text("no words today")


def test_build_an_http_tool_with_the_argument_table_and_call_it(browser_page, make_workspace):
    """The table writes the schema: a required text argument and an optional whole number with a default and allowed
    values; a default that is not a number is marked in the table and stops the save."""
    make_workspace("Acme", owner="ann")
    page = browser_page
    sign_in(page)
    page.goto("/tools/")
    with local_http_server(WeatherApi) as port:
        page.get_by_label("Host or network").fill(f"127.0.0.1:{port}")
        page.get_by_role("button", name="Allow").click()
        page.get_by_role("link", name="+ HTTP tool").click()
        expect(page.locator("select[name='method']")).to_have_value("GET")
        expect(page.locator("select[name='auth_type']")).to_have_value("none")
        expect(page.locator("select[name='body']")).to_have_value("none")
        expect(page.get_by_label("Arguments: a JSON Schema")).to_be_hidden()

        page.get_by_label("Name (a function name").fill("forecast")
        page.get_by_label("Description, written for the model").fill("Tomorrow's weather for a city.")
        page.get_by_label("Argument name").fill("city")
        page.get_by_label("Argument required").check()
        page.get_by_label("Argument description").fill("The city's name.")
        page.get_by_role("button", name="+ Add an argument").click()
        days = page.locator("table.params tbody tr").nth(1)
        days.get_by_label("Argument name").fill("days")
        days.get_by_label("Argument type").select_option("integer")
        days.get_by_label("Argument default").fill("two")
        assert days.get_by_label("Argument default").evaluate("input => !input.validity.valid")
        days.get_by_label("Argument default").fill("2")
        days.get_by_label("Argument allowed values").fill("1, 2, 3")
        page.get_by_label("URL, with {argument} placeholders").fill(f"http://127.0.0.1:{port}/forecast/{{city}}")
        page.get_by_label("Query arguments").fill("days")

        page.get_by_text("Raw JSON Schema (for experts)").click()
        assert json.loads(page.get_by_label("Arguments: a JSON Schema").input_value()) == {
            "type": "object", "required": ["city"], "properties": {
                "city": {"type": "string", "description": "The city's name."},
                "days": {"type": "integer", "default": 2, "enum": [1, 2, 3]}}}
        page.get_by_role("button", name="Save tool").click()
        expect(page.locator(".msg.success")).to_contain_text("Saved the tool forecast.")

        page.get_by_label("city *").fill("Shanghai")
        expect(page.locator("#arg-days")).to_have_value("2")
        page.locator("#arg-days").select_option("3")
        page.get_by_role("button", name="Call the tool").click()
        expect(page.locator(".result [data-status]")).to_have_text("ok")
        expect(page.locator("pre.output")).to_contain_text("/forecast/Shanghai?days=3")

