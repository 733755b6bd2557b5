"""OpenAPI 3.0/3.1 and Swagger 2.0 specs (JSON or YAML) made into one draft http tool per operation.

Real-world specs seldom validate (httpbin's has `type: int` and fields the format does not have; drf-spectacular
gives defaults that their own schemas refuse), so by default a spec is read leniently: what its authors meant is
repaired where it is clear (workbridge.importers.repairs), each repair is listed with its JSON path, and each
operation that still cannot be a tool is skipped with the reason while the others are imported. `strict` refuses, as
a whole, a spec that openapi-spec-validator does not pass. Each draft's arguments are checked as JSON Schema and its
request as an http binding before it is offered, so that whatever the preview shows can be saved.

Local `$ref`s (`#/components/schemas/Pet`) are resolved here, with a depth bound for recursive schemas; a `$ref` to
another document is refused, because following it would fetch a URL or read a file outside the egress guard.
Parameters become arguments: path ones fill `{placeholders}`, query and header ones go out under their wire names,
and a JSON (or form) body's properties join them, or the whole body becomes one argument when its properties cannot
(not an object, or a name that clashes). OpenAPI's schema dialect is brought to JSON Schema 2020-12 (`nullable`,
boolean `exclusiveMinimum`, Swagger's `type: file`), since every call is checked against the tool's schema with
jsonschema.
"""

import copy
import json
from dataclasses import dataclass
from urllib.parse import urljoin, urlsplit

import yaml
from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError
from openapi_spec_validator import validate
from openapi_spec_validator.validation.exceptions import OpenAPIValidationError, ValidatorDetectError
from referencing.exceptions import Unresolvable

from workbridge import http_tools
from workbridge.importers import ImportInvalid, ToolDraft, argument_name, function_name, repairs, unique_names

PLACES = {"path", "query", "header", "cookie", "body", "formData"}
MAX_NODES = 200_000  # a spec, its YAML aliases expanded, may hold at most this many values
REF_DEPTH = 8  # a schema that refers to itself is cut to {} this deep
# OpenAPI's own schema words that JSON Schema 2020-12 does not have, or means otherwise.
OPENAPI_ONLY = {"nullable", "discriminator", "xml", "externalDocs", "example", "x-nullable"}
SWAGGER_SCHEMA_KEYS = {"type", "format", "items", "enum", "default", "minimum", "maximum", "exclusiveMinimum",
                       "exclusiveMaximum", "minLength", "maxLength", "pattern", "minItems", "maxItems",
                       "uniqueItems", "multipleOf", "description"}


class BaseUrlNeeded(ImportInvalid):
    pass


@dataclass
class SpecReading:
    document: dict  # as given: stored with its tools
    drafts: list[ToolDraft]
    # {"operation": "TRACE /anything", "path": "paths./anything.trace", "reason": ...}
    skipped: list[dict]
    # {"path": "definitions.Pet.properties.age.type", "reason": "'int' read as integer"}
    repaired: list[dict]


def read_spec(text: str, *, base_url: str | None = None, strict: bool = False) -> SpecReading:
    """One draft per operation that can be a tool; ImportInvalid when none can, or (strict) the spec does not
    validate."""
    document = _parsed(text)
    if strict:
        _validate(document)
        usable, repaired = document, []
    else:
        repair = repairs.repair(document)
        usable, repaired = repair.document, repair.notes
    made, skipped = _drafts(usable, base_url=base_url)
    return SpecReading(document=document, drafts=made, skipped=skipped, repaired=repaired)


def _parsed(text: str) -> dict:
    try:
        document = json.loads(text)
    except ValueError:
        try:
            document = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            where = getattr(exc, "problem_mark", None)
            line = f" (line {where.line + 1})" if where is not None else ""
            raise ImportInvalid(f"it is neither JSON nor YAML{line}: {getattr(exc, 'problem', exc)}") from exc
    if not isinstance(document, dict):
        raise ImportInvalid("it is not an OpenAPI or Swagger document (expected an object at the top).")
    _bounded(document)
    document = json.loads(json.dumps(document, default=str))  # YAML dates and the like as text, as JSON has them
    if "openapi" not in document and "swagger" not in document:
        raise ImportInvalid("it has neither an 'openapi' nor a 'swagger' version field.")
    return document


def _validate(document: dict) -> None:
    if not isinstance(document.get("openapi", document.get("swagger")), str):
        raise ImportInvalid("its version is not text (write it quoted, e.g. '3.0.3' or '2.0').")
    try:
        validate(document)
    except ValidatorDetectError as exc:
        raise ImportInvalid(f"its version is not OpenAPI 3.0, 3.1 or Swagger 2.0 ({exc}).") from exc
    except OpenAPIValidationError as exc:
        path = "/".join(str(part) for part in getattr(exc, "absolute_path", []) or [])
        raise ImportInvalid(f"it does not validate{f' at {path}' if path else ''}: {exc.message}") from exc
    except Unresolvable as exc:
        raise ImportInvalid(f"it does not validate: its $ref {exc.ref} points at nothing.") from exc
    except (KeyError, TypeError, AttributeError) as exc:
        # The validator's checks beyond the format's schema assume well-formed schema objects, and fail on others.
        raise ImportInvalid(f"it does not validate: a schema object is malformed (at {exc}).") from exc


def _bounded(document) -> None:
    """Refuse a document that would be huge once YAML aliases are expanded (a 'billion laughs' spec), or that
    refers to another document: the validator would fetch it itself, past the egress guard."""
    count, stack = 0, [document]
    while stack:
        node = stack.pop()
        count += 1
        if count > MAX_NODES:
            raise ImportInvalid(f"it holds more than {MAX_NODES} values once its aliases are expanded.")
        if isinstance(node, dict):
            for key in ("$ref", "$dynamicRef"):
                if key in node and not str(node[key]).startswith("#"):
                    _pointer(document, str(node[key]))  # raises, naming the reference
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)


def _drafts(document: dict, *, base_url: str | None = None) -> tuple[list[ToolDraft], list[dict]]:
    """One draft per operation, and the operations left out with the reason (`{"operation", "path", "reason"}`)."""
    swagger, paths = "swagger" in document, document.get("paths")
    if not isinstance(paths, dict) or not paths:
        raise ImportInvalid("it has no operations.")
    base = _base_url(document, base_url, swagger)
    made, skipped = [], []
    for path, item in paths.items():
        item = _resolve(document, item)
        for method, operation in item.items():
            if method not in repairs.HTTP_METHODS:
                continue
            key = f"{method.upper()} {path}"
            try:
                if method.upper() not in http_tools.METHODS:
                    raise ImportInvalid(f"method not supported: tools send {', '.join(sorted(http_tools.METHODS))}.")
                if not isinstance(operation, dict):
                    raise ImportInvalid("it is not an operation object.")
                made.append(_draft(document, key, base, path, method, _resolve(document, operation),
                                   _listed(item.get("parameters")), swagger))
            except ImportInvalid as exc:
                skipped.append({"operation": key, "path": f"paths.{path}.{method}", "reason": str(exc)})
    if not made and not skipped:
        raise ImportInvalid("it has no operations.")
    return unique_names(made), skipped


def _listed(parameters) -> list:
    if parameters is not None and not isinstance(parameters, list):
        raise ImportInvalid("its parameters are not a list.")
    return parameters or []


def _base_url(document: dict, given: str | None, swagger: bool) -> str:
    if swagger:
        host, schemes, base_path = document.get("host"), document.get("schemes"), str(document.get("basePath") or "")
        scheme = schemes[0] if isinstance(schemes, list) and schemes else "https"
        declared = f"{scheme}://{host}{base_path}" if host else base_path
    else:
        servers = document.get("servers")
        server = servers[0] if isinstance(servers, list) and servers and isinstance(servers[0], dict) else {}
        declared, variables = str(server.get("url") or ""), server.get("variables")
        for name, variable in (variables.items() if isinstance(variables, dict) else ()):
            if isinstance(variable, dict):
                declared = declared.replace(f"{{{name}}}", str(variable.get("default", "")))
    try:
        parts = urlsplit(declared)
        absolute = bool(parts.scheme and parts.hostname)
    except ValueError as exc:
        raise ImportInvalid(f"its server URL '{declared}' is not a URL: {exc}.") from exc
    if given:
        given = given.rstrip("/") + "/"
        return urljoin(given, declared.lstrip("/")) if declared and not parts.scheme else given
    if not absolute:
        what = f"a relative server URL ('{declared}')" if declared else "no server URL"
        raise BaseUrlNeeded(f"The spec has {what}: give the API's base URL, e.g. https://api.example.com.")
    return declared


def _draft(document: dict, key: str, base: str, path: str, method: str, operation: dict, shared: list,
           swagger: bool) -> ToolDraft:
    parameters = {}
    for raw in [*shared, *_listed(operation.get("parameters"))]:
        parameter = _resolve(document, raw)
        where, wire = parameter.get("in"), parameter.get("name")
        if not isinstance(where, str) or where not in PLACES or not isinstance(wire, str) or not wire:
            raise ImportInvalid(f"a parameter has no name, or no place to go ('in': {json.dumps(where)}).")
        parameters[(where, wire)] = parameter  # an operation's own one wins
    taken: set[str] = set()
    properties, required = {}, []
    config = {"method": method.upper(), "query": {}, "header_args": {}, "headers": {}}
    url_path = path
    body_params = []
    for (where, wire), parameter in parameters.items():
        if where in ("body", "formData"):
            body_params.append(parameter)
            continue
        if where == "cookie":
            if parameter.get("required"):
                raise ImportInvalid(f"it needs the cookie '{wire}', which tools do not send.")
            continue
        name = argument_name(wire, taken)
        schema = _parameter_schema(document, parameter, swagger)
        properties[name] = schema
        if where == "path":
            url_path = url_path.replace(f"{{{wire}}}", f"{{{name}}}")
            required.append(name)
        else:
            (config["query"] if where == "query" else config["header_args"])[name] = wire
            if parameter.get("required"):
                required.append(name)
    body = _body(document, operation, body_params, swagger)
    if body is not None and method in ("get", "delete"):
        raise ImportInvalid(f"it sends a body with {method.upper()}, which tools do not.")
    if body is not None:
        kind, schema, body_required = body
        config["body"] = kind
        fields = schema.get("properties") if isinstance(schema, dict) and (
            schema.get("type") == "object" or "properties" in schema) else None
        names_fit = isinstance(fields, dict) and all(
            isinstance(name, str) and name.isidentifier() and name not in taken for name in fields)
        if kind == "form" or names_fit:
            for name, field_schema in (fields or {}).items():
                properties[name] = field_schema
                taken.add(name)
            declared = _listed_names(schema.get("required") if isinstance(schema, dict) else None)
            required += [name for name in declared if name in (fields or {})]
        else:
            name = argument_name("body", taken)
            properties[name] = schema
            config["body_arg"] = name
            if body_required:
                required.append(name)
    elif method in ("post", "put", "patch"):
        config["body"] = "none"
    config["url"] = base.rstrip("/") + url_path
    auth = _auth(document, operation, swagger)
    if auth:
        config["auth"] = auth
    summary = " ".join(str(operation.get(part, "")).strip() for part in ("summary", "description")).strip()
    parameters_schema = {"type": "object", "properties": properties}
    if required:
        parameters_schema["required"] = list(dict.fromkeys(required))
    try:
        Draft202012Validator.check_schema(parameters_schema)
        http_tools.check_config(config, parameters_schema)
    except SchemaError as exc:
        where = ".".join(str(part) for part in exc.path)
        raise ImportInvalid(f"its arguments are not valid JSON Schema at {where}: {exc.message}") from exc
    except http_tools.ToolConfigInvalid as exc:
        raise ImportInvalid(f"no request can be made of it: {exc}") from exc
    return ToolDraft(name=function_name(str(operation.get("operationId") or f"{method}_{path}")),
                     description=(summary or key)[:2000], parameters=parameters_schema, config=config,
                     operation=key)


def _listed_names(names) -> list:
    return [name for name in names if isinstance(name, str)] if isinstance(names, list) else []


def _body(document: dict, operation: dict, body_params: list, swagger: bool):
    """(kind, schema, required) of the request body, or None; ImportInvalid for a body tools cannot send."""
    if swagger:
        for parameter in body_params:
            if parameter.get("in") == "body":
                return "json", _schema(document, parameter.get("schema") or {}), bool(parameter.get("required"))
        if body_params:
            if any(parameter.get("type") == "file" for parameter in body_params):
                raise ImportInvalid("it uploads a file (multipart), which tools do not send.")
            fields = {parameter["name"]: _parameter_schema(document, parameter, swagger) for parameter in body_params}
            return "form", {"type": "object", "properties": fields,
                            "required": [p["name"] for p in body_params if p.get("required")]}, True
        return None
    body = _resolve(document, operation.get("requestBody") or {})
    content = body.get("content") or {}
    if not isinstance(content, dict) or not content:
        return None
    for media, kind in (("application/json", "json"), ("application/x-www-form-urlencoded", "form")):
        matches = [value for name, value in content.items() if name.split(";")[0].strip() == media
                   or (kind == "json" and name.split(";")[0].strip().endswith("+json"))]
        if matches:
            declared = matches[0].get("schema") if isinstance(matches[0], dict) else None
            return kind, _schema(document, declared or {}), bool(body.get("required"))
    raise ImportInvalid(f"its body is {', '.join(content)}, and tools send JSON or form bodies.")


def _parameter_schema(document: dict, parameter: dict, swagger: bool) -> dict:
    if swagger and "schema" not in parameter:
        if parameter.get("type") == "file":
            raise ImportInvalid("it uploads a file (multipart), which tools do not send.")
        schema = {key: value for key, value in parameter.items() if key in SWAGGER_SCHEMA_KEYS}
        if parameter.get("type") == "array" and "items" not in schema:
            schema["items"] = {}
    else:
        declared = parameter.get("schema")
        schema = dict(declared) if isinstance(declared, dict) else {}
        if parameter.get("description") and "description" not in schema:
            schema["description"] = parameter["description"]
    return _schema(document, schema)


def _schema(document: dict, schema, depth: int = 0):
    """An OpenAPI schema as JSON Schema 2020-12, with local $refs inlined."""
    if isinstance(schema, list):
        return [_schema(document, item, depth) for item in schema]
    if not isinstance(schema, dict):
        return schema
    if "$ref" in schema:
        if depth >= REF_DEPTH:
            return {}
        return _schema(document, _pointer(document, schema["$ref"]), depth + 1)
    converted = {}
    for key, value in schema.items():
        if key in OPENAPI_ONLY or key.startswith("x-"):
            continue
        if key in ("properties", "patternProperties", "$defs", "definitions") and isinstance(value, dict):
            converted[key] = {name: _schema(document, item, depth) for name, item in value.items()}
        elif key in ("exclusiveMinimum", "exclusiveMaximum") and isinstance(value, bool):
            bound = "minimum" if key == "exclusiveMinimum" else "maximum"
            if value and bound in schema:
                converted[key] = schema[bound]
        elif key in ("minimum", "maximum") and schema.get(f"exclusive{key.title()}") is True:
            continue
        elif key == "type" and value == "file":
            converted[key] = "string"
        else:
            converted[key] = _schema(document, value, depth)
    if (schema.get("nullable") or schema.get("x-nullable")) and isinstance(converted.get("type"), str):
        converted["type"] = [converted["type"], "null"]
    return converted


def _resolve(document: dict, node):
    """A Path Item, Parameter or Request Body that is a $ref, followed (a few hops at most)."""
    for _ in range(REF_DEPTH):
        if not isinstance(node, dict) or "$ref" not in node:
            return node if isinstance(node, dict) else {}
        node = _pointer(document, node["$ref"])
    raise ImportInvalid("its $refs go round in a circle.")


def _pointer(document: dict, ref) -> object:
    if not isinstance(ref, str) or not ref.startswith("#/"):
        raise ImportInvalid(f"it refers to another document ({ref}); import a bundled spec with every $ref inside "
                            f"it (e.g. `redocly bundle`).")
    node = document
    for part in ref[2:].split("/"):
        part = part.replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            raise ImportInvalid(f"its $ref {ref} points at nothing.")
    return copy.deepcopy(node)


def _auth(document: dict, operation: dict, swagger: bool) -> dict | None:
    """The operation's first security requirement as the http binding's auth, taking its value from a secret named
    after the scheme (the user sets that secret, or picks another)."""
    requirements = operation["security"] if "security" in operation else document.get("security") or []
    components = document.get("components") if isinstance(document.get("components"), dict) else {}
    schemes = document.get("securityDefinitions") if swagger else components.get("securitySchemes")
    schemes = schemes if isinstance(schemes, dict) else {}
    for requirement in requirements if isinstance(requirements, list) else ():
        for name in requirement if isinstance(requirement, dict) else ():
            scheme = _resolve(document, schemes.get(name) or {})
            secret = argument_name(name, set()).upper()
            kind = scheme.get("type")
            if kind == "apiKey" and scheme.get("in") in ("header", "query"):
                return {"type": scheme["in"], "name": scheme.get("name", ""), "secret": secret}
            if kind == "basic" or (kind == "http" and str(scheme.get("scheme", "")).lower() == "basic"):
                return {"type": "basic", "username": "", "secret": secret}
            if kind in ("oauth2", "openIdConnect") or (kind == "http" and
                                                       str(scheme.get("scheme", "")).lower() == "bearer"):
                return {"type": "bearer", "secret": secret}
    return None
