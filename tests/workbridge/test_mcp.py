"""MCP both ways. As a client, Work Bridge registers MCP servers (streamable HTTP through the egress guard, or a
local command from the operator's catalogue, run sandboxed), imports their tools and calls them. As a server, /mcp
offers a workspace's tools to the official `mcp` client, authenticated by a workspace API key, with DNS-rebinding
checks."""

import asyncio
import importlib
import json
import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from django.apps import apps as django_apps
from django.contrib.auth import get_user_model
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client
from rest_framework.test import APIClient

from accounts.models import Role
from accounts.services import Actor, create_api_key, create_workspace
from tests.conftest import JsonService, free_port, local_http_server, stop_engines_and_flush, wait_for
from workbridge import services, vault
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
    assert {tool["name"] for tool in offered} == {"stock-level", "greet", "probe", "broken"}
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


@pytest.fixture
def catalogue(settings, tmp_path):
    """The operator's catalogue (FACTORY_MCP_COMMANDS) with the fixture server, shown its own folder read-only and
    given PROBE_PATH, the platform's secrets key, to try to read."""
    settings.MCP_COMMANDS_FILE = tmp_path / "mcp-commands.toml"

    def write(text: str) -> None:
        settings.MCP_COMMANDS_FILE.write_text(text)

    write(f"""
[inventory]
description = "The test inventory server"
command = [{json.dumps(sys.executable)}, {json.dumps(FIXTURE)}, "stdio"]
arguments = ["--verbose", "--warehouse=[a-z]+"]
read_only_paths = [{json.dumps(str(Path(FIXTURE).parent))}]
env = {{ PROBE_PATH = {json.dumps(str(settings.DATA_DIR / "secrets.key"))} }}

[missing]
command = ["/opt/nowhere/mcp-server-nothing"]
""")
    return write


def _stdio(name: str, **fields) -> dict:
    return {"name": name, "transport": "stdio", **fields}


# The scenario: any account can make a workspace, and owns it; owning one is no right to run commands.
ESCAPE = ["/bin/sh", "-c", "id > /tmp/owned; head -c 60 secrets.key"]


@pytest.mark.django_db
def test_a_workspace_owner_cannot_register_a_free_form_local_command_only_a_catalogue_entry(acme, key_client,
                                                                                          catalogue, settings):
    vault.encrypt("made once: the platform's key is then on disk, for the server to try to read")
    owner = key_client("ann", acme, role=Role.OWNER)
    refused = owner.post(SERVERS, _stdio("shell", command=ESCAPE), format="json")
    assert refused.status_code == 403
    message = refused.json()["error"]["message"]
    assert "operator's catalogue" in message and "platform administrator" in message
    assert key_client("dev", acme).post(SERVERS, _stdio("inv", catalog_entry="inventory"),
                                        format="json").status_code == 403

    offered = owner.get(f"{SERVERS}catalogue/").json()
    assert {entry["name"]: entry["installed"] for entry in offered} == {"inventory": True, "missing": False}
    server = owner.post(SERVERS, _stdio("inventory-local", catalog_entry="inventory"), format="json").json()
    probe, greet = owner.post(f"{SERVERS}{server['id']}/import/", {"tools": ["probe", "greet"]},
                              format="json").json()
    called = owner.post(f"{TOOLS}{greet['id']}/invoke/", {"arguments": {"name": "Li"}}, format="json").json()
    assert called["output"] == {"result": "你好, Li!"}
    # Sandboxed: an unprivileged user, no network, no view of the platform's data (its secrets key).
    inside = owner.post(f"{TOOLS}{probe['id']}/invoke/", {"arguments": {}}, format="json").json()["output"]
    assert json.loads(inside) == {"uid": 65534, "readable": False, "network": False}
    assert os.environ.get("FACTORY_SECRETS_KEY") or (settings.DATA_DIR / "secrets.key").exists()


@pytest.mark.django_db
@pytest.mark.parametrize("arguments, refused", [
    (["; rm -rf /"], "; rm -rf /"), (["$(id)"], "$(id)"), (["--config=/etc/passwd"], "--config=/etc/passwd"),
    (["--warehouse=main; id"], "--warehouse=main; id"), (["--verbose", "--warehouse=Main"], "--warehouse=Main"),
])
def test_arguments_that_escape_a_catalogue_entry_are_refused(acme, key_client, catalogue, arguments, refused):
    owner = key_client("ann", acme, role=Role.OWNER)
    response = owner.post(SERVERS, _stdio("inv", catalog_entry="inventory", arguments=arguments), format="json")
    assert response.status_code == 400 and repr(refused) in response.json()["error"]["message"]
    allowed = owner.post(SERVERS, _stdio("inv", catalog_entry="inventory", arguments=["--verbose",
                                                                                     "--warehouse=north"]),
                         format="json")
    assert allowed.status_code == 201 and allowed.json()["arguments"] == ["--verbose", "--warehouse=north"]


@pytest.mark.django_db
def test_a_catalogue_entry_whose_command_is_missing_or_unknown_is_refused_with_the_path(acme, key_client, catalogue):
    owner = key_client("ann", acme, role=Role.OWNER)
    missing = owner.post(SERVERS, _stdio("nothing", catalog_entry="missing"), format="json")
    assert missing.status_code == 400 and "/opt/nowhere/mcp-server-nothing" in missing.json()["error"]["message"]
    unknown = owner.post(SERVERS, _stdio("nothing", catalog_entry="no-such-entry"), format="json")
    assert unknown.status_code == 400 and "no entry 'no-such-entry'" in unknown.json()["error"]["message"]
    catalogue("[broken]\ncommand = 'not a list'\n")
    broken = owner.get(f"{SERVERS}catalogue/")
    assert broken.status_code == 400 and "'command' must be a list" in broken.json()["error"]["message"]


@pytest.mark.django_db
def test_a_platform_administrator_signed_in_registers_a_free_form_command_and_it_runs_sandboxed(acme, key_client):
    """Signed in, not through a key (a key may sit in any script). The fixture server's source goes in as `-c`:
    the sandbox shows a free-form command nothing of the machine's files but the system and Python."""
    get_user_model().objects.filter(username="ann").update(is_staff=True)
    command = [sys.executable, "-c", Path(FIXTURE).read_text(), "stdio"]
    platform_key = key_client("ann", acme, role=Role.OWNER, scope="platform")
    assert platform_key.post(SERVERS, _stdio("free", command=command), format="json").status_code == 403

    session = APIClient()
    session.login(username="ann", password="correct-horse-battery")
    server = session.post(SERVERS, _stdio("free", command=command), format="json", HTTP_X_WORKSPACE=acme.slug)
    assert server.status_code == 201, server.json()
    [probe] = session.post(f"{SERVERS}{server.json()['id']}/import/", {"tools": ["probe"]}, format="json",
                           HTTP_X_WORKSPACE=acme.slug).json()
    inside = session.post(f"{TOOLS}{probe['id']}/invoke/", {"arguments": {}}, format="json",
                          HTTP_X_WORKSPACE=acme.slug).json()
    assert json.loads(inside["output"]) == {"uid": 65534, "readable": False, "network": False}


@pytest.mark.django_db
def test_a_local_command_registered_before_the_catalogue_is_disabled_with_its_reason(acme, key_client, catalogue):
    from workbridge.models import McpServer

    migration = importlib.import_module("workbridge.migrations.0005_mcp_catalogue")
    old = McpServer.objects.create(workspace=acme, name="old", transport="stdio", command=ESCAPE)
    McpServer.objects.create(workspace=acme, name="remote", transport="http", url="https://mcp.example.com/mcp")
    migration.disable_free_form_commands(django_apps, None)

    owner = key_client("ann", acme, role=Role.OWNER)
    listed = owner.get(f"{SERVERS}{old.pk}/tools/")
    assert listed.status_code == 400 and "disabled" in listed.json()["error"]["message"]
    assert "operator's catalogue" in owner.get(f"{SERVERS}{old.pk}/").json()["disabled_reason"]
    assert McpServer.objects.get(name="remote").disabled_reason == ""
    # Saved again as a catalogue entry by an admin, it works again.
    saved = owner.put(f"{SERVERS}{old.pk}/", _stdio("old", catalog_entry="inventory"), format="json").json()
    assert saved["disabled_reason"] == "" and owner.get(f"{SERVERS}{old.pk}/tools/").status_code == 200


class EchoesItsToken(JsonService):
    def answer(self) -> dict:
        return {"you_sent": self.headers.get("Authorization", "")}


ECHOED_TOKEN = "tok-mcp-echo-31337"


@pytest.fixture(scope="module")
def mcp_platform(web_server, django_db_blocker):
    """Two workspaces on the real web process, each with a tool and an API key; Acme also has an http tool whose
    service echoes the secret it is sent (allowed on its loopback port alone)."""
    with local_http_server(EchoesItsToken) as echo_port, django_db_blocker.unblock():
        users = get_user_model().objects
        owner = Actor(user=users.create_user(username="mcp-owner", password="x" * 12))
        other = Actor(user=users.create_user(username="mcp-other", password="x" * 12))
        acme, globex = create_workspace(actor=owner, name="MCP Acme"), create_workspace(actor=other, name="Globex")
        for actor, workspace, name in ((owner, acme, "add_numbers"), (other, globex, "globex_secret_tool")):
            services.save_tool(actor=actor, workspace=workspace, name=name, binding="python",
                               description="Add two numbers.", config={"code": ADD},
                               parameters={"type": "object", "required": ["a", "b"],
                                           "properties": {"a": {"type": "number"}, "b": {"type": "number"}}})
        services.add_egress_rule(actor=owner, workspace=acme, entry=f"127.0.0.1:{echo_port}")
        services.set_secret(actor=owner, workspace=acme, name="ECHO", value=ECHOED_TOKEN)
        services.save_tool(actor=owner, workspace=acme, name="echo_token", description="What the service got.",
                           parameters={"type": "object"}, config={
                               "method": "GET", "url": f"http://127.0.0.1:{echo_port}/",
                               "auth": {"type": "bearer", "secret": "ECHO"}})
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

    assert [tool.name for tool in listed.tools] == ["add_numbers", "echo_token"]
    assert listed.tools[0].inputSchema["required"] == ["a", "b"]
    assert not called.isError and called.structuredContent == {"sum": 42}
    assert other.isError and "no tool 'globex_secret_tool'" in other.content[0].text
    assert wrong.isError and "arguments do not fit" in wrong.content[0].text
    assert Invocation.objects.filter(caller="mcp", tool__name="add_numbers", status="ok").count() == 1


def test_a_secret_the_service_echoes_comes_back_masked_from_mcp(mcp_platform, live_db):
    async def call(session: ClientSession):
        return await session.call_tool("echo_token", {})

    called = asyncio.run(_use(mcp_platform["url"], mcp_platform["keys"]["acme"], call))
    shown = json.dumps(called.model_dump(mode="json"), ensure_ascii=False)
    assert not called.isError and ECHOED_TOKEN not in shown
    assert called.structuredContent == {"you_sent": "Bearer ••••••••"}


def test_a_viewer_key_lists_but_cannot_call(mcp_platform, live_db):
    async def list_and_call(session: ClientSession):
        return await session.list_tools(), await session.call_tool("add_numbers", {"a": 1, "b": 2})

    listed, called = asyncio.run(_use(mcp_platform["url"], mcp_platform["keys"]["viewer"], list_and_call))
    assert [tool.name for tool in listed.tools] == ["add_numbers", "echo_token"]
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
