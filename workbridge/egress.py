"""The one way the platform calls a URL a user gave it (DESIGN.md §5, "Egress and secrets"): external model
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

from accounts.cancellation import CancellableTransport

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


LOOPBACK = [ipaddress.ip_network(n) for n in ("127.0.0.0/8", "::1/128")]


@dataclass(frozen=True)
class AllowRule:
    """One allowlist entry: a host (`api.corp.example`, `*.corp.example` for its subdomains) or a network
    (`10.1.0.0/16`), on every port or on a port range (`127.0.0.1:8081`, `10.0.0.0/8:8000-8100`)."""

    host: str = ""
    network: object = None
    ports: tuple[int, int] | None = None
    # FACTORY_EGRESS_ALLOW's entries are the operator's: only they may open the platform's own ports, by naming them.
    operator: bool = False

    def covers(self, host: str, address, port: int) -> bool:
        if self.ports is not None and not self.ports[0] <= port <= self.ports[1]:
            return False
        if self.network is not None:
            return address.version == self.network.version and address in self.network
        return host == self.host or (self.host.startswith("*.") and host.endswith(self.host[1:]))


def _split_ports(entry: str) -> tuple[str, tuple[int, int] | None]:
    """`target[:port[-port]]`, an IPv6 target in brackets when it has a port."""
    if entry.startswith("["):
        target, _, rest = entry[1:].partition("]")
        if rest and not rest.startswith(":"):
            raise EgressRefused(f"'{entry}': write an IPv6 address with a port as [address]:port.")
        spec = rest[1:] if rest else ""
    elif entry.count(":") == 1:
        target, spec = entry.split(":")
    else:
        return entry, None
    if not spec:
        return target, None
    low, _, high = spec.partition("-")
    if not (low.isdigit() and (not high or high.isdigit())):
        raise EgressRefused(f"'{entry}': a port is a number (8081) or a range (8000-8100).")
    ports = (int(low), int(high or low))
    if not 1 <= ports[0] <= ports[1] <= 65535:
        raise EgressRefused(f"'{entry}': ports run from 1 to 65535, the lower first.")
    return target, ports


def _rule(entry: str, *, operator: bool = False) -> AllowRule:
    target, ports = _split_ports(entry.strip().lower())
    try:
        return AllowRule(network=ipaddress.ip_network(target, strict=False), ports=ports, operator=operator)
    except ValueError:
        pass
    name = target.removeprefix("*.")
    labels = name.split(".")
    if not name or len(name) > 253 or not all(label and len(label) <= 63 and label.replace("-", "").isalnum()
                                              for label in labels):
        raise EgressRefused(f"'{entry}' is neither a host name (or *.domain) nor an address or network, with an "
                            f"optional :port or :port-port.")
    return AllowRule(host=target, ports=ports, operator=operator)


@dataclass(frozen=True)
class Allowlist:
    """What may be called though it is not public: the operator's and the workspace's rules. `own_ports` are the
    platform's own services (its web port, Redis) on `own_networks` (loopback, its nodes): a rule without a port never
    opens them, and only an operator's rule that names the port does."""

    rules: tuple[AllowRule, ...] = ()
    own_ports: frozenset[int] = frozenset()
    own_networks: tuple = tuple(LOOPBACK)

    @classmethod
    def of(cls, entries: Iterable[str], *, operator_entries: Iterable[str] = (), own_ports: Iterable[int] = (),
           own_addresses: Iterable[str] = ()) -> "Allowlist":
        rules = [_rule(entry, operator=True) for entry in operator_entries if entry.strip()]
        rules += [_rule(entry) for entry in entries if entry.strip()]
        networks = list(LOOPBACK) + [ipaddress.ip_network(address, strict=False) for address in own_addresses]
        return cls(tuple(rules), frozenset(own_ports), tuple(networks))

    def _is_own_service(self, address, port: int) -> bool:
        return port in self.own_ports and any(address.version == network.version and address in network
                                              for network in self.own_networks)

    def permits(self, host: str, address, port: int) -> bool:
        host = host.lower().rstrip(".")
        own = self._is_own_service(address, port)
        return any(rule.covers(host, address, port) and (not own or (rule.operator and rule.ports is not None))
                   for rule in self.rules)


def check_entry(entry: str) -> str:
    """An allowlist entry as stored (`10.1.0.0/16`, `api.corp.example:8443`, `[::1/128]:8081`), or EgressRefused
    saying what is wrong with it."""
    rule = _rule(entry)
    target = str(rule.network) if rule.network is not None else rule.host
    if rule.ports is None:
        return target
    if ":" in target:
        target = f"[{target}]"
    ports = str(rule.ports[0]) if rule.ports[0] == rule.ports[1] else f"{rule.ports[0]}-{rule.ports[1]}"
    return f"{target}:{ports}"


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


def parse_url(url: str | httpx.URL, params: dict | None = None) -> httpx.URL:
    """httpx's reading of a URL, or EgressRefused saying why it cannot be read (never httpx's own exception)."""
    try:
        return httpx.URL(str(url), params=params) if params else httpx.URL(str(url))
    except (httpx.InvalidURL, TypeError, ValueError) as exc:
        raise EgressRefused(f"'{url}' is not a valid URL: {exc}") from exc


def check(url: str | httpx.URL, allowlist: Allowlist = Allowlist()) -> Destination:
    """Resolve the URL's host once and check every address; the first is where the request goes."""
    parsed = url if isinstance(url, httpx.URL) else parse_url(url)
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
    for text in addresses:
        address = ipaddress.ip_address(text.split("%")[0])
        if not (is_public(address) or allowlist.permits(host, address, port)):
            raise EgressRefused(
                f"'{host}' resolves to {address}, which is not a public address (port {port}); a workspace admin "
                f"can allow it under Work Bridge → Allowlist.")
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
        # No environment proxies: a proxy would connect to the name, undoing the pinning. A run's cancel shuts the
        # request's connection (a tool or HTTP node waiting on a slow server stops at once).
        _client = httpx.Client(trust_env=False, follow_redirects=False,
                               transport=CancellableTransport(trust_env=False))
    return _client


def _next_hop(response: httpx.Response, method: str, url: httpx.URL) -> tuple[str, httpx.URL]:
    location = response.headers.get("location")
    if not location:
        raise EgressRefused(f"{url} redirected ({response.status_code}) without saying where.")
    if response.status_code == 303 or (response.status_code in (301, 302) and method == "POST"):
        method = "GET"
    try:
        return method, url.join(location)
    except (httpx.InvalidURL, TypeError, ValueError) as exc:
        raise EgressRefused(f"{url} redirected to '{location}', which is not a valid URL.") from exc


def request(method: str, url: str, *, allowlist: Allowlist = Allowlist(), headers: dict | None = None,
            json_body=None, content: bytes | None = None, params: dict | None = None,
            timeout_s: float = DEFAULT_TIMEOUT_S, max_bytes: int = DEFAULT_MAX_BYTES) -> Answer:
    """Call a user-supplied URL: checked, pinned, redirects followed and checked, the answer capped at `max_bytes`
    and the whole exchange at `timeout_s`. Transport failures and broken limits raise EgressRefused."""
    deadline = time.monotonic() + timeout_s
    target = parse_url(url, params)
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
