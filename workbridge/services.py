import json
import re
import time
from collections.abc import Callable
from dataclasses import dataclass

from django.db import IntegrityError, transaction
from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError

from accounts.errors import Conflict, ValidationFailed
from accounts.models import Role, Workspace
from accounts.services import Actor, record_audit, require_role
from assets.models import AssetKind
from assets.services import forget_asset, register_asset
from workbridge import egress, http_tools
from workbridge.egress import EgressRefused, check_entry
from workbridge.models import Binding, EgressRule, Invocation, InvocationStatus, Secret, Tool
from workbridge.selectors import allowlist_for

TOOL_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_]{0,63}")
SECRET_NAME = re.compile(r"[A-Za-z0-9_]{1,64}")
MAX_TOOL_TIMEOUT_S = 300.0
MAX_TOOL_OUTPUT_BYTES = 16 * 2**20
INVOCATION_EXCERPT_CHARS = 2000


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
        raise Conflict(f"'{entry}' is already on this workspace's allowlist.")
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


def _check_tool(*, name: str, description: str, parameters: dict, binding: str, config: dict, timeout_s: float,
                max_output_bytes: int) -> dict:
    if not isinstance(name, str) or not TOOL_NAME.fullmatch(name):
        raise ValidationFailed("A tool's name must be a function name: letters, digits and '_', starting with a "
                               "letter, at most 64.", fields={"name": ["Not a function name."]})
    if not str(description).strip():
        raise ValidationFailed("Describe the tool for the model that will call it.",
                               fields={"description": ["This field may not be blank."]})
    if not isinstance(parameters, dict) or parameters.get("type", "object") != "object":
        raise ValidationFailed("'parameters' must be a JSON Schema of type object.",
                               fields={"parameters": ["Must be an object schema."]})
    try:
        Draft202012Validator.check_schema(parameters)
    except SchemaError as exc:
        raise ValidationFailed(f"'parameters' is not a valid JSON Schema: {exc.message}",
                               fields={"parameters": [exc.message]})
    if binding not in Binding.values:
        raise ValidationFailed(f"Unknown binding '{binding}'.", fields={"binding": ["Unknown binding."]})
    if not 0 < timeout_s <= MAX_TOOL_TIMEOUT_S or not 0 < max_output_bytes <= MAX_TOOL_OUTPUT_BYTES:
        raise ValidationFailed(f"The timeout must be within (0, {MAX_TOOL_TIMEOUT_S:g}] s and the output cap within "
                               f"(0, {MAX_TOOL_OUTPUT_BYTES}] bytes.")
    try:
        return http_tools.check_config(config, parameters)
    except http_tools.ToolConfigInvalid as exc:
        raise ValidationFailed(str(exc), fields={"config": [str(exc)]})


def _register(actor: Actor, tool: Tool) -> None:
    payload = {"name": tool.name, "description": tool.description, "binding": tool.binding,
               "parameters": tool.parameters, "config": tool.config, "timeout_s": tool.timeout_s,
               "max_output_bytes": tool.max_output_bytes}
    register_asset(workspace=tool.workspace, kind=AssetKind.TOOL, ref_id=tool.pk, name=tool.name, payload=payload,
                   summary={"binding": tool.binding, "method": tool.config.get("method")}, actor=actor)


@transaction.atomic
def save_tool(*, actor: Actor, workspace: Workspace, tool: Tool | None = None, name: str, description: str,
              parameters: dict, config: dict, binding: str = Binding.HTTP, timeout_s: float = 30.0,
              max_output_bytes: int = 1_048_576) -> Tool:
    """Create a tool, or change `tool`: each change that alters it is a new version in the asset registry."""
    require_role(actor=actor, workspace=workspace, role=Role.DEVELOPER)
    config = _check_tool(name=name, description=description, parameters=parameters, binding=binding, config=config,
                         timeout_s=timeout_s, max_output_bytes=max_output_bytes)
    fields = {"name": name, "description": description.strip(), "binding": binding, "parameters": parameters,
              "config": config, "timeout_s": timeout_s, "max_output_bytes": max_output_bytes}
    try:
        with transaction.atomic():
            if tool is None:
                tool = Tool.objects.create(workspace=workspace, created_by=actor.user, **fields)
            else:
                for key, value in fields.items():
                    setattr(tool, key, value)
                tool.save()
    except IntegrityError:
        raise Conflict(f"This workspace already has a tool called '{name}'.")
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
            raise ValidationFailed(f"The tool needs the secret '{name}', which this workspace does not have.")
        return secret.value

    return value


def _excerpt(output) -> str:
    text = output if isinstance(output, str) else json.dumps(output, ensure_ascii=False)
    return text[:INVOCATION_EXCERPT_CHARS]


def invoke_tool(*, actor: Actor, tool: Tool, arguments: dict, caller: str) -> ToolResult:
    """Call the tool once and record the call. Arguments that break its schema are a ToolArgumentsInvalid (400);
    anything that goes wrong on the way out (a refused host, a timeout, a cap, an error status) is a failed
    invocation with its reason, returned, never raised."""
    require_role(actor=actor, workspace=tool.workspace, role=Role.DEVELOPER)
    if not isinstance(arguments, dict):
        raise ToolArgumentsInvalid("The arguments must be a JSON object.", fields={"arguments": ["Not an object."]})
    problems = sorted(Draft202012Validator(tool.parameters).iter_errors(arguments), key=lambda e: list(e.path))
    if problems:
        where = "/".join(str(part) for part in problems[0].absolute_path) or "arguments"
        raise ToolArgumentsInvalid(f"The arguments do not fit the tool's schema at {where}: {problems[0].message}",
                                   fields={"arguments": [problems[0].message]})
    call = http_tools.render(tool.config, arguments, _secret_of(tool.workspace))
    started = time.perf_counter()
    status, output, error, http_status = InvocationStatus.OK, None, "", None
    try:
        answer = egress.request(call.method, call.url, params=call.params, headers=call.headers,
                                json_body=call.json_body, content=call.content, timeout_s=tool.timeout_s,
                                max_bytes=tool.max_output_bytes,
                                allowlist=allowlist_for(workspace_id=tool.workspace_id))
        http_status = answer.status_code
        output = _output_of(answer)
        if answer.status_code >= 400:
            status, error = InvocationStatus.FAILED, f"{call.method} answered {answer.status_code}"
    except egress.EgressRefused as exc:
        status, error = InvocationStatus.FAILED, str(exc)
    latency_ms = (time.perf_counter() - started) * 1000
    invocation = Invocation.objects.create(
        tool=tool, caller=caller[:64], actor=actor.user, arguments=json.loads(call.redact(json.dumps(arguments))),
        status=status,
        http_status=http_status, latency_ms=latency_ms, error=call.redact(error),
        result_excerpt=call.redact(_excerpt(output)) if output is not None else "")
    return ToolResult(invocation=invocation, output=output, request=call.describe())


def _output_of(answer: egress.Answer):
    if "json" in answer.headers.get("content-type", ""):
        try:
            return answer.json()
        except ValueError:
            pass
    return answer.text
