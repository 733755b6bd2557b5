"""The one way the platform calls a URL a user gave it (DESIGN.md §7, "Egress and secrets"): external model
endpoints today; tools, OpenAPI specs and MCP servers as Work Bridge grows.

A URL passes only if every address its host resolves to is public, or its host or address is on the allowlist (the
platform's, FACTORY_EGRESS_ALLOW, and the workspace's, set by its admins). The host is resolved once and the request
goes to the address that was checked, with the name kept for the Host header and TLS, so a DNS answer that changes
between the check and the connection (rebinding) cannot redirect it. Redirects are followed here, each hop checked the
same way, and answers are capped in size and time.

httpx does the HTTP; what it cannot do is pin a connection to a checked address, which is why the URL is rewritten to
that address here rather than handed to httpx as typed.
"""

import asyncio
import ipaddress
import json
import socket
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import httpx

SCHEMES = {"http", "https"}
MAX_REDIRECTS = 5
DEFAULT_TIMEOUT_S = 30.0
DEFAULT_MAX_BYTES = 10 * 2**20
# Ranges `is_global` lets through that no user URL should reach: multicast, the IETF protocol block, and the
# translation prefixes whose embedded IPv4 address is checked instead.
NEVER = [ipaddress.ip_network(n) for n in ("224.0.0.0/4", "192.0.0.0/24", "ff00::/8")]
NAT64 = [ipaddress.ip_network(n) for n in ("64:ff9b::/96", "64:ff9b:1::/48")]

Resolver = Callable[[str, int], list[str]]


class EgressRefused(Exception):
    """The URL may not be called, or its answer broke a limit; the message says why, for the user."""


def _system_resolver(host: str, port: int) -> list[str]:
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as exc:
        raise EgressRefused(f"The host '{host}' could not be resolved: {exc}") from exc
    return list(dict.fromkeys(info[4][0] for info in infos))


_resolver: Resolver = _system_resolver


def use_resolver(resolver: Resolver | None) -> None:
    """Tests replace DNS with a scripted one (a rebinding resolver, say); None restores the system's."""
    global _resolver
    _resolver = resolver or _system_resolver


def _embedded_ipv4(address: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    if address.ipv4_mapped:
        return address.ipv4_mapped
    if address.sixtofour:
        return address.sixtofour
    if address.teredo:
        return address.teredo[1]
    if any(address in network for network in NAT64):
        return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    return None


def is_public(address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    """Beyond `is_global`: addresses inside IPv6 translation prefixes are judged by the IPv4 address they carry."""
    if isinstance(address, ipaddress.IPv6Address) and (inner := _embedded_ipv4(address)) is not None:
        return is_public(inner)
    return address.is_global and not any(address in network for network in NEVER)


@dataclass(frozen=True)
class Allowlist:
    """Hosts (`api.corp.example`, or `*.corp.example` for its subdomains) and networks (`10.1.0.0/16`) that may be
    called though they are not public."""

    hosts: frozenset[str] = frozenset()
    networks: tuple = ()

    @classmethod
    def of(cls, entries: Iterable[str]) -> "Allowlist":
        hosts, networks = set(), []
        for entry in entries:
            entry = entry.strip().lower()
            if not entry:
                continue
            try:
                networks.append(ipaddress.ip_network(entry, strict=False))
            except ValueError:
                hosts.add(entry)
        return cls(frozenset(hosts), tuple(networks))

    def names(self, host: str) -> bool:
        host = host.lower().rstrip(".")
        return host in self.hosts or any(entry.startswith("*.") and host.endswith(entry[1:]) for entry in self.hosts)

    def holds(self, address) -> bool:
        return any(address.version == network.version and address in network for network in self.networks)


def check_entry(entry: str) -> str:
    """An allowlist entry as stored, or EgressRefused saying what is wrong with it."""
    entry = entry.strip().lower()
    try:
        return str(ipaddress.ip_network(entry, strict=False))
    except ValueError:
        pass
    name = entry.removeprefix("*.")
    labels = name.split(".")
    if not name or len(name) > 253 or not all(label and len(label) <= 63 and label.replace("-", "").isalnum()
                                              for label in labels):
        raise EgressRefused(f"'{entry}' is neither a host name (or *.domain) nor an address or network.")
    return entry


@dataclass(frozen=True)
class Destination:
    """A checked URL: where to connect, and what to tell the server its name is."""

    url: httpx.URL
    address: str

    @property
    def pinned_url(self) -> httpx.URL:
        host = f"[{self.address}]" if ":" in self.address else self.address
        return self.url.copy_with(host=host)

    @property
    def headers(self) -> dict[str, str]:
        default_port = {"http": 80, "https": 443}[self.url.scheme]
        port = self.url.port
        return {"Host": self.url.host if port in (None, default_port) else f"{self.url.host}:{port}"}

    @property
    def extensions(self) -> dict:
        return {"sni_hostname": self.url.host} if self.url.scheme == "https" else {}


def check(url: str | httpx.URL, allowlist: Allowlist = Allowlist()) -> Destination:
    """Resolve the URL's host once and check every address; the first is where the request goes."""
    try:
        parsed = httpx.URL(str(url))
    except httpx.InvalidURL as exc:
        raise EgressRefused(f"'{url}' is not a valid URL: {exc}") from exc
    if parsed.scheme not in SCHEMES:
        raise EgressRefused(f"Only http and https URLs can be called, not '{parsed.scheme or url}'.")
    host = parsed.host
    if not host:
        raise EgressRefused(f"'{url}' has no host.")
    port = parsed.port or (443 if parsed.scheme == "https" else 80)
    # getaddrinfo also reads decimal, octal and hex IPv4 spellings (2130706433, 0177.0.0.1), so each is checked
    # as the address it really is.
    addresses = _resolver(host, port)
    if not addresses:
        raise EgressRefused(f"The host '{host}' resolved to no address.")
    named = allowlist.names(host)
    for text in addresses:
        address = ipaddress.ip_address(text.split("%")[0])
        if not (named or is_public(address) or allowlist.holds(address)):
            raise EgressRefused(
                f"'{host}' resolves to {address}, which is not a public address; a workspace admin can allow it "
                f"under Work Bridge → Allowlist.")
    return Destination(url=parsed, address=addresses[0].split("%")[0])


@dataclass
class Answer:
    status_code: int
    headers: httpx.Headers
    content: bytes
    url: str
    history: list[str] = field(default_factory=list)

    @property
    def text(self) -> str:
        return self.content.decode(errors="replace")

    def json(self):
        return json.loads(self.content)


_client: httpx.Client | None = None


def _sync_client() -> httpx.Client:
    global _client
    if _client is None:
        # No environment proxies: a proxy would connect to the name, undoing the pinning.
        _client = httpx.Client(trust_env=False, follow_redirects=False)
    return _client


def _next_hop(response: httpx.Response, method: str, url: httpx.URL) -> tuple[str, httpx.URL]:
    location = response.headers.get("location")
    if not location:
        raise EgressRefused(f"{url} redirected ({response.status_code}) without saying where.")
    if response.status_code == 303 or (response.status_code in (301, 302) and method == "POST"):
        method = "GET"
    return method, url.join(location)


def request(method: str, url: str, *, allowlist: Allowlist = Allowlist(), headers: dict | None = None,
            json_body=None, content: bytes | None = None, params: dict | None = None,
            timeout_s: float = DEFAULT_TIMEOUT_S, max_bytes: int = DEFAULT_MAX_BYTES) -> Answer:
    """Call a user-supplied URL: checked, pinned, redirects followed and checked, the answer capped at `max_bytes`
    and the whole exchange at `timeout_s`. Transport failures and broken limits raise EgressRefused."""
    deadline = time.monotonic() + timeout_s
    target = httpx.URL(str(url), params=params) if params else httpx.URL(str(url))
    history = []
    for _ in range(MAX_REDIRECTS + 1):
        destination = check(target, allowlist)
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise EgressRefused(f"{url} did not answer within {timeout_s:g} s.")
        try:
            with _sync_client().stream(method, destination.pinned_url, headers={**(headers or {}),
                                                                                  **destination.headers},
                                       json=json_body, content=content,
                                       timeout=remaining, extensions=destination.extensions) as response:
                if response.is_redirect:
                    history.append(str(target))
                    method, target = _next_hop(response, method, target)
                    if method == "GET":
                        json_body = content = None
                    continue
                body = bytearray()
                for chunk in response.iter_bytes():
                    body += chunk
                    if len(body) > max_bytes:
                        raise EgressRefused(f"The answer from {target.host} is larger than {max_bytes} bytes.")
                    if time.monotonic() > deadline:
                        raise EgressRefused(f"{url} did not answer within {timeout_s:g} s.")
                return Answer(response.status_code, response.headers, bytes(body), str(target), history)
        except httpx.TimeoutException as exc:
            raise EgressRefused(f"{url} did not answer within {timeout_s:g} s.") from exc
        except httpx.HTTPError as exc:
            raise EgressRefused(f"{target.host} could not be reached: {exc.__class__.__name__} {exc}".strip()) from exc
    raise EgressRefused(f"{url} redirected more than {MAX_REDIRECTS} times.")


async def pinned(client: httpx.AsyncClient, method: str, url: str, *, allowlist: Allowlist = Allowlist(),
                 headers: dict | None = None, content: bytes | None = None) -> httpx.Request:
    """An async request to a user-supplied URL, checked and pinned, for a caller that streams the answer itself
    (the gateway relaying an external model). No redirects are followed: an OpenAI endpoint does not redirect."""
    destination = await asyncio.to_thread(check, url, allowlist)
    return client.build_request(method, destination.pinned_url, headers={**(headers or {}), **destination.headers},
                                content=content, extensions=destination.extensions)


class _GuardedTransport(httpx.AsyncBaseTransport):
    """Checks and pins every request a library sends through its own client, as `request` does; redirects are
    not followed (the client is made without them)."""

    def __init__(self, allowlist: Allowlist):
        self._allowlist = allowlist
        self._inner = httpx.AsyncHTTPTransport()

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        try:
            destination = await asyncio.to_thread(check, request.url, self._allowlist)
        except EgressRefused as exc:
            # httpx errors are what such a library expects and reports; the reason is kept.
            raise httpx.ConnectError(str(exc), request=request) from exc
        request.url = destination.pinned_url
        request.headers["Host"] = destination.headers["Host"]
        request.extensions = {**request.extensions, **destination.extensions}
        return await self._inner.handle_async_request(request)

    async def aclose(self) -> None:
        await self._inner.aclose()


def guarded_async_client(*, allowlist: Allowlist = Allowlist(), headers: dict | None = None,
                         timeout_s: float = DEFAULT_TIMEOUT_S) -> httpx.AsyncClient:
    """An httpx client for a library that speaks its own protocol over HTTP (the MCP client), whose every request
    is checked and pinned here."""
    return httpx.AsyncClient(transport=_GuardedTransport(allowlist), headers=headers, trust_env=False,
                             follow_redirects=False, timeout=httpx.Timeout(timeout_s))
