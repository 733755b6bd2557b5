"""MCP both ways. As a client, Work Bridge registers MCP servers (streamable HTTP through the egress guard, or a
local command that only admins may register), imports their tools and calls them. As a server, /mcp offers a
workspace's tools to the official `mcp` client, authenticated by a workspace API key, with DNS-rebinding checks."""

import asyncio
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from django.contrib.auth import get_user_model
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client

from accounts.models import Role
from accounts.services import Actor, create_api_key, create_workspace
from tests.conftest import free_port, stop_engines_and_flush, wait_for
from workbridge import services
from workbridge.models import Invocation

FIXTURE = str(Path(__file__).with_name("mcp_fixture.py"))
SERVERS, TOOLS = "/api/workbridge/mcp-servers/", "/api/workbridge/tools/"


@pytest.fixture(scope="module")
def inventory_url(tmp_path_factory):
    """The fixture MCP server on streamable HTTP, on a loopback port."""
    port = free_port()
    log = (tmp_path_factory.mktemp("mcp") / "server.log").open("w")
    process = subprocess.Popen([sys.executable, FIXTURE, "http", str(port)], stdout=log, stderr=subprocess.STDOUT)
    try:
        def answers() -> bool:
            try:
                return httpx.get(f"http://127.0.0.1:{port}/mcp", timeout=1).status_code > 0
            except httpx.HTTPError:
                return False

        wait_for(answers, timeout=30, what="the fixture MCP server")
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        process.kill()
        process.wait()


@pytest.fixture
def acme(make_workspace, settings):
    settings.EGRESS_ALLOW = ["127.0.0.1/32"]
    return make_workspace("Acme", owner="ann", dev="developer", viewer="viewer")


@pytest.mark.django_db
def test_an_http_server_s_tools_are_listed_imported_and_called_and_its_errors_are_failed_invocations(
        acme, key_client, inventory_url):
    dev = key_client("dev", acme)
    server = dev.post(SERVERS, {"name": "inventory", "transport": "http", "url": inventory_url},
                      format="json").json()

    offered = dev.get(f"{SERVERS}{server['id']}/tools/").json()
    assert {tool["name"] for tool in offered} == {"stock-level", "greet", "broken"}
    assert all(tool["imported_as"] is None for tool in offered)
    imported = dev.post(f"{SERVERS}{server['id']}/import/", {"tools": ["stock-level", "broken"]},
                        format="json").json()
    by_name = {tool["name"]: tool for tool in imported}
    # A remote name that is not a function name gets one; the call still uses the server's name.
    assert set(by_name) == {"stock_level", "broken"} and by_name["stock_level"]["binding"] == "mcp"
    assert by_name["stock_level"]["parameters"]["required"] == ["sku"]

    called = dev.post(f"{TOOLS}{by_name['stock_level']['id']}/invoke/", {"arguments": {"sku": "ABC"}},
                      format="json").json()
    assert called["invocation"]["status"] == "ok" and '"units": 21' in called["output"]
    failed = dev.post(f"{TOOLS}{by_name['broken']['id']}/invoke/", {"arguments": {}}, format="json").json()
    assert failed["invocation"]["status"] == "failed"
    assert "the warehouse system is down" in failed["invocation"]["error"]
    refused = dev.post(f"{TOOLS}{by_name['stock_level']['id']}/invoke/", {"arguments": {"sku": 7}}, format="json")
    assert refused.status_code == 400 and "sku" in refused.json()["error"]["message"]
    again = dev.get(f"{SERVERS}{server['id']}/tools/").json()
    assert {tool["name"]: tool["imported_as"] for tool in again}["stock-level"] == "stock_level"


@pytest.mark.django_db
def test_a_server_url_the_egress_guard_refuses_is_a_400_and_a_server_that_is_down_says_so(
        acme, key_client, settings, inventory_url):
    dev = key_client("dev", acme)
    settings.EGRESS_ALLOW = []
    refused = dev.post(SERVERS, {"name": "inside", "transport": "http", "url": inventory_url}, format="json")
    assert refused.status_code == 400 and "not a public address" in refused.json()["error"]["message"]

    settings.EGRESS_ALLOW = ["127.0.0.1/32"]
    down = dev.post(SERVERS, {"name": "down", "transport": "http", "url": f"http://127.0.0.1:{free_port()}/mcp",
                              "timeout_s": 5}, format="json").json()
    listed = dev.get(f"{SERVERS}{down['id']}/tools/")
    assert listed.status_code == 400 and "could not be used" in listed.json()["error"]["message"]


@pytest.mark.django_db
def test_only_an_admin_registers_a_local_command_and_its_tools_work(acme, key_client):
    stdio = {"name": "local_inventory", "transport": "stdio", "command": [sys.executable, FIXTURE, "stdio"]}
    forbidden = key_client("dev", acme).post(SERVERS, stdio, format="json")
    assert forbidden.status_code == 403

    owner = key_client("ann", acme, role=Role.OWNER)
    server = owner.post(SERVERS, stdio, format="json").json()
    greet = owner.post(f"{SERVERS}{server['id']}/import/", {"tools": ["greet"]}, format="json").json()[0]
    called = owner.post(f"{TOOLS}{greet['id']}/invoke/", {"arguments": {"name": "Li"}}, format="json").json()
    assert called["output"] == {"result": "你好, Li!"}
    assert Invocation.objects.get().caller == "api"


@pytest.fixture(scope="module")
def mcp_platform(web_server, django_db_blocker):
    """Two workspaces on the real web process, each with a tool and an API key."""
    with django_db_blocker.unblock():
        users = get_user_model().objects
        owner = Actor(user=users.create_user(username="mcp-owner", password="x" * 12))
        other = Actor(user=users.create_user(username="mcp-other", password="x" * 12))
        acme, globex = create_workspace(actor=owner, name="MCP Acme"), create_workspace(actor=other, name="Globex")
        for actor, workspace, name in ((owner, acme, "add_numbers"), (other, globex, "globex_secret_tool")):
            services.save_tool(actor=actor, workspace=workspace, name=name, binding="python",
                               description="Add two numbers.", config={"code": ADD},
                               parameters={"type": "object", "required": ["a", "b"],
                                           "properties": {"a": {"type": "number"}, "b": {"type": "number"}}})
        keys = {"acme": create_api_key(actor=owner, workspace=acme, name="mcp").secret,
                "globex": create_api_key(actor=other, workspace=globex, name="mcp").secret,
                "viewer": create_api_key(actor=owner, workspace=acme, name="mcp-read", role=Role.VIEWER).secret}
        yield {"url": f"{web_server}/mcp", "keys": keys}
        stop_engines_and_flush()


ADD = "def run(args):\n    return {'sum': args['a'] + args['b']}\n"


async def _use(url: str, key: str, work):
    async with httpx.AsyncClient(headers={"Authorization": f"Bearer {key}"}, timeout=60) as client:
        async with streamable_http_client(url, http_client=client) as (read, write, _):
            async with ClientSession(read, write) as session:
                await session.initialize()
                return await work(session)


def test_the_official_client_lists_and_calls_a_workspace_s_tools_and_sees_no_other_s(mcp_platform, live_db):
    async def list_and_call(session: ClientSession):
        listed = await session.list_tools()
        called = await session.call_tool("add_numbers", {"a": 2, "b": 40})
        other = await session.call_tool("globex_secret_tool", {"a": 1, "b": 1})
        wrong = await session.call_tool("add_numbers", {"a": "two"})
        return listed, called, other, wrong

    listed, called, other, wrong = asyncio.run(_use(mcp_platform["url"], mcp_platform["keys"]["acme"],
                                                    list_and_call))

    assert [tool.name for tool in listed.tools] == ["add_numbers"]
    assert listed.tools[0].inputSchema["required"] == ["a", "b"]
    assert not called.isError and called.structuredContent == {"sum": 42}
    assert other.isError and "no tool 'globex_secret_tool'" in other.content[0].text
    assert wrong.isError and "arguments do not fit" in wrong.content[0].text
    assert Invocation.objects.filter(caller="mcp", tool__name="add_numbers", status="ok").count() == 1


def test_a_viewer_key_lists_but_cannot_call(mcp_platform, live_db):
    async def list_and_call(session: ClientSession):
        return await session.list_tools(), await session.call_tool("add_numbers", {"a": 1, "b": 2})

    listed, called = asyncio.run(_use(mcp_platform["url"], mcp_platform["keys"]["viewer"], list_and_call))
    assert [tool.name for tool in listed.tools] == ["add_numbers"]
    assert called.isError and "developer role" in called.content[0].text


def test_mcp_refuses_a_missing_key_a_foreign_host_and_a_foreign_origin(mcp_platform, live_db):
    initialize = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "probe", "version": "1"}}}
    accept = {"Accept": "application/json, text/event-stream"}
    key = {"Authorization": f"Bearer {mcp_platform['keys']['acme']}", **accept}

    assert httpx.post(mcp_platform["url"], json=initialize, headers=accept).status_code == 401
    # A foreign Host is refused at the platform's edge (its Host check), before MCP's own.
    assert httpx.post(mcp_platform["url"], json=initialize, headers={**key, "Host": "evil.example"}).status_code == 400
    assert httpx.post(mcp_platform["url"], json=initialize,
                      headers={**key, "Origin": "http://evil.example"}).status_code == 403
    assert httpx.post(mcp_platform["url"], json=initialize, headers=key).status_code == 200
