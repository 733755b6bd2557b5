import json
import re
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils.translation import gettext
from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError

from accounts.errors import Conflict, Forbidden, ValidationFailed
from accounts.models import Role, Workspace
from accounts.services import Actor, is_platform_admin, record_audit, require_role
from assets.models import AssetKind
from assets.services import forget_asset, register_asset
from workbridge import egress, http_tools, mcp_catalogue, mcp_client, sandbox, vault
from workbridge.egress import EgressRefused, check_entry
from workbridge.importers import ToolDraft, curl, function_name, openapi
from workbridge.models import (
    ApiSpec,
    Binding,
    EgressRule,
    Invocation,
    InvocationStatus,
    McpServer,
    McpTransport,
    Secret,
    Tool,
)
from workbridge.selectors import allowlist_for

TOOL_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_]{0,63}")
SECRET_NAME = re.compile(r"[A-Za-z0-9_]{1,64}")
# As knowledge bases allow: `time-server` is a fine name for a server (it is never a function name).
MCP_SERVER_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}")
MAX_TOOL_TIMEOUT_S = 300.0
MAX_TOOL_OUTPUT_BYTES = 16 * 2**20
INVOCATION_EXCERPT_CHARS = 2000
SPEC_MAX_BYTES = 5 * 2**20


@transaction.atomic
def add_egress_rule(*, actor: Actor, workspace: Workspace, entry: str, note: str = "") -> EgressRule:
    require_role(actor=actor, workspace=workspace, role=Role.ADMIN)
    try:
        entry = check_entry(entry)
    except EgressRefused as exc:
        raise ValidationFailed(str(exc), fields={"entry": [str(exc)]})
    try:
        with transaction.atomic():
            rule = EgressRule.objects.create(workspace=workspace, entry=entry, note=note[:200],
                                             created_by=actor.user)
    except IntegrityError:
        raise Conflict(gettext("'%(entry)s' is already on this workspace's allowlist.") % {"entry": entry})
    record_audit(actor=actor, workspace=workspace, action="egress_rule.add", target=rule, detail={"entry": entry})
    return rule


@transaction.atomic
def remove_egress_rule(*, actor: Actor, rule: EgressRule) -> None:
    require_role(actor=actor, workspace=rule.workspace, role=Role.ADMIN)
    record_audit(actor=actor, workspace=rule.workspace, action="egress_rule.remove", target=rule,
                 detail={"entry": rule.entry})
    rule.delete()


class ToolArgumentsInvalid(ValidationFailed):
    pass


@dataclass(frozen=True)
class ToolResult:
    invocation: Invocation
    output: object
    request: dict

    @property
    def ok(self) -> bool:
        return self.invocation.status == InvocationStatus.OK


def _check_output_schema(schema) -> None:
    if schema is None:
        return
    if not isinstance(schema, dict):
        raise ValidationFailed("'output_schema' must be a JSON Schema object, or null.",
                               fields={"output_schema": ["Not an object."]})
    try:
        Draft202012Validator.check_schema(schema)
    except SchemaError as exc:
        raise ValidationFailed(gettext("'output_schema' is not a valid JSON Schema: %(message)s")
                               % {"message": exc.message},
                               fields={"output_schema": [exc.message]})


def _check_tool(*, workspace: Workspace, name: str, description: str, parameters: dict, binding: str,
                config: dict, timeout_s: float, max_output_bytes: int, spec: ApiSpec | None,
                mcp_server: McpServer | None) -> dict:
    if not isinstance(name, str) or not TOOL_NAME.fullmatch(name):
        raise ValidationFailed(gettext("A tool's name must be a function name: letters, digits and '_', starting "
                                       "with a letter, at most 64; '%(name)s' is not.") % {"name": name},
                               fields={"name": ["Not a function name."]})
    if not str(description).strip():
        raise ValidationFailed("Describe the tool for the model that will call it.",
                               fields={"description": ["This field may not be blank."]})
    if not isinstance(parameters, dict) or parameters.get("type", "object") != "object":
        raise ValidationFailed("'parameters' must be a JSON Schema of type object.",
                               fields={"parameters": ["Must be an object schema."]})
    try:
        Draft202012Validator.check_schema(parameters)
    except SchemaError as exc:
        raise ValidationFailed(gettext("'parameters' is not a valid JSON Schema: %(message)s")
                               % {"message": exc.message},
                               fields={"parameters": [exc.message]})
    if binding not in Binding.values:
        raise ValidationFailed(gettext("Unknown binding '%(binding)s'.") % {"binding": binding},
                               fields={"binding": ["Unknown binding."]})
    if not 0 < timeout_s <= MAX_TOOL_TIMEOUT_S or not 0 < max_output_bytes <= MAX_TOOL_OUTPUT_BYTES:
        raise ValidationFailed(f"The timeout must be within (0, {MAX_TOOL_TIMEOUT_S:g}] s and the output cap within "
                               f"(0, {MAX_TOOL_OUTPUT_BYTES}] bytes.")
    for needed, given, label in ((Binding.OPENAPI, spec, "spec"), (Binding.MCP, mcp_server, "mcp_server")):
        if (binding == needed) != (given is not None) or (given is not None and given.workspace_id != workspace.pk):
            raise ValidationFailed(gettext("A tool has a %(label)s exactly when its binding is %(needed)s.")
                                   % {"label": label, "needed": needed},
                                   fields={label: [f"Only for the {needed} binding, from this workspace."]})
    if not isinstance(config, dict):
        raise ValidationFailed("'config' must be an object.", fields={"config": ["Not an object."]})
    try:
        if binding in (Binding.HTTP, Binding.OPENAPI):
            return http_tools.check_config(config, parameters) | (
                {"operation": str(config.get("operation", ""))[:200]} if binding == Binding.OPENAPI else {})
        if binding == Binding.PYTHON:
            _require_sandbox()
            sandbox.check_code(config.get("code"))
            return {"code": config["code"]}
    except (http_tools.ToolConfigInvalid, sandbox.SandboxCodeInvalid) as exc:
        raise ValidationFailed(str(exc), fields={"config": [str(exc)]})
    if not isinstance(config.get("tool"), str) or not config["tool"]:
        raise ValidationFailed("An mcp tool's config names the server's tool: {\"tool\": \"name\"}.",
                               fields={"config": ["'tool' is missing."]})
    return {"tool": config["tool"]}


def _require_sandbox() -> None:
    available, reason = sandbox.availability()
    if not available:
        raise ValidationFailed(reason, fields={"binding": [reason]})


def _register(actor: Actor, tool: Tool) -> None:
    payload = {"name": tool.name, "description": tool.description, "binding": tool.binding,
               "parameters": tool.parameters, "config": tool.config, "timeout_s": tool.timeout_s,
               "max_output_bytes": tool.max_output_bytes, "spec": tool.spec_id, "mcp_server": tool.mcp_server_id,
               "output_schema": tool.output_schema}
    register_asset(workspace=tool.workspace, kind=AssetKind.TOOL, ref_id=tool.pk, name=tool.name, payload=payload,
                   summary={"binding": tool.binding, "method": tool.config.get("method")}, actor=actor)


@transaction.atomic
def save_tool(*, actor: Actor, workspace: Workspace, tool: Tool | None = None, name: str, description: str,
              parameters: dict, config: dict, binding: str = Binding.HTTP, timeout_s: float = 30.0,
              max_output_bytes: int = 1_048_576, spec: ApiSpec | None = None,
              mcp_server: McpServer | None = None, output_schema: dict | None = None) -> Tool:
    """Create a tool, or change `tool`: each change that alters it is a new version in the asset registry."""
    require_role(actor=actor, workspace=workspace, role=Role.DEVELOPER)
    _check_output_schema(output_schema)
    config = _check_tool(workspace=workspace, name=name, description=description, parameters=parameters,
                         binding=binding, config=config, timeout_s=timeout_s, max_output_bytes=max_output_bytes,
                         spec=spec, mcp_server=mcp_server)
    fields = {"name": name, "description": description.strip(), "binding": binding, "parameters": parameters,
              "config": config, "timeout_s": timeout_s, "max_output_bytes": max_output_bytes, "spec": spec,
              "mcp_server": mcp_server, "output_schema": output_schema}
    try:
        with transaction.atomic():
            if tool is None:
                tool = Tool.objects.create(workspace=workspace, created_by=actor.user, **fields)
            else:
                for key, value in fields.items():
                    setattr(tool, key, value)
                tool.save()
    except IntegrityError:
        raise Conflict(gettext("This workspace already has a tool called '%(name)s'.") % {"name": name},
                       fields={"name": ["Taken."]})
    _register(actor, tool)
    record_audit(actor=actor, workspace=workspace, action="tool.save", target=tool, detail={"name": name})
    return tool


@transaction.atomic
def delete_tool(*, actor: Actor, tool: Tool) -> None:
    require_role(actor=actor, workspace=tool.workspace, role=Role.DEVELOPER)
    forget_asset(workspace=tool.workspace, kind=AssetKind.TOOL, ref_id=tool.pk)
    record_audit(actor=actor, workspace=tool.workspace, action="tool.delete", target=tool,
                 detail={"name": tool.name})
    tool.delete()


@transaction.atomic
def set_secret(*, actor: Actor, workspace: Workspace, name: str, value: str) -> Secret:
    """Create or replace a secret; its value is encrypted at rest and never shown again in full."""
    require_role(actor=actor, workspace=workspace, role=Role.DEVELOPER)
    if not isinstance(name, str) or not SECRET_NAME.fullmatch(name):
        raise ValidationFailed("A secret's name is letters, digits and '_' (at most 64).",
                               fields={"name": ["Invalid name."]})
    if not value:
        raise ValidationFailed("A secret needs a value.", fields={"value": ["This field may not be blank."]})
    secret, _ = Secret.objects.update_or_create(workspace=workspace, name=name,
                                                defaults={"value": value, "created_by": actor.user})
    record_audit(actor=actor, workspace=workspace, action="secret.set", target=secret, detail={"name": name})
    return secret


@transaction.atomic
def delete_secret(*, actor: Actor, secret: Secret) -> None:
    require_role(actor=actor, workspace=secret.workspace, role=Role.DEVELOPER)
    record_audit(actor=actor, workspace=secret.workspace, action="secret.delete", target=secret,
                 detail={"name": secret.name})
    secret.delete()


def _secret_of(workspace: Workspace) -> Callable[[str], str]:
    def value(name: str) -> str:
        secret = Secret.objects.filter(workspace=workspace, name=name).first()
        if secret is None:
            raise ValidationFailed(gettext("The tool needs the secret '%(name)s', which this workspace does not "
                                           "have.") % {"name": name})
        if vault.unreadable(secret.value):
            raise ValidationFailed(gettext("The secret '%(name)s' cannot be decrypted with this installation's "
                                           "secrets key: enter its value again on the Secrets page, or ask a "
                                           "platform administrator to put back the FACTORY_SECRETS_KEY it was "
                                           "saved with.") % {"name": name})
        return secret.value

    return value


def _excerpt(output) -> str:
    text = output if isinstance(output, str) else json.dumps(output, ensure_ascii=False)
    return text[:INVOCATION_EXCERPT_CHARS]


@dataclass(frozen=True)
class SpecPreview:
    document: dict
    source: str
    base_url: str
    drafts: list[ToolDraft]
    # Operations no tool can be made of: {"operation": "POST /upload", "path": "paths./upload.post", "reason": ...}.
    skipped: list[dict]
    # What the lenient reading repaired or let pass: {"path": "definitions.X.type", "reason": "'int' read as integer"}.
    repaired: list[dict]

    @property
    def title(self) -> str:
        return str(self._info.get("title") or "Untitled API")[:200]

    @property
    def version(self) -> str:
        return str(self._info.get("version") or "")[:64]

    @property
    def _info(self) -> dict:
        info = self.document.get("info")
        return info if isinstance(info, dict) else {}


def _spec_text(*, workspace: Workspace, text: str, url: str) -> str:
    if bool(text) == bool(url):
        raise ValidationFailed("Give the spec as a file, as pasted text, or as a URL: one of them.",
                               fields={"spec": ["Exactly one of text and url."]})
    if text:
        return text
    try:
        answer = egress.request("GET", url, allowlist=allowlist_for(workspace_id=workspace.pk),
                                headers={"Accept": "application/json, application/yaml, text/yaml, */*"},
                                max_bytes=SPEC_MAX_BYTES)
    except egress.EgressRefused as exc:
        raise ValidationFailed(str(exc), fields={"url": [str(exc)]})
    if answer.status_code >= 400:
        raise ValidationFailed(gettext("%(url)s answered %(status_code)s.")
                               % {"url": url, "status_code": answer.status_code}, fields={"url": ["Not fetched."]})
    return answer.text


def preview_spec(*, actor: Actor, workspace: Workspace, text: str = "", url: str = "", base_url: str = "",
                 source: str = "pasted", strict: bool = False) -> SpecPreview:
    """An OpenAPI 3.x or Swagger 2.0 spec (JSON or YAML, as text or fetched from `url` through the egress guard)
    read and turned into one draft tool per operation, for the user to pick, rename and edit. Read leniently, what
    does not validate is repaired or skipped and listed; `strict` refuses a spec that does not validate."""
    require_role(actor=actor, workspace=workspace, role=Role.DEVELOPER)
    spec_text = _spec_text(workspace=workspace, text=text, url=url)
    try:
        reading = openapi.read_spec(spec_text, base_url=base_url or None, strict=strict)
    except openapi.BaseUrlNeeded as exc:
        raise ValidationFailed(str(exc), fields={"base_url": [str(exc)]})
    except openapi.ImportInvalid as exc:
        raise ValidationFailed(gettext("The spec cannot be imported: %(exc)s") % {"exc": exc},
                               fields={"spec": [str(exc)]})
    return SpecPreview(document=reading.document, source=url or source, base_url=base_url, drafts=reading.drafts,
                       skipped=reading.skipped, repaired=reading.repaired)


@transaction.atomic
def import_spec(*, actor: Actor, workspace: Workspace, text: str = "", url: str = "", base_url: str = "",
                source: str = "pasted", operations: list[dict] | None = None, strict: bool = False) -> ApiSpec:
    """Store the spec once (as given) and make an `openapi` tool of each chosen operation (`{"operation": "GET /pets",
    "name": ..., "description": ...}`, name and description optional; all operations that can be tools when None).
    A name already taken in the workspace fails the whole import."""
    preview = preview_spec(actor=actor, workspace=workspace, text=text, url=url, base_url=base_url, source=source,
                           strict=strict)
    by_operation = {draft.operation: draft for draft in preview.drafts}
    chosen = operations if operations is not None else [{"operation": key} for key in by_operation]
    unknown = [str(choice.get("operation")) for choice in chosen
               if not isinstance(choice.get("operation"), str) or choice["operation"] not in by_operation]
    if unknown or not chosen:
        message = f"The spec has no operation {', '.join(unknown)}." if unknown else "Choose at least one operation."
        raise ValidationFailed(message, fields={"operations": [message]})
    spec = ApiSpec.objects.create(workspace=workspace, title=preview.title, version=preview.version,
                                  source=preview.source[:2000], base_url=base_url[:2000],
                                  document=preview.document, created_by=actor.user)
    for choice in chosen:
        draft = by_operation[choice["operation"]]
        save_tool(actor=actor, workspace=workspace, name=choice.get("name") or draft.name,
                  description=choice.get("description") or draft.description, parameters=draft.parameters,
                  config=draft.config | {"operation": draft.operation}, binding=Binding.OPENAPI, spec=spec)
    record_audit(actor=actor, workspace=workspace, action="api_spec.import", target=spec,
                 detail={"title": spec.title, "tools": len(chosen)})
    return spec


@transaction.atomic
def delete_spec(*, actor: Actor, spec: ApiSpec) -> None:
    """The spec goes with the tools made from it."""
    require_role(actor=actor, workspace=spec.workspace, role=Role.DEVELOPER)
    for tool in spec.tools.all():
        delete_tool(actor=actor, tool=tool)
    record_audit(actor=actor, workspace=spec.workspace, action="api_spec.delete", target=spec,
                 detail={"title": spec.title})
    spec.delete()


def preview_curl(*, actor: Actor, workspace: Workspace, command: str) -> ToolDraft:
    require_role(actor=actor, workspace=workspace, role=Role.DEVELOPER)
    try:
        return curl.draft_from_curl(command)
    except curl.ImportInvalid as exc:
        raise ValidationFailed(str(exc), fields={"command": [str(exc)]})


@transaction.atomic
def import_curl(*, actor: Actor, workspace: Workspace, command: str, name: str = "", description: str = "") -> Tool:
    """One cURL command made an http tool. Credentials in it (a bearer token, a password, an API-key header)
    become workspace secrets the tool refers to; a secret of that name holding another value is kept, and the new
    one gets a free name."""
    draft = preview_curl(actor=actor, workspace=workspace, command=command)
    config = dict(draft.config)
    for secret_name, value in draft.secrets.items():
        stored = _free_secret_name(workspace, secret_name, value)
        set_secret(actor=actor, workspace=workspace, name=stored, value=value)
        if config.get("auth", {}).get("secret") == secret_name:
            config["auth"] = config["auth"] | {"secret": stored}
    return save_tool(actor=actor, workspace=workspace, name=name or draft.name,
                     description=description or draft.description, parameters=draft.parameters, config=config)


def _free_secret_name(workspace: Workspace, name: str, value: str) -> str:
    candidate, number = name, 1
    while (held := Secret.objects.filter(workspace=workspace, name=candidate).first()) and held.value != value:
        number += 1
        candidate = f"{name[:60]}_{number}"
    return candidate


def _stdio_argv(server: McpServer) -> tuple[list[str], dict]:
    """The command line that starts a local server now, confined to the sandbox unless its catalogue entry says
    why not, and the environment it gets. The catalogue is read at every start: an entry the operator removed or
    changed takes effect at once."""
    if server.catalog_entry:
        entry = mcp_catalogue.entry(server.catalog_entry)
        program = entry.executable()
        if program is None:
            raise mcp_catalogue.CatalogueRefused(gettext("The catalogue entry '%(entry)s' runs %(value)s, which is "
                                                         "not on this machine.")
                                                 % {"entry": entry.name, "value": entry.command[0]})
        argv = [program, *entry.argv(list(server.arguments))[1:]]
        if not entry.sandbox:
            return argv, entry.env
        return sandbox.confine(argv, read_only_paths=entry.read_only_paths, env=entry.env), entry.env
    program = shutil.which(server.command[0]) if server.command else None
    if program is None:
        raise mcp_catalogue.CatalogueRefused(gettext("The command %(value)s is not on this machine.")
                                             % {"value": server.command[:1]})
    return sandbox.confine([program, *server.command[1:]]), {}


def _connection(server: McpServer) -> mcp_client.Connection:
    """How to reach the server; McpUnreachable when it may not be started or called."""
    if server.disabled_reason:
        mcp_client.close_session(_pool_key(server))
        raise mcp_client.McpUnreachable(gettext("This MCP server is disabled: %(disabled_reason)s")
                                        % {"disabled_reason": server.disabled_reason})
    command, env = (), {}
    if server.transport == McpTransport.STDIO:
        try:
            command, env = _stdio_argv(server)
        except (mcp_catalogue.CatalogueRefused, sandbox.SandboxUnavailable) as exc:
            raise mcp_client.McpUnreachable(str(exc)) from exc
    headers = {"Authorization": f"Bearer {_secret_of(server.workspace)(server.auth_secret)}"} \
        if server.auth_secret else {}
    return mcp_client.Connection(transport=server.transport, url=server.url, command=tuple(command), env=env,
                                 headers=headers, allowlist=allowlist_for(workspace_id=server.workspace_id),
                                 timeout_s=server.timeout_s, pool_key=_pool_key(server))


def _pool_key(server: McpServer) -> str:
    return f"mcp-server:{server.pk}"


def _workspace_secret_values(workspace_id: int) -> list[str]:
    """Every secret of the workspace, decrypted: whatever a tool of the workspace answers is masked for all of them,
    not only the one it sent (a server may echo another it learnt elsewhere)."""
    return [secret.value for secret in Secret.objects.filter(workspace_id=workspace_id)]


def _check_local_command(*, actor: Actor, catalog_entry: str, arguments: list, command: list) -> None:
    """A workspace picks a local command from the operator's catalogue, with only the arguments its entry allows; a
    free-form command is a platform administrator's, signed in (a key is never enough: it may sit in any script)."""
    if catalog_entry:
        try:
            entry = mcp_catalogue.entry(catalog_entry)
            entry.argv(arguments)
        except mcp_catalogue.CatalogueRefused as exc:
            raise ValidationFailed(str(exc), fields={"catalog_entry": [str(exc)]})
        if entry.executable() is None:
            message = (f"The catalogue entry '{catalog_entry}' runs {entry.command[0]}, which does not exist on this "
                       f"machine; the operator must install it or correct {settings.MCP_COMMANDS_FILE}.")
            raise ValidationFailed(message, fields={"catalog_entry": [message]})
        return
    if not command:
        raise ValidationFailed("Choose a local command from the operator's catalogue.",
                               fields={"catalog_entry": ["Missing."]})
    if actor.api_key is not None or not is_platform_admin(actor):
        raise Forbidden(gettext("A local MCP command runs on the platform's own machine: a workspace picks one from "
                                "the operator's catalogue (%(file)s); only a platform administrator, "
                                "signed in, registers any other.") % {"file": settings.MCP_COMMANDS_FILE})
    if not all(isinstance(part, str) and part and "\x00" not in part for part in command):
        raise ValidationFailed("A local command is a list of words, e.g. [\"python\", \"-m\", \"my_server\"].",
                               fields={"command": ["Not a list of words."]})
    if shutil.which(command[0]) is None:
        message = f"{command[0]} does not exist on this machine (or is not executable)."
        raise ValidationFailed(message, fields={"command": [message]})


@transaction.atomic
def save_mcp_server(*, actor: Actor, workspace: Workspace, server: McpServer | None = None, name: str,
                    transport: str, url: str = "", catalog_entry: str = "", arguments: list[str] | None = None,
                    command: list[str] | None = None, auth_secret: str = "", timeout_s: float = 30.0) -> McpServer:
    """Register (or change) an MCP server. A URL must pass the egress guard now, not first at a call. A local
    server is an admin's choice from the operator's catalogue (see _check_local_command); saving it again as
    someone who may clears a disabled server's reason."""
    require_role(actor=actor, workspace=workspace, role=Role.DEVELOPER)
    if not isinstance(name, str) or not MCP_SERVER_NAME.fullmatch(name):
        raise ValidationFailed("An MCP server's name is letters, digits, '_' and '-' (at most 64), a letter or digit "
                               "first.", fields={"name": ["Invalid name."]})
    arguments, command = list(arguments or []), list(command or [])
    if transport == McpTransport.HTTP:
        try:
            egress.check(url, allowlist_for(workspace_id=workspace.pk))
        except egress.EgressRefused as exc:
            raise ValidationFailed(str(exc), fields={"url": [str(exc)]})
        catalog_entry, arguments, command = "", [], []
    elif transport == McpTransport.STDIO:
        require_role(actor=actor, workspace=workspace, role=Role.ADMIN)
        if catalog_entry:
            command = []
        _check_local_command(actor=actor, catalog_entry=catalog_entry, arguments=arguments, command=command)
        url = ""
    else:
        raise ValidationFailed(gettext("'transport' must be one of %(values)s.") % {"values": McpTransport.values},
                               fields={"transport": ["Unknown transport."]})
    if auth_secret and not Secret.objects.filter(workspace=workspace, name=auth_secret).exists():
        raise ValidationFailed(gettext("This workspace has no secret '%(auth_secret)s'.")
                               % {"auth_secret": auth_secret}, fields={"auth_secret": ["Unknown."]})
    if not 0 < timeout_s <= MAX_TOOL_TIMEOUT_S:
        raise ValidationFailed(f"The timeout must be within (0, {MAX_TOOL_TIMEOUT_S:g}] s.",
                               fields={"timeout_s": ["Out of range."]})
    fields = {"name": name, "transport": transport, "url": url, "catalog_entry": catalog_entry,
              "arguments": arguments, "command": command, "auth_secret": auth_secret, "timeout_s": timeout_s,
              "disabled_reason": ""}
    try:
        with transaction.atomic():
            if server is None:
                server = McpServer.objects.create(workspace=workspace, created_by=actor.user, **fields)
            else:
                McpServer.objects.filter(pk=server.pk).update(**fields)
                server.refresh_from_db()
                mcp_client.close_session(_pool_key(server))  # the next call starts it as it is now
    except IntegrityError:
        raise Conflict(gettext("This workspace already has an MCP server called '%(name)s'.") % {"name": name},
                       fields={"name": ["Taken."]})
    record_audit(actor=actor, workspace=workspace, action="mcp_server.save", target=server,
                 detail={"name": name, "transport": transport, "url": url, "catalog_entry": catalog_entry,
                         "arguments": arguments, "command": command})
    return server


@transaction.atomic
def delete_mcp_server(*, actor: Actor, server: McpServer) -> None:
    """The server goes with the tools imported from it."""
    require_role(actor=actor, workspace=server.workspace,
                 role=Role.ADMIN if server.transport == McpTransport.STDIO else Role.DEVELOPER)
    for tool in server.tools.all():
        delete_tool(actor=actor, tool=tool)
    record_audit(actor=actor, workspace=server.workspace, action="mcp_server.delete", target=server,
                 detail={"name": server.name})
    mcp_client.close_session(_pool_key(server))
    server.delete()


def mcp_server_tools(*, actor: Actor, server: McpServer) -> list[mcp_client.RemoteTool]:
    """The tools the server offers now; an unreachable server is a 400 with the reason."""
    require_role(actor=actor, workspace=server.workspace, role=Role.DEVELOPER)
    try:
        return mcp_client.list_tools(_connection(server))
    except mcp_client.McpUnreachable as exc:
        raise ValidationFailed(vault.masked(str(exc), _workspace_secret_values(server.workspace_id)))


@transaction.atomic
def import_mcp_tools(*, actor: Actor, server: McpServer, names: list[str] | None = None) -> list[Tool]:
    """Import the server's tools named (all when None) as `mcp` tools; a remote name that is not a function name
    is imported under a sanitised one. Importing a tool again updates it."""
    offered = {remote.name: remote for remote in mcp_server_tools(actor=actor, server=server)}
    missing = sorted(set(names or []) - set(offered))
    if missing:
        raise ValidationFailed(gettext("The server offers no tool %(values)s.") % {"values": ', '.join(missing)},
                               fields={"tools": missing})
    imported = []
    for remote in (offered[name] for name in (names if names is not None else offered)):
        existing = server.tools.filter(config__tool=remote.name).first()
        local = existing.name if existing else function_name(remote.name)
        schema = remote.input_schema if remote.input_schema.get("type") == "object" else {"type": "object"}
        imported.append(save_tool(actor=actor, workspace=server.workspace, tool=existing, name=local,
                                  description=remote.description or f"{remote.name} on {server.name}",
                                  parameters=schema, binding=Binding.MCP, config={"tool": remote.name},
                                  timeout_s=server.timeout_s, mcp_server=server))
    return imported


@dataclass
class _Outcome:
    output: object = None
    error: str = ""
    http_status: int | None = None
    request: dict = field(default_factory=dict)
    # Derived credentials the call sent beyond the workspace's secrets (a Basic header's token).
    secret_values: list[str] = field(default_factory=list)

    @property
    def status(self) -> str:
        return InvocationStatus.FAILED if self.error else InvocationStatus.OK


def invoke_tool(*, actor: Actor, tool: Tool, arguments: dict, caller: str) -> ToolResult:
    """Call the tool once and record the call. Arguments that break its schema are a ToolArgumentsInvalid (400);
    anything that goes wrong on the way out (a refused host, a timeout, a cap, an error status, an exception in
    the code) is a failed invocation with its reason, returned, never raised."""
    require_role(actor=actor, workspace=tool.workspace, role=Role.DEVELOPER)
    if not isinstance(arguments, dict):
        raise ToolArgumentsInvalid("The arguments must be a JSON object.", fields={"arguments": ["Not an object."]})
    problems = sorted(Draft202012Validator(tool.parameters).iter_errors(arguments), key=lambda e: list(e.path))
    if problems:
        where = "/".join(str(part) for part in problems[0].absolute_path) or "arguments"
        raise ToolArgumentsInvalid(gettext("The arguments do not fit the tool's schema at %(where)s: %(message)s")
                                   % {"where": where, "message": problems[0].message},
                                   fields={"arguments": [problems[0].message]})
    started = time.perf_counter()
    outcome = _CALLS[tool.binding](tool, arguments)
    latency_ms = (time.perf_counter() - started) * 1000
    if not outcome.error and tool.output_schema is not None:
        mismatch = next(Draft202012Validator(tool.output_schema).iter_errors(outcome.output), None)
        if mismatch is not None:
            where = "/".join(str(part) for part in mismatch.absolute_path) or "the answer"
            outcome.error = f"The answer does not fit the tool's output schema at {where}: {mismatch.message}"
    # Masked here, once, before anything records or returns the answer: every caller (the invoke API, agents, /mcp,
    # apps, evaluations) then only ever holds the masked form.
    secrets = _workspace_secret_values(tool.workspace_id) + outcome.secret_values
    output, error, request = (vault.masked(part, secrets) for part in (outcome.output, outcome.error, outcome.request))
    invocation = Invocation.objects.create(
        tool=tool, caller=caller[:64], actor=actor.user, arguments=vault.masked(arguments, secrets),
        status=outcome.status, http_status=outcome.http_status, latency_ms=latency_ms,
        error=error[:INVOCATION_EXCERPT_CHARS], result_excerpt=_excerpt(output) if output is not None else "")
    return ToolResult(invocation=invocation, output=output, request=request)


def _call_http(tool: Tool, arguments: dict) -> _Outcome:
    call = http_tools.render(tool.config, arguments, _secret_of(tool.workspace))
    outcome = _Outcome(request=call.describe(), secret_values=call.secret_values)
    try:
        answer = egress.request(call.method, call.url, params=call.params, headers=call.headers,
                                json_body=call.json_body, content=call.content, timeout_s=tool.timeout_s,
                                max_bytes=tool.max_output_bytes,
                                allowlist=allowlist_for(workspace_id=tool.workspace_id))
    except egress.EgressRefused as exc:
        outcome.error = str(exc)
        return outcome
    outcome.http_status, outcome.output = answer.status_code, _output_of(answer)
    if answer.status_code >= 400:
        outcome.error = f"{call.method} answered {answer.status_code}"
    return outcome


def _call_python(tool: Tool, arguments: dict) -> _Outcome:
    try:
        result = sandbox.run_python(tool.config["code"], arguments, timeout_s=tool.timeout_s,
                                    max_output_bytes=tool.max_output_bytes)
    except sandbox.SandboxUnavailable as exc:
        return _Outcome(error=str(exc), request={"sandbox": sandbox.mode()})
    return _Outcome(output=result.output, error=result.error,
                    request={"sandbox": sandbox.mode(), "stdout": result.stdout, "stderr": result.stderr})


def _call_mcp(tool: Tool, arguments: dict) -> _Outcome:
    server = tool.mcp_server
    request = {"server": server.name, "tool": tool.config["tool"], "arguments": arguments}
    try:
        reply = mcp_client.call_tool(_connection(server), tool.config["tool"], arguments, timeout_s=tool.timeout_s)
    except mcp_client.McpUnreachable as exc:
        return _Outcome(error=str(exc), request=request)
    text = json.dumps(reply.output, ensure_ascii=False) if not isinstance(reply.output, str) else reply.output
    if len(text.encode()) > tool.max_output_bytes:
        return _Outcome(error=f"The answer is larger than {tool.max_output_bytes} bytes.", request=request)
    return _Outcome(output=reply.output, error=reply.error, request=request)


_CALLS: dict[str, Callable[[Tool, dict], _Outcome]] = {
    Binding.HTTP: _call_http, Binding.OPENAPI: _call_http, Binding.PYTHON: _call_python, Binding.MCP: _call_mcp}


def _output_of(answer: egress.Answer):
    if "json" in answer.headers.get("content-type", ""):
        try:
            return answer.json()
        except ValueError:
            pass
    return answer.text
