"""The http binding: a tool's config and a call's arguments turned into one HTTP request.

    {"method": "POST", "url": "https://api.example.com/orders/{order_id}/notes",
     "query": {"notify": "notify"}, "header_args": {"request_id": "X-Request-Id"}, "body": "json",
     "headers": {"Accept": "application/json"}, "auth": {"type": "bearer", "secret": "SHOP_TOKEN"}}

`{argument}` placeholders in the URL are filled (URL-quoted); arguments named in `query` go to the query string and
those in `header_args` to headers, each under its wire name (an imported spec's `page[size]` is the argument
`page_size`; in the query string a list repeats the name and an object's keys are parameters of their own, as
OpenAPI sends query values by default); the rest go in a JSON or form body (`body`). With `body: none` (no body
declared) they go to the query string of a GET or DELETE, and as a JSON body of a POST, PUT or PATCH, sent only when
there is any: an API that takes no declared body reads its query parameters from `query`, and an argument the user
added to such a tool is most likely a field the API wants in the body. `body_arg` names an argument whose value is
the whole body (a spec whose body is an array, say). `auth` takes its value from a workspace secret: `bearer`,
`header` (with `name`), `query` (with `name`) or `basic` (with `username`).
"""

import base64
import json
import string
from collections.abc import Callable
from dataclasses import dataclass, field
from urllib.parse import quote, urlencode, urlsplit

from workbridge.vault import MASK

METHODS = {"GET", "POST", "PUT", "PATCH", "DELETE"}
BODILESS = {"GET", "DELETE"}
BODIES = {"json", "form", "none"}
AUTH_TYPES = {"none", "bearer", "header", "query", "basic"}


class ToolConfigInvalid(ValueError):
    pass


def placeholders(url: str) -> list[str]:
    try:
        return [name for _, name, _, _ in string.Formatter().parse(url) if name is not None]
    except ValueError as exc:
        raise ToolConfigInvalid(f"The URL template is malformed: {exc}.") from exc


def check_config(config: dict, parameters: dict) -> dict:
    """The config with its defaults, or ToolConfigInvalid naming what is wrong."""
    if not isinstance(config, dict):
        raise ToolConfigInvalid("The http binding's config must be an object.")
    method = str(config.get("method", "GET")).upper()
    if method not in METHODS:
        raise ToolConfigInvalid(f"'method' must be one of {sorted(METHODS)}.")
    url = config.get("url")
    try:
        parsed = urlsplit(url) if isinstance(url, str) else None
        host = parsed.hostname if parsed else None
    except ValueError:
        parsed = host = None
    if parsed is None or parsed.scheme not in ("http", "https") or not host:
        raise ToolConfigInvalid("'url' must be an http(s) URL, with {argument} placeholders where arguments go.")
    names = set((parameters.get("properties") or {}).keys())
    required = set(parameters.get("required") or [])
    for name in placeholders(url):
        if name not in required:
            raise ToolConfigInvalid(f"The URL uses {{{name}}}, which is not a required argument of the tool.")
    query = _wire_names(config.get("query", {}), names, "query")
    header_args = _wire_names(config.get("header_args", {}), names, "header_args")
    body = config.get("body", "none" if method in BODILESS else "json")
    if body not in BODIES or (body != "none" and method in BODILESS):
        raise ToolConfigInvalid(f"'body' must be one of {sorted(BODIES)}, and 'none' for {method}.")
    body_arg = config.get("body_arg")
    if body_arg is not None and (body != "json" or body_arg not in names):
        raise ToolConfigInvalid("'body_arg' must name an argument of the tool, with a json body.")
    headers = config.get("headers", {})
    if not isinstance(headers, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in
                                                headers.items()):
        raise ToolConfigInvalid("'headers' must map header names to strings.")
    auth = config.get("auth") or {"type": "none"}
    if not isinstance(auth, dict) or auth.get("type") not in AUTH_TYPES:
        raise ToolConfigInvalid(f"'auth.type' must be one of {sorted(AUTH_TYPES)}.")
    if auth["type"] != "none" and not auth.get("secret"):
        raise ToolConfigInvalid("'auth.secret' must name a workspace secret.")
    if auth["type"] in ("header", "query") and not auth.get("name"):
        raise ToolConfigInvalid(f"'auth.name' must say which {auth['type']} carries the secret.")
    checked = {"method": method, "url": url, "query": query, "header_args": header_args, "body": body,
               "headers": headers, "auth": auth}
    return checked | ({"body_arg": body_arg} if body_arg else {})


def _wire_names(mapping, names: set[str], key: str) -> dict[str, str]:
    """`{argument: name on the wire}`; a plain list of arguments sends each under its own name."""
    if isinstance(mapping, list):
        mapping = {name: name for name in mapping if isinstance(name, str)} if all(
            isinstance(name, str) for name in mapping) else None
    if not isinstance(mapping, dict) or not set(mapping) <= names or not all(
            isinstance(wire, str) and wire for wire in mapping.values()):
        raise ToolConfigInvalid(f"'{key}' must map argument names of the tool to the names they are sent under.")
    return mapping


@dataclass
class HttpCall:
    method: str
    url: str
    params: dict = field(default_factory=dict)
    headers: dict = field(default_factory=dict)
    json_body: dict | None = None
    content: bytes | None = None
    secret_values: list[str] = field(default_factory=list)

    def redact(self, text: str) -> str:
        for value in self.secret_values:
            text = text.replace(value, MASK)
        return text

    def describe(self) -> dict:
        """The request as the GUI shows it before and after sending: every secret masked."""
        query = f"{'&' if '?' in self.url else '?'}{urlencode(self.params, doseq=True)}" if self.params else ""
        return {"method": self.method, "url": self.redact(self.url + query),
                "headers": {k: self.redact(v) for k, v in self.headers.items()},
                "body": self.json_body if self.json_body is not None else
                (self.redact(self.content.decode()) if self.content else None)}


def render(config: dict, arguments: dict, secret: Callable[[str], str]) -> HttpCall:
    """The request one call sends; `secret(name)` gives a workspace secret's value."""
    in_url = placeholders(config["url"])
    url = config["url"].format(**{name: quote(str(arguments[name]), safe="") for name in in_url})
    rest = {name: value for name, value in arguments.items() if name not in in_url}
    params = {wire: rest.pop(name) for name, wire in config["query"].items() if name in rest}
    call = HttpCall(method=config["method"], url=url, headers=dict(config["headers"]))
    for name, header in config.get("header_args", {}).items():
        if name in rest:
            value = rest.pop(name)
            call.headers[header] = value if isinstance(value, str) else json.dumps(value)
    if config.get("body_arg"):
        call.json_body = rest.get(config["body_arg"])
    elif config["body"] == "json":
        call.json_body = rest
    elif config["body"] == "form":
        call.content = urlencode({name: str(value) for name, value in rest.items()}).encode()
        call.headers["Content-Type"] = "application/x-www-form-urlencoded"
    elif config["method"] in BODILESS:
        params |= rest
    elif rest:
        call.json_body = rest
    for name, value in params.items():
        # OpenAPI's default for query values (form style, exploded): a list repeats the name, and each key of an
        # object is a parameter of its own.
        if isinstance(value, dict):
            call.params |= {key: _query_text(item) for key, item in value.items()}
        else:
            call.params[name] = [_query_text(item) for item in value] if isinstance(value, list) else \
                _query_text(value)
    auth = config["auth"]
    if auth["type"] != "none":
        value = secret(auth["secret"])
        call.secret_values.append(value)
        if auth["type"] == "bearer":
            call.headers["Authorization"] = f"Bearer {value}"
        elif auth["type"] == "header":
            call.headers[auth["name"]] = value
        elif auth["type"] == "query":
            call.params[auth["name"]] = value
        else:
            token = base64.b64encode(f"{auth.get('username', '')}:{value}".encode()).decode()
            call.headers["Authorization"] = f"Basic {token}"
            call.secret_values.append(token)
    return call


def _query_text(value) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return str(value).lower()
    return str(value) if isinstance(value, int | float) else json.dumps(value)
