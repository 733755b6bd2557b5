"""The lenient import: what real-world specs get wrong, read the way their authors meant it, and listed.

Generators and hand-written specs often fail validation on things that do not change what an operation does: a field
the format does not have (httpbin's `info.contact.responsibleDeveloper`), a Python type name (`type: int`), a path
parameter not marked required or not declared at all, an OpenAPI 3 `schema` in a Swagger 2.0 parameter, a default
that its own schema refuses (drf-spectacular's `default: ''` beside `minLength: 1`), one operationId on two
operations, `swagger: 2.0` written as a YAML number. `repair` reads each of these on a copy of the document and
notes it with its JSON path (`definitions.Pet.properties.age.type`) and what it did.

Then the format's own JSON Schema (the one openapi-spec-validator checks against) is run over the copy, and what it
still finds is noted as left as it is: the drafts read only what a tool needs, and an operation that still cannot be
a tool is skipped there, with its own reason. What openapi-spec-validator checks beyond that schema is either
repaired here (defaults, operationIds, path parameters) or changes no tool, so it is not run.
"""

import copy
import json
import re
from dataclasses import dataclass, field

from jsonschema.exceptions import SchemaError, best_match
from jsonschema.validators import validator_for
from openapi_schema_validator import OAS30Validator, OAS31Validator
from openapi_spec_validator.schemas import schema_v2, schema_v30, schema_v31, schema_v32
from openapi_spec_validator.versions import consts as versions
from openapi_spec_validator.versions.exceptions import OpenAPIVersionNotFound
from openapi_spec_validator.versions.shortcuts import get_spec_version

from workbridge import http_tools
from workbridge.importers import ImportInvalid

# Every method a path item may hold; the drafts say which of them tools do not send.
HTTP_METHODS = ("get", "put", "post", "delete", "options", "head", "patch", "trace")
JSON_TYPES = {"string", "number", "integer", "boolean", "array", "object", "null"}
# Type names of programming languages, as generators and hand-written specs put them where JSON Schema's go.
TYPE_NAMES = {"int": "integer", "int32": "integer", "int64": "integer", "long": "integer", "float": "number",
              "double": "number", "decimal": "number", "bool": "boolean", "str": "string", "dict": "object",
              "list": "array"}
# The words of a schema that say which values fit it: what a default is checked against.
SCHEMA_WORDS = {"type", "enum", "const", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf",
                "minLength", "maxLength", "pattern", "items", "minItems", "maxItems", "uniqueItems", "properties",
                "additionalProperties", "minProperties", "maxProperties", "nullable", "allOf", "anyOf", "oneOf",
                "not"}
# Values, not schemas: a `type` inside an example is data. (Under `properties` these words are field names.)
LITERALS = {"example", "examples", "default", "enum", "const"}
NAME_MAPS = {"properties", "patternProperties", "definitions", "schemas", "$defs", "parameters", "responses",
             "paths"}
META_SCHEMAS = {versions.OPENAPIV2: schema_v2, versions.OPENAPIV30: schema_v30, versions.OPENAPIV31: schema_v31,
                versions.OPENAPIV32: schema_v32}
MAX_NOTES = 300  # a spec that is wrong everywhere says so in this many notes, and a count of the rest


@dataclass
class Notes:
    noted: list[tuple[tuple, str]] = field(default_factory=list)
    paths: set[tuple] = field(default_factory=set)

    def add(self, path: tuple, reason: str) -> None:
        self.noted.append((path, reason))
        self.paths.add(path)

    def covers(self, path: tuple) -> bool:
        """Whether a note already speaks of `path` or of a part that holds it."""
        return any(path[:length] in self.paths for length in range(1, len(path) + 1))

    def listed(self) -> list[dict]:
        """In the document's order of paths (`parameters.2` before `parameters.10`), at most MAX_NOTES."""
        ordered = sorted(self.noted, key=lambda note: [(0, int(part), "") if part.isdigit() else (1, 0, part)
                                                        for part in note[0]])
        listed = [{"path": ".".join(path), "reason": reason} for path, reason in ordered[:MAX_NOTES]]
        if len(ordered) > MAX_NOTES:
            listed.append({"path": "", "reason": f"and {len(ordered) - MAX_NOTES} more problems like these"})
        return listed


@dataclass
class Repaired:
    document: dict  # a copy of the document given, repaired
    notes: list[dict]  # {"path": "definitions.X.type", "reason": "'int' read as integer"}


def repair(document: dict) -> Repaired:
    fixed, notes = copy.deepcopy(document), Notes()
    version = _version(fixed, notes)
    _type_names(fixed, notes)
    _parameters(fixed, notes, swagger=version == versions.OPENAPIV2)
    _operation_ids(fixed, notes)
    _defaults(fixed, notes, OAS30Validator if version in (versions.OPENAPIV2, versions.OPENAPIV30)
              else OAS31Validator)
    _left_as_is(fixed, notes, META_SCHEMAS[version])
    return Repaired(document=fixed, notes=notes.listed())


def _version(document: dict, notes: Notes):
    """The spec's version, its short spellings (`swagger: 2.0` as a YAML number, `openapi: "3.1"`) read in full."""
    for word, full in (("swagger", {"2": "2.0", "2.0": "2.0"}),
                       ("openapi", {"3": "3.0.0", "3.0": "3.0.0", "3.1": "3.1.0"})):
        given = document.get(word)
        if not isinstance(given, bool) and isinstance(given, (int, float, str)) and str(given) in full \
                and given != full[str(given)]:
            document[word] = full[str(given)]
            notes.add((word,), f"{json.dumps(given)} read as '{document[word]}'")
    try:
        return get_spec_version(document)
    except (OpenAPIVersionNotFound, TypeError) as exc:
        raise ImportInvalid("its version is not OpenAPI 3.0, 3.1 or Swagger 2.0.") from exc


def _objects(node, path: tuple = (), key=None):
    """Every object in the document with its JSON path, leaving out literal values (examples, defaults, enums)."""
    if isinstance(node, dict):
        yield node, path
        for name, value in node.items():
            if key not in NAME_MAPS and (name in LITERALS or str(name).startswith("x-")):
                continue
            yield from _objects(value, (*path, str(name)), name)
    elif isinstance(node, list):
        for index, value in enumerate(node):
            yield from _objects(value, (*path, str(index)))


def _in_skipped_operation(path: tuple) -> bool:
    """Whether `path` lies in an operation whose method tools do not send: the drafts skip it as it is."""
    return len(path) > 2 and path[0] == "paths" and path[2] in HTTP_METHODS \
        and path[2].upper() not in http_tools.METHODS


def _type_names(document: dict, notes: Notes) -> None:
    for node, path in _objects(document):
        given = node.get("type")
        if isinstance(given, str) and given not in JSON_TYPES and not _in_skipped_operation(path):
            meant = TYPE_NAMES.get(given.lower(), given.lower())
            if meant in JSON_TYPES:  # not a security scheme's `apiKey`, nor Swagger's `file`
                node["type"] = meant
                notes.add((*path, "type"), f"'{given}' read as {meant}")


def _tool_operations(document: dict):
    """(path, path item, method, operation) of each operation whose method tools send: the others are skipped as
    they are, so nothing of theirs is repaired."""
    paths = document.get("paths")
    for path, item in (paths.items() if isinstance(paths, dict) else ()):
        for method, operation in (item.items() if isinstance(item, dict) else ()):
            if method.upper() in http_tools.METHODS and isinstance(operation, dict):
                yield path, item, method, operation


def _parameters(document: dict, notes: Notes, *, swagger: bool) -> None:
    repaired: set[int] = set()  # a parameter several operations share (by $ref, or the path's) is repaired once
    for path, item, method, operation in _tool_operations(document):
        where = ("paths", path)
        shared = _declared(document, item.get("parameters"), (*where, "parameters"), notes, swagger, repaired)
        own = _declared(document, operation.get("parameters"), (*where, method, "parameters"), notes, swagger,
                        repaired)
        in_path = [parameter.get("name") for parameter in shared + own if parameter.get("in") == "path"]
        for name in dict.fromkeys(re.findall(r"{([^{}/]+)}", path)):
            if name in in_path or not isinstance(operation.setdefault("parameters", []), list):
                continue
            operation["parameters"].append({"name": name, "in": "path", "required": True,
                                            **({"type": "string"} if swagger else {"schema": {"type": "string"}})})
            notes.add((*where, method, "parameters"),
                      f"'{{{name}}}' is in the path but no parameter declares it; read as a required string")


def _declared(document: dict, parameters, where: tuple, notes: Notes, swagger: bool, repaired: set) -> list[dict]:
    """The parameters of one list ($refs followed), each repaired where its meaning is clear."""
    found = []
    for index, parameter in enumerate(parameters if isinstance(parameters, list) else []):
        path = (*where, str(index))
        if isinstance(parameter, dict) and isinstance(parameter.get("$ref"), str):
            path, parameter = _target(document, parameter["$ref"])
        if not isinstance(parameter, dict):
            continue
        found.append(parameter)
        if id(parameter) in repaired:
            continue
        repaired.add(id(parameter))
        if parameter.get("in") == "path" and parameter.get("required") is not True:
            parameter["required"] = True
            notes.add(path, "a path parameter is always required; read as required")
        if swagger and parameter.get("in") != "body" and "type" not in parameter:
            if "schema" in parameter:
                notes.add(path, "an OpenAPI 3 'schema' in a Swagger 2.0 parameter; read as that schema")
            else:
                parameter["type"] = "string"
                notes.add(path, "no type; read as a string")
        elif not swagger and "schema" not in parameter and "content" not in parameter:
            parameter["schema"] = {"type": "string"}
            notes.add(path, "no schema; read as a string")
    return found


def _target(document: dict, ref: str) -> tuple[tuple, object]:
    """What a local $ref points at, in place, with its path; None when it points at nothing in this document (the
    drafts say so)."""
    node, path = document, ()
    for part in ref.removeprefix("#/").split("/"):
        part = part.replace("~1", "/").replace("~0", "~")
        if not ref.startswith("#/") or not isinstance(node, dict) or part not in node:
            return (ref,), None
        node, path = node[part], (*path, part)
    return path, node


def _operation_ids(document: dict, notes: Notes) -> None:
    first: dict[str, str] = {}
    for path, _, method, operation in _tool_operations(document):
        named = operation.get("operationId")
        if isinstance(named, str) and named in first:
            notes.add(("paths", path, method, "operationId"),
                      f"'{named}' is also the operationId of {first[named]}; the tool gets a numbered name")
        elif isinstance(named, str):
            first[named] = f"{method.upper()} {path}"


def _defaults(document: dict, notes: Notes, validator) -> None:
    """A default its own schema refuses is dropped: a tool's schema would offer the model a value that fails."""
    for node, path in _objects(document):
        if "default" not in node or "servers" in path or _in_skipped_operation(path):
            continue
        schema = {word: value for word, value in node.items() if word in SCHEMA_WORDS}
        if not schema or "$ref" in json.dumps(schema):  # what a $ref holds is checked where it is defined
            continue
        try:
            validator.check_schema(schema)
        except SchemaError:
            continue  # a broken schema is noted by the format's own check below
        problem = best_match(validator(schema).iter_errors(node["default"]))
        if problem is not None:
            given = json.dumps(node.pop("default"), ensure_ascii=False)
            notes.add((*path, "default"), f"the default {given[:60]} does not fit its own schema "
                                          f"({problem.message[:120]}); dropped")


def _left_as_is(document: dict, notes: Notes, meta_schema) -> None:
    """What the format's JSON Schema still finds, noted; an operation tools do not send (its method unknown to the
    format, or not one tools send) is left to the drafts, which list it as skipped."""
    checker = validator_for(meta_schema)(meta_schema)
    for error in checker.iter_errors(document):
        path = tuple(str(part) for part in error.absolute_path)
        if _in_skipped_operation(path):
            continue
        if error.validator in ("additionalProperties", "unevaluatedProperties") and isinstance(error.instance, dict):
            unexpected = _unexpected(error)
            for name in unexpected:
                if not (len(path) == 2 and path[0] == "paths" and name in HTTP_METHODS) \
                        and not notes.covers((*path, name)):
                    notes.add((*path, name), "not a field the format has here; ignored")
            if unexpected:
                continue
        if notes.covers(path):
            continue
        cause = best_match(error.context) if error.context else error
        notes.add(tuple(str(part) for part in cause.absolute_path), f"{cause.message[:200]}; left as it is")


def _unexpected(error) -> list[str]:
    known = error.schema.get("properties") or {}
    patterns = error.schema.get("patternProperties") or {}
    return [name for name in error.instance if name not in known and not name.startswith("x-")
            and not any(re.search(pattern, name) for pattern in patterns)]
