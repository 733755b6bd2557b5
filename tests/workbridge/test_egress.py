"""The egress guard: every address form it must refuse, allowlists, pinning against DNS rebinding, redirects, size and
time caps. No network: a local server on loopback (allowlisted where a test needs it) and scripted DNS."""

import asyncio
import ipaddress
import re
import time
from http.server import BaseHTTPRequestHandler

import httpx
import pytest

from tests.conftest import ROOT, free_port, local_http_server
from workbridge import egress
from workbridge.egress import Allowlist, EgressRefused

LOOPBACK = Allowlist.of(["127.0.0.1/32"])


class Endpoint(BaseHTTPRequestHandler):
    """/ok answers; /redirect?to=URL redirects; /big sends 2 MiB; /slow waits 2 s; /host echoes the Host header."""

    def do_GET(self) -> None:
        if self.path.startswith("/redirect"):
            self.send_response(302)
            self.send_header("Location", self.path.split("to=", 1)[1])
            self.end_headers()
            return
        if self.path == "/slow":
            time.sleep(2)
        body = {"/big": b"x" * 2 * 2**20, "/host": self.headers["Host"].encode()}.get(self.path, b'{"ok": true}')
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args) -> None:
        pass


@pytest.fixture(scope="module")
def endpoint():
    with local_http_server(Endpoint) as port:
        yield port


@pytest.fixture
def dns():
    """Scripted DNS: name -> list of answers, one per lookup (the last repeats); lookups are counted."""
    answers: dict[str, list[list[str]]] = {}
    lookups: list[str] = []

    def resolve(host: str, port: int) -> list[str]:
        lookups.append(host)
        try:
            ipaddress.ip_address(host)
            return [host]
        except ValueError:
            pass
        queue = answers.get(host)
        if not queue:
            raise EgressRefused(f"The host '{host}' could not be resolved: scripted DNS has no answer")
        return queue.pop(0) if len(queue) > 1 else queue[0]

    egress.use_resolver(resolve)
    yield answers, lookups
    egress.use_resolver(None)


@pytest.mark.parametrize("address", [
    "127.0.0.1", "10.1.2.3", "172.16.0.1", "192.168.1.1", "169.254.169.254", "100.64.0.1", "100.100.100.200",
    "0.0.0.0", "255.255.255.255", "224.0.0.1", "192.0.0.8", "198.18.0.1", "::1", "::", "fe80::1", "fd00:ec2::254",
    "ff02::1", "::ffff:127.0.0.1", "::ffff:169.254.169.254", "2002:7f00:1::", "2002:a9fe:a9fe::",
    "64:ff9b::7f00:1", "64:ff9b::a9fe:a9fe", "2001:0:4136:e378:8000:63bf:80ff:fffe",
])
def test_no_loopback_private_link_local_cgnat_multicast_or_translated_address_is_public(address):
    assert not egress.is_public(ipaddress.ip_address(address))


@pytest.mark.parametrize("address", ["8.8.8.8", "93.184.216.34", "2001:4860:4860::8888", "::ffff:8.8.8.8",
                                     "64:ff9b::808:808"])
def test_public_addresses_pass_in_every_form(address):
    assert egress.is_public(ipaddress.ip_address(address))


@pytest.mark.parametrize("url", [
    "http://127.0.0.1/", "http://localhost/", "http://2130706433/", "http://0177.0.0.1/", "http://0x7f.0.0.1/",
    "http://0x7f000001/", "http://127.1/", "http://[::1]/", "http://[::ffff:7f00:1]/", "http://0.0.0.0/",
    "http://169.254.169.254/latest/meta-data/",
])
def test_every_spelling_of_a_local_address_is_refused_with_the_system_resolver(url):
    # httpx already rejects some spellings (octal) as URLs; the rest resolve to the address they spell.
    with pytest.raises(EgressRefused, match="not a public address|is not a valid URL"):
        egress.check(url)


@pytest.mark.parametrize("url, message", [
    ("file:///etc/passwd", "Only http and https"), ("gopher://example.com/", "Only http and https"),
    ("ftp://example.com/", "Only http and https"), ("http:///nohost", "has no host"),
])
def test_other_schemes_and_hostless_urls_are_refused(url, message):
    with pytest.raises(EgressRefused, match=message):
        egress.check(url)


def test_a_name_is_refused_if_any_of_its_addresses_is_private(dns):
    answers, _ = dns
    answers["mixed.example"] = [["93.184.216.34", "10.0.0.7"]]
    with pytest.raises(EgressRefused, match="resolves to 10.0.0.7"):
        egress.check("https://mixed.example/v1")


def test_the_allowlist_opens_named_hosts_subdomains_and_networks(dns):
    answers, _ = dns
    answers["api.corp.example"] = [["10.1.2.3"]]
    answers["db.corp.example"] = [["10.9.9.9"]]
    allow = Allowlist.of(["*.corp.example", "192.168.0.0/16"])

    assert egress.check("http://api.corp.example/x", allow).address == "10.1.2.3"
    assert egress.check("http://192.168.4.5/", allow).address == "192.168.4.5"
    with pytest.raises(EgressRefused):
        egress.check("http://corp.example.evil/", Allowlist.of(["corp.example"]))
    with pytest.raises(EgressRefused):
        egress.check("http://10.9.9.9/", allow)


def test_the_request_goes_to_the_address_that_was_checked_not_a_second_lookup(endpoint, dns):
    answers, lookups = dns
    # Rebinding: the first answer is the allowed one, every later one points elsewhere.
    answers["rebind.test"] = [["127.0.0.1"], ["169.254.169.254"]]

    answer = egress.request("GET", f"http://rebind.test:{endpoint}/host", allowlist=LOOPBACK)

    assert answer.status_code == 200 and answer.text == f"rebind.test:{endpoint}"
    assert lookups == ["rebind.test"]


def test_each_redirect_hop_is_checked_again(endpoint, dns):
    answers, _ = dns
    answers["allowed.test"] = [["127.0.0.1"]]
    base = f"http://allowed.test:{endpoint}"

    followed = egress.request("GET", f"{base}/redirect?to={base}/ok", allowlist=LOOPBACK)
    assert followed.json() == {"ok": True} and followed.history == [f"{base}/redirect?to={base}/ok"]
    with pytest.raises(EgressRefused, match="169.254.169.254, which is not a public address"):
        egress.request("GET", f"{base}/redirect?to=http://169.254.169.254/latest/", allowlist=LOOPBACK)
    with pytest.raises(EgressRefused, match="redirected more than 5 times"):
        egress.request("GET", f"{base}/redirect?to={base}/redirect?to={base}/redirect?to={base}/redirect?to="
                              f"{base}/redirect?to={base}/redirect?to={base}/ok", allowlist=LOOPBACK)


def test_a_library_s_own_requests_are_checked_and_pinned_by_the_guarded_client(endpoint, dns):
    """The MCP client sends its requests through egress.guarded_async_client: the same checks, the same pinning."""
    answers, lookups = dns
    answers["rebind.test"] = [["127.0.0.1"], ["169.254.169.254"]]

    async def fetch(url: str, allowlist: Allowlist = LOOPBACK):
        async with egress.guarded_async_client(allowlist=allowlist) as client:
            return await client.get(url)

    pinned = asyncio.run(fetch(f"http://rebind.test:{endpoint}/host"))
    assert pinned.text == f"rebind.test:{endpoint}" and lookups == ["rebind.test"]
    with pytest.raises(httpx.ConnectError, match="not a public address"):
        asyncio.run(fetch(f"http://127.0.0.1:{endpoint}/host", Allowlist()))


def test_answers_are_capped_in_size_and_time(endpoint):
    with pytest.raises(EgressRefused, match="larger than 1048576 bytes"):
        egress.request("GET", f"http://127.0.0.1:{endpoint}/big", allowlist=LOOPBACK, max_bytes=2**20)
    started = time.monotonic()
    with pytest.raises(EgressRefused, match="did not answer within 0.5 s"):
        egress.request("GET", f"http://127.0.0.1:{endpoint}/slow", allowlist=LOOPBACK, timeout_s=0.5)
    assert time.monotonic() - started < 1.5


def test_an_unreachable_host_is_a_refusal_with_the_reason(dns):
    with pytest.raises(EgressRefused, match="could not be resolved"):
        egress.request("GET", "http://nowhere.invalid/")
    with pytest.raises(EgressRefused, match="could not be reached"):
        egress.request("GET", f"http://127.0.0.1:{free_port()}/", allowlist=LOOPBACK)


# Modules that may open HTTP connections themselves, and why; everything else goes through workbridge.egress.
DIRECT_HTTP = {
    "workbridge/egress.py": "the egress guard itself",
    "accounts/cancellation.py": "the transport egress and the gateway's clients send through, so that a cancel "
                                "shuts a request's connection; it calls no URL itself",
    "serving/gateway.py": "engines the platform started; external endpoints through egress.pinned",
    "serving/engines/process.py": "health of engine processes the platform started, on loopback",
    "serving/engines/llamacpp.py": "a local llama-server's /props, /metrics and /slots",
    "serving/engines/vllm.py": "a vLLM server the platform started: its /health and /metrics",
    "rag_studio/gateway_client.py": "the platform's own gateway (settings.GATEWAY_URL)",
    "rag_studio/embedding.py": "the platform's own gateway (settings.GATEWAY_URL)",
    "workbridge/mcp_client.py": "MCP servers: an HTTP one through egress.guarded_async_client",
    "agent_studio/strategies.py": "the platform's own gateway (settings.GATEWAY_URL)",
    "serving/groups/calibration.py": "a group's members through the platform's own gateway (settings.GATEWAY_URL)",
    "enhancement/runner.py": "evaluation replies through the platform's own gateway (settings.GATEWAY_URL)",
}
OPENS_HTTP = re.compile(r"^\s*(import|from)\s+(httpx|requests|urllib3|aiohttp|openai|langchain_openai|urllib\.request"
                        r"|http\.client|mcp\.client)\b")


def test_no_module_outside_the_egress_guard_and_the_engines_opens_http_itself():
    apps = ["accounts", "assets", "cluster", "serving", "workbridge", "rag_studio", "enhancement", "agent_studio",
            "runtime", "factory"]
    offenders = [f"{source.relative_to(ROOT)}: {line.strip()}"
                 for app in apps for source in sorted((ROOT / app).rglob("*.py"))
                 if source.relative_to(ROOT).as_posix() not in DIRECT_HTTP
                 for line in source.read_text().splitlines() if OPENS_HTTP.match(line)]

    assert not offenders, "outbound HTTP outside workbridge.egress:\n" + "\n".join(offenders)
    assert all((ROOT / path).exists() for path in DIRECT_HTTP), "an exempted module moved: update DIRECT_HTTP"


@pytest.mark.parametrize("url", ["http://0177.0.0.1:8081/", "http://[::1/", "http://exa mple.com/", "http://:80/",
                                 "http://%/"])
def test_a_url_httpx_cannot_read_is_refused_by_request_too_never_an_httpx_error(url):
    with pytest.raises(EgressRefused, match="is not a valid URL|has no host|could not be resolved"):
        egress.request("GET", url, allowlist=LOOPBACK)
    with pytest.raises(EgressRefused):
        egress.request("GET", url, params={"q": "1"}, allowlist=LOOPBACK)
