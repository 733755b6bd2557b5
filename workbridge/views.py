"""Work Bridge's GUI: tools (list, create and edit per binding, try with a form made from the schema, invocation
log), the OpenAPI and cURL import wizards, MCP servers, secrets and the egress allowlist. Thin: every rule and
permission lives in workbridge.services. A tool or MCP server form that is refused comes back as it was typed, with
the reason beside the field it is about."""

import json
import shlex

from django.conf import settings
from django.contrib import messages
from django.http import Http404
from django.shortcuts import redirect, render
from django.utils.translation import gettext as _, gettext_lazy, pgettext_lazy
from django.views.decorators.http import require_POST

from accounts.errors import Conflict, ValidationFailed
from accounts.gui import gui_actor, has_role, workspace_page
from accounts.models import Role
from accounts.services import is_platform_admin
from workbridge import mcp_catalogue, sandbox, selectors, services
from workbridge.http_tools import AUTH_TYPES, BODIES, METHODS
from workbridge.models import Binding, InvocationStatus, McpTransport

# What the HTTP form shows for each body and auth kind (the value is what the tool's config stores), in the order
# offered: the first is a new tool's default (a GET with no auth and no body).
BODY_LABELS = {"none": gettext_lazy("none"), "json": "JSON",
               "form": pgettext_lazy("HTTP request body", "form fields")}
AUTH_LABELS = {"none": gettext_lazy("none"), "bearer": pgettext_lazy("HTTP auth", "bearer token"),
               "header": pgettext_lazy("HTTP auth", "key in a header"),
               "query": pgettext_lazy("HTTP auth", "key in the query"),
               "basic": pgettext_lazy("HTTP auth", "basic (user and password)")}
METHOD_ORDER = ["GET", "POST", "PUT", "PATCH", "DELETE"]
# The argument table's types (JSON Schema's), with what a person reads.
PARAMETER_TYPES = [("string", pgettext_lazy("argument type", "text (string)")),
                   ("integer", pgettext_lazy("argument type", "whole number (integer)")),
                   ("number", pgettext_lazy("argument type", "number")),
                   ("boolean", pgettext_lazy("argument type", "yes or no (boolean)")),
                   ("array", pgettext_lazy("argument type", "list (array)")),
                   ("object", pgettext_lazy("argument type", "object"))]


def _tool(request, tool_id: int):
    return _scoped(selectors.tools(workspace=request.workspace), tool_id)


def _scoped(queryset, pk: int):
    found = queryset.filter(pk=pk).first()
    if found is None:
        raise Http404("Not found in this workspace.")
    return found


def _json_field(post, field: str, label: str, default):
    text = post.get(field, "").strip()
    if not text:
        return default
    try:
        return json.loads(text)
    except ValueError as exc:
        message = _("%(label)s is not valid JSON: %(error)s") % {"label": label, "error": exc}
        raise ValidationFailed(message, fields={field: [message]})


def _number(post, field: str, label: str, default: float) -> float:
    text = post.get(field, "").strip()
    try:
        return float(text) if text else default
    except ValueError:
        message = _("%(label)s must be a number, not '%(value)s'.") % {"label": label, "value": text}
        raise ValidationFailed(message, fields={field: [message]})


def _wire_map(text: str) -> dict[str, str]:
    """'notify, page_size=page[size]' -> {"notify": "notify", "page_size": "page[size]"}."""
    mapping = {}
    for part in (piece.strip() for piece in text.split(",")):
        if part:
            name, _sep, wire = part.partition("=")
            mapping[name.strip()] = wire.strip() or name.strip()
    return mapping


def _header_lines(text: str) -> dict[str, str]:
    headers = {}
    for line in (line.strip() for line in text.splitlines()):
        if line:
            name, colon, value = line.partition(":")
            if not colon:
                message = _("Write each header as 'Name: value', not '%(line)s'.") % {"line": line}
                raise ValidationFailed(message, fields={"headers": [message]})
            headers[name.strip()] = value.strip()
    return headers


def _http_config(post) -> dict:
    auth = {"type": post.get("auth_type", "none")}
    for key in ("secret", "name", "username"):
        if post.get(f"auth_{key}", "").strip():
            auth[key] = post[f"auth_{key}"].strip()
    config = {"method": post.get("method", "GET"), "url": post.get("url", "").strip(),
              "query": _wire_map(post.get("query", "")), "header_args": _wire_map(post.get("header_args", "")),
              "headers": _header_lines(post.get("headers", "")), "body": post.get("body", "none"), "auth": auth}
    if post.get("body_arg", "").strip():
        config["body_arg"] = post["body_arg"].strip()
    return config


def _tool_fields(post, binding: str, tool=None) -> dict:
    """save_tool's arguments from the tool form; the binding's own part depends on the binding."""
    fields = {"name": post.get("name", "").strip(), "description": post.get("description", ""),
              "parameters": _json_field(post, "parameters", _("The arguments' schema"), {"type": "object"}),
              "output_schema": _json_field(post, "output_schema", _("The output schema"), None),
              "binding": binding, "timeout_s": _number(post, "timeout_s", _("Timeout"), 30.0),
              "max_output_bytes": int(_number(post, "max_output_bytes", _("Output cap"), 1_048_576))}
    if binding == Binding.PYTHON:
        fields["config"] = {"code": post.get("code", "")}
    elif binding == Binding.MCP:
        fields["config"], fields["mcp_server"] = tool.config, tool.mcp_server
    else:
        fields["config"] = _http_config(post)
        if binding == Binding.OPENAPI:
            fields["config"]["operation"] = tool.config.get("operation", "")
            fields["spec"] = tool.spec
    return fields


@workspace_page
def tools_home(request):
    return render(request, "workbridge/home.html", _home_context(request))


def _home_context(request) -> dict:
    workspace = request.workspace
    available, reason = sandbox.availability()
    return {
        "tools": selectors.tools_with_last_call(workspace=workspace),
        "specs": selectors.api_specs(workspace=workspace),
        "servers": selectors.mcp_servers(workspace=workspace),
        "secrets": selectors.secrets(workspace=workspace),
        "rules": selectors.egress_rules(workspace=workspace),
        "platform_allow": selectors.platform_allowlist(),
        "sandbox_available": available, "sandbox_reason": reason, "sandbox_unsafe": sandbox.mode() != sandbox.BWRAP,
        "can_admin": has_role(request, Role.ADMIN), "can_develop": has_role(request, Role.DEVELOPER),
        "transports": McpTransport.choices,
        **_catalogue_context(), "may_register_free_form": is_platform_admin(gui_actor(request)),
    }


def _catalogue_context() -> dict:
    try:
        return {"catalogue": selectors.mcp_command_catalogue(),
                "catalogue_note": _("The operator has put no local MCP command in the catalogue (%(file)s).")
                % {"file": settings.MCP_COMMANDS_FILE}}
    except mcp_catalogue.CatalogueRefused as exc:
        return {"catalogue": [], "catalogue_note": str(exc)}


def _refused(exc: ValidationFailed | Conflict, shown: set[str]) -> dict:
    """The reason a save was refused, beside each field it names that the form shows, else above the form."""
    errors = {name: exc.message for name in exc.fields if name in shown}
    return {"errors": errors, "form_error": "" if errors else exc.message}


# The tool form's fields an error can stand beside ("config" is the request as a whole).
TOOL_FIELDS = {"name", "description", "parameters", "output_schema", "config", "headers", "code", "timeout_s",
               "max_output_bytes"}
MCP_SERVER_FIELDS = {"name", "transport", "url", "catalog_entry", "arguments", "command", "auth_secret"}


def _form_context(request, binding: str, tool=None, post=None, refused=None) -> dict:
    available, reason = sandbox.availability()
    config = tool.config if tool is not None else {}
    auth = config.get("auth") or {}
    typed = post or {}
    return {"binding": binding, "binding_label": Binding(binding).label, "tool": tool, "post": post,
            "methods": [method for method in METHOD_ORDER if method in METHODS],
            "bodies": [(body, BODY_LABELS.get(body, body)) for body in BODY_LABELS if body in BODIES],
            "auth_types": [(kind, AUTH_LABELS.get(kind, kind)) for kind in AUTH_LABELS if kind in AUTH_TYPES],
            "parameter_types": PARAMETER_TYPES,
            # What the selects show: as typed, else as saved, else a new tool's defaults.
            "selected": {"method": typed.get("method") or config.get("method") or "GET",
                         "body": typed.get("body") or config.get("body") or "none",
                         "auth_type": typed.get("auth_type") or auth.get("type") or "none",
                         "auth_secret": typed.get("auth_secret", "") if post else auth.get("secret", "")},
            "secret_names": selectors.secrets(workspace=request.workspace).values_list("name", flat=True),
            "sandbox_available": available, "sandbox_reason": reason,
            "sandbox_unsafe": sandbox.mode() != sandbox.BWRAP,
            **(_refused(refused, TOOL_FIELDS) if refused else {"errors": {}, "form_error": ""})}


@workspace_page
def tool_new(request, binding: str):
    if binding not in (Binding.HTTP, Binding.PYTHON):
        raise Http404("Tools of this binding are imported, not written.")
    if request.method == "POST":
        try:
            tool = services.save_tool(actor=gui_actor(request), workspace=request.workspace,
                                      **_tool_fields(request.POST, binding))
        except (ValidationFailed, Conflict) as exc:
            return render(request, "workbridge/tool_form.html",
                          _form_context(request, binding, post=request.POST, refused=exc), status=exc.status)
        messages.success(request, _("Saved the tool %(name)s.") % {"name": tool.name})
        return redirect("tool", tool_id=tool.pk)
    return render(request, "workbridge/tool_form.html", _form_context(request, binding))


@workspace_page
def tool_page(request, tool_id: int):
    tool = _tool(request, tool_id)
    if request.method == "POST":
        try:
            saved = services.save_tool(actor=gui_actor(request), workspace=request.workspace, tool=tool,
                                       **_tool_fields(request.POST, tool.binding, tool))
        except (ValidationFailed, Conflict) as exc:
            return _tool_view(request, tool, post=request.POST, refused=exc)
        tool = saved
        messages.success(request, _("Saved the tool %(name)s: a new version is in the asset registry.")
                         % {"name": tool.name})
        return redirect("tool", tool_id=tool.pk)
    return _tool_view(request, tool)


def _tool_view(request, tool, *, result=None, tried=None, post=None, refused=None):
    status = request.GET.get("status", "")
    calls = tool.invocations.select_related("actor")
    if status in InvocationStatus.values:
        calls = calls.filter(status=status)
    context = _form_context(request, tool.binding, tool, post=post, refused=refused) | {
        "try_fields": _try_fields(tool.parameters, tried or {}), "result": result,
        "invocations": calls[:50], "status_filter": status, "statuses": InvocationStatus.choices,
        "config_json": json.dumps(tool.config, indent=2, ensure_ascii=False),
        "parameters_json": json.dumps(tool.parameters, indent=2, ensure_ascii=False),
        "output_schema_json": json.dumps(tool.output_schema, indent=2, ensure_ascii=False)}
    return render(request, "workbridge/tool.html", context, status=refused.status if refused else 200)


def _try_fields(schema: dict, tried: dict) -> list[dict]:
    """One input per argument, by its type: the test form made from the tool's schema."""
    required = set(schema.get("required") or [])
    fields = []
    for name, prop in (schema.get("properties") or {}).items():
        prop = prop if isinstance(prop, dict) else {}
        kind = prop.get("type") if isinstance(prop.get("type"), str) else "json"
        widget = ("select" if "enum" in prop else "checkbox" if kind == "boolean" else
                  "number" if kind in ("integer", "number") else "text" if kind == "string" else "json")
        value = tried.get(name, prop.get("default", (prop.get("examples") or [""])[0]))
        fields.append({"name": name, "widget": widget, "kind": kind, "required": name in required,
                       "description": prop.get("description", ""), "enum": prop.get("enum", []),
                       "value": json.dumps(value, ensure_ascii=False) if widget == "json" and value != "" else value})
    return fields


def _try_arguments(schema: dict, post) -> dict:
    """The test form's values as the types the schema asks for; a blank optional field is left out."""
    arguments = {}
    for name, prop in (schema.get("properties") or {}).items():
        prop = prop if isinstance(prop, dict) else {}
        kind = prop.get("type") if isinstance(prop.get("type"), str) else "json"
        text = post.get(f"arg_{name}", "")
        if kind == "boolean":
            arguments[name] = text == "on"
            continue
        if text == "":
            continue
        try:
            arguments[name] = (int(text) if kind == "integer" else float(text) if kind == "number" else
                               text if kind == "string" else json.loads(text))
        except ValueError:
            raise ValidationFailed(_("'%(name)s' must be %(kind)s, not '%(value)s'.")
                                   % {"name": name, "kind": kind, "value": text})
    return arguments


@workspace_page
@require_POST
def tool_try(request, tool_id: int):
    tool = _tool(request, tool_id)
    arguments = _try_arguments(tool.parameters, request.POST)
    result = services.invoke_tool(actor=gui_actor(request), tool=tool, arguments=arguments, caller="gui")
    output = result.output if isinstance(result.output, str) else json.dumps(result.output, indent=2,
                                                                              ensure_ascii=False)
    return _tool_view(request, tool, tried=arguments, result={
        "invocation": result.invocation, "output": output,
        "request": json.dumps(result.request, indent=2, ensure_ascii=False)})


@workspace_page
@require_POST
def tool_delete(request, tool_id: int):
    tool = _tool(request, tool_id)
    services.delete_tool(actor=gui_actor(request), tool=tool)
    messages.success(request, _("Deleted the tool %(name)s.") % {"name": tool.name})
    return redirect("tools")


def _spec_source(request) -> dict:
    upload = request.FILES.get("file")
    source = {"text": request.POST.get("text", ""), "url": request.POST.get("url", "").strip(),
              "base_url": request.POST.get("base_url", "").strip(), "source": "pasted",
              "strict": bool(request.POST.get("strict"))}
    if upload is not None:
        if upload.size > services.SPEC_MAX_BYTES:
            raise ValidationFailed(_("The spec file is larger than %(bytes)s bytes.")
                                   % {"bytes": services.SPEC_MAX_BYTES})
        source["text"], source["source"] = upload.read().decode("utf-8", errors="replace"), f"upload: {upload.name}"
    return source


@workspace_page
def import_openapi(request):
    """Step one: a spec (file, pasted or URL) and maybe a base URL; step two: the operations to pick, rename and
    edit; then the import. The spec travels between the steps as text in the form, never as a server-side file."""
    if request.method != "POST":
        return render(request, "workbridge/import_openapi.html", {})
    source = _spec_source(request)
    preview = services.preview_spec(actor=gui_actor(request), workspace=request.workspace, **source)
    if request.POST.get("step") != "import":
        text = source["text"] or json.dumps(preview.document)
        return render(request, "workbridge/import_openapi.html", {
            "preview": preview, "spec_text": text, "base_url": source["base_url"], "source": preview.source,
            "strict": source["strict"],
            "drafts": [{"draft": draft, "parameters": json.dumps(draft.parameters, ensure_ascii=False)}
                       for draft in preview.drafts]})
    chosen = [{"operation": draft.operation, "name": request.POST.get(f"name_{index}", "").strip(),
               "description": request.POST.get(f"description_{index}", "").strip()}
              for index, draft in enumerate(preview.drafts) if request.POST.get(f"pick_{index}")]
    spec = services.import_spec(actor=gui_actor(request), workspace=request.workspace, text=source["text"],
                                base_url=source["base_url"], source=request.POST.get("source", "pasted"),
                                operations=chosen, strict=source["strict"])
    messages.success(request, _("Imported %(title)s: %(count)s tool(s).") % {"title": spec.title,
                                                                             "count": spec.tools.count()})
    return redirect("tools")


@workspace_page
def import_curl(request):
    if request.method != "POST":
        return render(request, "workbridge/import_curl.html", {})
    command = request.POST.get("command", "")
    if request.POST.get("step") != "import":
        draft = services.preview_curl(actor=gui_actor(request), workspace=request.workspace, command=command)
        return render(request, "workbridge/import_curl.html", {
            "command": command, "draft": draft, "secret_names": sorted(draft.secrets),
            "parameters": json.dumps(draft.parameters, indent=2, ensure_ascii=False),
            "config": json.dumps(draft.config, indent=2, ensure_ascii=False)})
    tool = services.import_curl(actor=gui_actor(request), workspace=request.workspace, command=command,
                                name=request.POST.get("name", "").strip(),
                                description=request.POST.get("description", "").strip())
    messages.success(request, _("Saved the tool %(name)s.") % {"name": tool.name})
    return redirect("tool", tool_id=tool.pk)


@workspace_page
@require_POST
def spec_delete(request, spec_id: int):
    spec = _scoped(selectors.api_specs(workspace=request.workspace), spec_id)
    services.delete_spec(actor=gui_actor(request), spec=spec)
    messages.success(request, _("Deleted the spec %(title)s and its tools.") % {"title": spec.title})
    return redirect("tools")


@workspace_page
@require_POST
def secret_set(request):
    secret = services.set_secret(actor=gui_actor(request), workspace=request.workspace,
                                 name=request.POST.get("name", "").strip(), value=request.POST.get("value", ""))
    messages.success(request, _("Saved the secret %(name)s.") % {"name": secret.name})
    return redirect("tools")


@workspace_page
@require_POST
def secret_delete(request, secret_id: int):
    secret = _scoped(selectors.secrets(workspace=request.workspace), secret_id)
    services.delete_secret(actor=gui_actor(request), secret=secret)
    messages.success(request, _("Deleted the secret %(name)s.") % {"name": secret.name})
    return redirect("tools")


@workspace_page
@require_POST
def rule_add(request):
    rule = services.add_egress_rule(actor=gui_actor(request), workspace=request.workspace,
                                    entry=request.POST.get("entry", ""), note=request.POST.get("note", ""))
    messages.success(request, _("Tools in this workspace may now reach %(entry)s.") % {"entry": rule.entry})
    return redirect("tools")


@workspace_page
@require_POST
def rule_delete(request, rule_id: int):
    rule = _scoped(selectors.egress_rules(workspace=request.workspace), rule_id)
    services.remove_egress_rule(actor=gui_actor(request), rule=rule)
    messages.success(request, _("Removed %(entry)s from the allowlist.") % {"entry": rule.entry})
    return redirect("tools")


@workspace_page
@require_POST
def mcp_server_add(request):
    try:
        server = services.save_mcp_server(
            actor=gui_actor(request), workspace=request.workspace, name=request.POST.get("name", "").strip(),
            transport=request.POST.get("transport", McpTransport.HTTP), url=request.POST.get("url", "").strip(),
            catalog_entry=request.POST.get("catalog_entry", "").strip(),
            arguments=_words(request.POST, "arguments"), command=_words(request.POST, "command"),
            auth_secret=request.POST.get("auth_secret", "").strip(),
            timeout_s=_number(request.POST, "timeout_s", _("Timeout"), 30.0))
    except (ValidationFailed, Conflict) as exc:
        refused = _refused(exc, MCP_SERVER_FIELDS)
        return render(request, "workbridge/home.html", _home_context(request) | {
            "mcp_post": request.POST, "mcp_errors": refused["errors"], "mcp_error": refused["form_error"]},
            status=exc.status)
    messages.success(request, _("Registered the MCP server %(name)s.") % {"name": server.name})
    return redirect("mcp-server", server_id=server.pk)


def _words(form, field: str) -> list[str]:
    """A command line typed in a form, split as a shell would (quotes kept together); nothing runs it."""
    try:
        return shlex.split(form.get(field, ""))
    except ValueError as exc:
        raise ValidationFailed(_("%(field)s cannot be read as words: %(reason)s") % {"field": field, "reason": exc},
                               fields={field: [str(exc)]})


@workspace_page
def mcp_server_page(request, server_id: int):
    server = _scoped(selectors.mcp_servers(workspace=request.workspace), server_id)
    if request.method == "POST":
        names = request.POST.getlist("tools")
        tools = services.import_mcp_tools(actor=gui_actor(request), server=server, names=names)
        messages.success(request, _("Imported %(count)s tool(s) from %(name)s.") % {"count": len(tools),
                                                                                   "name": server.name})
        return redirect("mcp-server", server_id=server.pk)
    offered, error = [], ""
    try:
        offered = services.mcp_server_tools(actor=gui_actor(request), server=server)
    except ValidationFailed as exc:
        error = exc.message
    imported = {tool.config.get("tool"): tool for tool in server.tools.all()}
    sandboxed, unsandboxed_reason = selectors.mcp_server_sandboxing(server)
    return render(request, "workbridge/mcp_server.html", {
        "server": server, "error": error, "sandboxed": sandboxed, "unsandboxed_reason": unsandboxed_reason,
        "offered": [{"remote": remote, "imported": imported.get(remote.name),
                     "schema": json.dumps(remote.input_schema, ensure_ascii=False)} for remote in offered]})


@workspace_page
@require_POST
def mcp_server_delete(request, server_id: int):
    server = _scoped(selectors.mcp_servers(workspace=request.workspace), server_id)
    services.delete_mcp_server(actor=gui_actor(request), server=server)
    messages.success(request, _("Removed the MCP server %(name)s and its tools.") % {"name": server.name})
    return redirect("tools")
