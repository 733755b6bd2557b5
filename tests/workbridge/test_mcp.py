"""MCP both ways. As a client, Work Bridge registers MCP servers (streamable HTTP through the egress guard, or a
local command from the operator's catalogue, run sandboxed), imports their tools and calls them. As a server, /mcp
offers a workspace's tools to the official `mcp` client, authenticated by a workspace API key, with DNS-rebinding
checks."""

import asyncio
import importlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import psutil
import pytest
from django.apps import apps as django_apps
from django.contrib.auth import get_user_model
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client
from rest_framework.test import APIClient

from accounts.models import Role
from accounts.services import Actor, create_api_key, create_workspace
from tests.conftest import JsonService, free_port, local_http_server, stop_engines_and_flush, wait_for
from workbridge import mcp_client, services, vault
from workbridge.models import Invocation, McpServer

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


# Pooled sessions: a registered server's process is started once and kept for the calls that follow.


@pytest.fixture(autouse=True)
def no_session_outlives_its_test():
    yield
    mcp_client.close_all()


@pytest.fixture
def pooled_inventory(acme, key_client, catalogue):
    """The catalogue's inventory server registered by the workspace's owner, its greet and probe tools imported."""
    owner = key_client("ann", acme, role=Role.OWNER)
    server = owner.post(SERVERS, _stdio("inventory-local", catalog_entry="inventory"), format="json").json()
    tools = {tool["name"]: tool["id"] for tool in
             owner.post(f"{SERVERS}{server['id']}/import/", {"tools": ["greet", "probe"]}, format="json").json()}

    def invoke(name: str, arguments: dict) -> dict:
        return owner.post(f"{TOOLS}{tools[name]}/invoke/", {"arguments": arguments}, format="json").json()

    return {"owner": owner, "server": server, "key": f"mcp-server:{server['id']}", "invoke": invoke}


def _ended(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


@pytest.mark.django_db
def test_calls_reuse_one_sandboxed_server_process(pooled_inventory):
    invoke, key = pooled_inventory["invoke"], pooled_inventory["key"]
    pids = []
    for name in ("Li", "Wang", "Zhao"):
        assert invoke("greet", {"name": name})["output"] == {"result": f"你好, {name}!"}
        pids.append(mcp_client.pooled_processes()[key])
    assert len(set(pids)) == 1 and psutil.Process(pids[0]).cmdline()[0] == "bwrap"
    # Kept open, it is as confined as a server started for one call.
    inside = invoke("probe", {})["output"]
    assert json.loads(inside) == {"uid": 65534, "readable": False, "network": False}
    assert mcp_client.pooled_processes()[key] == pids[0]


@pytest.mark.django_db
def test_a_killed_server_process_is_started_afresh_at_the_next_call(pooled_inventory):
    invoke, key = pooled_inventory["invoke"], pooled_inventory["key"]
    invoke("greet", {"name": "Li"})
    killed = mcp_client.pooled_processes()[key]
    os.kill(killed, signal.SIGKILL)
    wait_for(lambda: _ended(killed), timeout=10, what="the server process to end")

    called = invoke("greet", {"name": "Wang"})
    assert called["invocation"]["status"] == "ok" and called["output"] == {"result": "你好, Wang!"}
    assert mcp_client.pooled_processes()[key] not in (None, killed)


@pytest.mark.django_db
def test_an_idle_session_is_closed(pooled_inventory, settings):
    settings.MCP_POOL_IDLE_S = 0.3
    pooled_inventory["invoke"]("greet", {"name": "Li"})
    pid = mcp_client.pooled_processes()[pooled_inventory["key"]]
    wait_for(lambda: pooled_inventory["key"] not in mcp_client.pooled_processes(), timeout=10,
             what="the idle session to close")
    wait_for(lambda: _ended(pid), timeout=10, what="its process to end")


@pytest.mark.django_db
def test_beyond_the_pool_size_the_least_recently_used_session_is_closed(pooled_inventory, settings):
    settings.MCP_POOL_SIZE = 1
    owner, invoke = pooled_inventory["owner"], pooled_inventory["invoke"]
    other = owner.post(SERVERS, _stdio("inventory-two", catalog_entry="inventory"), format="json").json()
    [stock] = owner.post(f"{SERVERS}{other['id']}/import/", {"tools": ["stock-level"]}, format="json").json()
    invoke("greet", {"name": "Li"})
    first = mcp_client.pooled_processes()[pooled_inventory["key"]]

    called = owner.post(f"{TOOLS}{stock['id']}/invoke/", {"arguments": {"sku": "ABC"}}, format="json").json()
    assert called["invocation"]["status"] == "ok" and '"units": 21' in called["output"]
    assert list(mcp_client.pooled_processes()) == [f"mcp-server:{other['id']}"]
    wait_for(lambda: _ended(first), timeout=10, what="the least recently used server to end")

    settings.MCP_POOL_SIZE = 0  # no pool: a session (and a process) per call, as before pooling
    mcp_client.close_all()
    assert invoke("greet", {"name": "Zhao"})["output"] == {"result": "你好, Zhao!"}
    assert mcp_client.pooled_processes() == {}


@pytest.mark.django_db
def test_an_http_server_that_went_away_fails_the_call_at_once_and_is_reached_afresh_when_back(acme, key_client):
    port = free_port()

    def start() -> subprocess.Popen:
        process = subprocess.Popen([sys.executable, FIXTURE, "http", str(port)], stdout=subprocess.DEVNULL,
                                   stderr=subprocess.DEVNULL)
        wait_for(lambda: _answers(port), timeout=30, what="the fixture MCP server")
        return process

    dev = key_client("dev", acme)
    server = start()
    try:
        registered = dev.post(SERVERS, {"name": "inventory", "transport": "http",
                                        "url": f"http://127.0.0.1:{port}/mcp"}, format="json").json()
        [greet] = dev.post(f"{SERVERS}{registered['id']}/import/", {"tools": ["greet"]}, format="json").json()

        def invoke(name: str) -> dict:
            return dev.post(f"{TOOLS}{greet['id']}/invoke/", {"arguments": {"name": name}}, format="json").json()

        assert invoke("Li")["output"] == {"result": "你好, Li!"}
        server.kill()
        server.wait()

        gone = invoke("Wang")["invocation"]
        assert gone["status"] == "failed" and "the next call starts it afresh" in gone["error"]
        assert gone["latency_ms"] < 5000  # at once, not after the call's timeout
        server = start()
        assert invoke("Zhao")["output"] == {"result": "你好, Zhao!"}
    finally:
        server.kill()
        server.wait()


def _answers(port: int) -> bool:
    try:
        return httpx.get(f"http://127.0.0.1:{port}/mcp", timeout=1).status_code > 0
    except httpx.HTTPError:
        return False


@pytest.mark.django_db
def test_editing_or_disabling_a_server_closes_its_session(pooled_inventory):
    owner, invoke, key = pooled_inventory["owner"], pooled_inventory["invoke"], pooled_inventory["key"]
    invoke("greet", {"name": "Li"})
    before = mcp_client.pooled_processes()[key]
    edited = owner.put(f"{SERVERS}{pooled_inventory['server']['id']}/",
                       _stdio("inventory-local", catalog_entry="inventory", arguments=["--verbose"]), format="json")
    assert edited.status_code == 200
    assert key not in mcp_client.pooled_processes()
    wait_for(lambda: _ended(before), timeout=10, what="the edited server's old process to end")
    assert invoke("greet", {"name": "Wang"})["output"] == {"result": "你好, Wang!"}
    edited_pid = mcp_client.pooled_processes()[key]
    assert psutil.Process(edited_pid).cmdline()[-1] == "--verbose"

    McpServer.objects.filter(pk=pooled_inventory["server"]["id"]).update(disabled_reason="Retired by the operator.")
    refused = invoke("greet", {"name": "Zhao"})["invocation"]
    assert refused["status"] == "failed" and "disabled: Retired by the operator." in refused["error"]
    assert key not in mcp_client.pooled_processes()
    wait_for(lambda: _ended(edited_pid), timeout=10, what="the disabled server's process to end")


@pytest.mark.django_db
def test_a_forked_child_starts_with_an_empty_pool_and_leaves_its_parent_s_sessions_alone(pooled_inventory):
    invoke, key = pooled_inventory["invoke"], pooled_inventory["key"]
    invoke("greet", {"name": "Li"})
    pid = mcp_client.pooled_processes()[key]
    read, write = os.pipe()
    child = os.fork()
    if child == 0:  # a prefork worker: it must not see, use or close its parent's session
        os.write(write, json.dumps(mcp_client.pooled_processes()).encode())
        os._exit(0)
    os.close(write)
    os.waitpid(child, 0)
    assert json.loads(os.read(read, 1000)) == {}
    assert invoke("greet", {"name": "Wang"})["output"] == {"result": "你好, Wang!"}
    assert mcp_client.pooled_processes()[key] == pid


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
