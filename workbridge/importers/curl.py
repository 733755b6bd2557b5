"""One cURL command (as an API's docs or a browser's "Copy as cURL" give it) made into one draft http tool.

The command is split with shlex, as a POSIX shell would. The query string's and the body's values become optional
arguments with the value as their default, typed loosely, since one example says little about what else the API
takes: a query or form value is a string, as it is on the wire (`limit=5` takes "7"), and a JSON body's value keeps
its JSON type (a number is any number, an object's keys are all optional). A bearer token, an API-key header or a
user:password become workspace secrets the tool refers to, so that no credential is stored in a tool's definition.
Options that only change how curl itself behaves (-s, -L, -k, -v, --compressed) are accepted and ignored; those a
tool cannot reproduce (a file upload, a cookie jar) are refused by name.
"""

import json
import re
import shlex
from urllib.parse import parse_qsl, urlsplit, urlunsplit

from workbridge.importers import ImportInvalid, ToolDraft, argument_name, function_name

DATA = {"-d", "--data", "--data-raw", "--data-binary", "--data-ascii", "--data-urlencode"}
HEADER = {"-H", "--header"}
IGNORED_FLAGS = {"-s", "--silent", "-S", "--show-error", "-L", "--location", "-k", "--insecure", "-v", "--verbose",
                 "-i", "--include", "--compressed", "-f", "--fail", "-g", "--globoff", "-N", "--no-buffer",
                 "--http1.1", "--http2", "-#", "--progress-bar", "--fail-with-body"}
IGNORED_WITH_VALUE = {"-m", "--max-time", "--connect-timeout", "-o", "--output", "-w", "--write-out", "--retry",
                      "-e", "--referer"}
REFUSED = {"-F": "a multipart form (file upload)", "--form": "a multipart form (file upload)",
           "-T": "a file upload", "--upload-file": "a file upload",
           "-c": "a cookie jar", "--cookie-jar": "a cookie jar",
           "-x": "a proxy", "--proxy": "a proxy", "--unix-socket": "a Unix socket", "-K": "a config file",
           "--config": "a config file", "-E": "a client certificate", "--cert": "a client certificate"}
ATTACHED = {"-X", "-H", "-d", "-u", "-A", "-b", "-m", "-o", "-w", "-e"}
KEY_HEADERS = re.compile(r"(api[-_]?key|token|secret|auth)", re.IGNORECASE)


def draft_from_curl(command: str) -> ToolDraft:
    words = _words(command)
    method, url, headers, data, user, get = None, None, {}, [], None, False
    json_data = False
    index = 1
    while index < len(words):
        word = words[index]
        if word.startswith("--") and "=" in word:
            (option, value), step = word.split("=", 1), 1
        elif word[:2] in ATTACHED and len(word) > 2:  # -XPOST, -H'Accept: x'
            option, value, step = word[:2], word[2:], 1
        else:
            option, value, step = word, words[index + 1] if index + 1 < len(words) else None, 2
        if option in ("-X", "--request"):
            method = _needs(option, value).upper()
        elif option in HEADER:
            name, colon, header_value = _needs(option, value).partition(":")
            if not colon or not name.strip():
                raise ImportInvalid(f"'{option} {value}' is not a header ('Name: value').")
            headers[name.strip()] = header_value.strip()
        elif option in DATA:
            data.append(_needs(option, value))
        elif option == "--json":
            data.append(_needs(option, value))
            json_data = True
        elif option in ("-u", "--user"):
            user = _needs(option, value)
        elif option in ("-A", "--user-agent"):
            headers["User-Agent"] = _needs(option, value)
        elif option in ("-b", "--cookie"):
            headers["Cookie"] = _needs(option, value)
        elif option == "--oauth2-bearer":
            headers["Authorization"] = f"Bearer {_needs(option, value)}"
        elif option == "--url":
            url = _needs(option, value)
        elif option in ("-G", "--get"):
            get, step = True, 1
        elif option in IGNORED_FLAGS:
            step = 1
        elif option in IGNORED_WITH_VALUE:
            _needs(option, value)
        elif option in REFUSED:
            raise ImportInvalid(f"the command uses {option} ({REFUSED[option]}), which a tool cannot send.")
        elif re.fullmatch(r"-[A-Za-z#]{2,}", word) and all(f"-{flag}" in IGNORED_FLAGS for flag in word[1:]):
            step = 1  # -sSL
        elif word.startswith("-") and len(word) > 1:
            raise ImportInvalid(f"the option {word} is not one this import knows.")
        else:
            if url is not None:
                raise ImportInvalid(f"it names two URLs ('{url}' and '{word}'); import one request at a time.")
            url, step = word, 1
        index += step
    if url is None:
        raise ImportInvalid("the command has no URL.")
    return _draft(method, url, headers, data, user, get, json_data)


def _words(command: str) -> list[str]:
    if not isinstance(command, str):
        raise ImportInvalid("give the command as text.")
    text = re.sub(r"\\\r?\n", " ", command.strip())  # the line continuations docs print
    try:
        words = shlex.split(text)
    except ValueError as exc:
        raise ImportInvalid(f"it does not split into words as a shell would: {exc}.") from exc
    if not words or words[0].rsplit("/", 1)[-1] != "curl":
        raise ImportInvalid("it is not a curl command (it must start with 'curl').")
    return words


def _needs(option: str, value: str | None) -> str:
    if value is None:
        raise ImportInvalid(f"{option} needs a value.")
    return value


def _draft(method, url, headers, data, user, get, json_data) -> ToolDraft:
    if "://" not in url:
        url = f"http://{url}"
    try:
        parts = urlsplit(url)
        host = parts.hostname
    except ValueError as exc:
        raise ImportInvalid(f"'{url}' is not a URL: {exc}.") from exc
    if parts.scheme not in ("http", "https") or not host:
        raise ImportInvalid(f"'{url}' is not an http(s) URL.")
    secrets, taken, properties = {}, set(), {}
    config = {"query": {}, "header_args": {}, "headers": {}}
    secret_base = argument_name(host, set()).upper()

    for wire, example in parse_qsl(parts.query, keep_blank_values=True):
        if wire in config["query"].values():
            continue
        name = argument_name(wire, taken)
        properties[name], config["query"][name] = _text(example), wire
    body = "&".join(data)  # as curl joins several -d
    content_type = next((value for name, value in headers.items() if name.lower() == "content-type"), "")
    if body and get:
        for wire, example in parse_qsl(body, keep_blank_values=True):
            name = argument_name(wire, taken)
            properties[name], config["query"][name] = _text(example), wire
        body = ""
    method = method or ("POST" if body else "GET")
    if body:
        parsed = _json(body) if (json_data or "json" in content_type.lower() or body.lstrip()[:1] in "{[") \
            else None
        if parsed is not None and isinstance(parsed, dict) and all(
                isinstance(key, str) and key.isidentifier() and key not in taken for key in parsed):
            config["body"] = "json"
            for key, example in parsed.items():
                properties[key] = {**_json_type(example), "default": example}
                taken.add(key)
        elif parsed is not None:
            name = argument_name("body", taken)
            properties[name] = {**_json_type(parsed), "default": parsed}
            config["body"], config["body_arg"] = "json", name
        else:
            config["body"] = "form"
            for wire, example in parse_qsl(body, keep_blank_values=True):
                if not wire.isidentifier() or wire in taken:
                    raise ImportInvalid(f"the form field '{wire}' cannot be an argument name.")
                taken.add(wire)
                properties[wire] = _text(example)
            if not properties:
                raise ImportInvalid("its body is neither JSON nor form fields.")
    elif method not in ("GET", "DELETE"):
        config["body"] = "none"

    for name, value in headers.items():
        lowered = name.lower()
        if lowered == "authorization" and value.lower().startswith("bearer "):
            secrets[f"{secret_base}_TOKEN"] = value[7:].strip()
            config["auth"] = {"type": "bearer", "secret": f"{secret_base}_TOKEN"}
        elif lowered == "authorization":
            secrets[f"{secret_base}_AUTHORIZATION"] = value
            config["auth"] = {"type": "header", "name": name, "secret": f"{secret_base}_AUTHORIZATION"}
        elif KEY_HEADERS.search(name) and "auth" not in config:
            secret = f"{secret_base}_{argument_name(name, set()).upper()}"
            secrets[secret] = value
            config["auth"] = {"type": "header", "name": name, "secret": secret}
        elif lowered in ("content-type", "content-length", "host"):
            continue
        else:
            config["headers"][name] = value
    if user is not None and "auth" not in config:
        username, _, password = user.partition(":")
        secrets[f"{secret_base}_PASSWORD"] = password
        config["auth"] = {"type": "basic", "username": username, "secret": f"{secret_base}_PASSWORD"}

    config["method"] = method
    config["url"] = urlunsplit((parts.scheme, parts.netloc, parts.path or "/", "", ""))
    schema = {"type": "object", "properties": properties}
    last = [segment for segment in parts.path.split("/") if segment and not segment.isdigit()]
    return ToolDraft(name=function_name(f"{method.lower()}_{last[-1] if last else host.split('.')[0]}"),
                     description=f"{method} {host}{parts.path or '/'}: describe what this does for the model.",
                     parameters=schema, config=config, secrets=secrets)


def _json(text: str):
    try:
        return json.loads(text)
    except ValueError:
        return None


def _text(example: str) -> dict:
    return {"type": "string", "default": example}


def _json_type(example) -> dict:
    """A JSON value's type, loosely: the JSON type, not a narrower one (2 is a number, not an integer), no key
    required, and an array's items typed only when every example item has the same type."""
    if isinstance(example, bool):
        return {"type": "boolean"}
    if isinstance(example, int | float):
        return {"type": "number"}
    if isinstance(example, str):
        return {"type": "string"}
    if isinstance(example, dict):
        return {"type": "object", "properties": {key: _json_type(value) for key, value in example.items()}}
    if isinstance(example, list):
        kinds = [_json_type(item) for item in example]
        return {"type": "array", **({"items": kinds[0]} if kinds and all(kind == kinds[0] for kind in kinds) else {})}
    return {}  # null says nothing of the type
