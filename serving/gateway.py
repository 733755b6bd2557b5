"""The OpenAI-compatible gateway at /v1/: authenticates a workspace API key, resolves `model` to a deployment,
picks a replica, streams through with httpx, and records TTFT/ITL/TPOT/E2E for every request.

The core (`dispatch`, `serve`) takes plain values and answers with a `Reply`, so that two thin front ends share it:
the lean ASGI app that serves /v1/ in the web process (serving/gateway_asgi.py), and the Django view below, for
Django's test client and the Playground. The body is relayed byte for byte so that the official clients see exactly
what the engine sent.
"""

import asyncio
import atexit
import json
import logging
import time
import uuid
from collections.abc import AsyncGenerator, Awaitable, Callable
from dataclasses import dataclass, field

import aiohttp
import httpx
from asgiref.sync import sync_to_async
from django.conf import settings
from django.http import HttpRequest, HttpResponse, StreamingHttpResponse
from django.utils import timezone
from django.views.decorators.csrf import csrf_exempt
from httpx_aiohttp import AiohttpTransport

from accounts import deferred_writes, ratelimits
from accounts.errors import RateLimited, ServiceUnavailable, Unauthenticated
from accounts.models import ROLE_RANK, Role, rank_of
from accounts.registry import Registry
from accounts.selectors import effective_role
from accounts.services import SERVICE_TOKEN_PREFIX, authenticate_api_key, authenticate_service_token, hash_secret
from serving import metrics, toolcalls
from serving.chat_messages import InvalidMessages, check_messages
from serving.engines.base import CHAT, COMPLETION, EMBEDDING
from serving.models import GroupMember, GroupRequest, RequestRecord, ServingState, ToolStrategy
from serving.router import TABLE_TTL_S, GroupTarget, Route, Target, router
from serving.sse import SSEParser, events_of, has_content, may_hold_usage_or_done
from workbridge import egress, vault

logger = logging.getLogger(__name__)
# The inference routes under /v1/, and what a deployment must be able to do to serve each.
ENDPOINTS = {"chat/completions": CHAT, "completions": COMPLETION, "embeddings": EMBEDDING}
JSON = "application/json"
# Connect errors, timeouts, and resets of a pooled connection to a replica that died: all safe to retry on
# another replica while nothing has reached the client.
RETRYABLE = httpx.TransportError
# Answers that say the replica, not the request, is at fault. 501 (a feature the engine lacks) is the request's.
REPLICA_FAULTS = {500, 502, 503, 504}
# Engines that stream usage only when asked; the gateway always asks, for its metrics.
USAGE_ON_REQUEST = {"llamacpp", "vllm"}
# llama-server closes its connection after every streamed answer without saying so (no `Connection: close`), so a
# pooled connection reused before its close arrives fails with "Server disconnected" (1 stream in 9 at 8 streams
# in flight). Asking for the close up front keeps those connections out of the pool.
CLOSES_AFTER_STREAM = {"llamacpp"}
# Checking an API key is a database read behind a thread hop (0.8 ms, a fifth of what the gateway adds to TTFT);
# a key that passed within this long passes again without it, so a revoked key stops working within this long.
KEY_TRUST_S = 5.0
MAX_TRUSTED_KEYS = 10_000
# Inference spends shared compute, so it needs the developer role; a viewer's key may list the models.
INFERENCE_ROLE = Role.DEVELOPER
_client: httpx.AsyncClient | None = None
_trusted_keys: dict[str, tuple[float, "Caller"]] = {}  # hash of the secret -> (trusted until, caller)


# A model group's requests are served by serving/groups/gateway.py, whose policies build on this module's path for
# one deployment: it registers its server here as the app loads (serving/apps.py), so this module never imports it.
MODEL_GROUP = "model_group"
group_servers: "Registry[Callable[..., Awaitable[Reply]]]" = Registry()


@dataclass(frozen=True)
class Caller:
    """Who a gateway request acts for: a workspace, reached through an API key (with the role it acts with), the
    platform's own service token, or a signed-in GUI session."""

    workspace_id: int
    role: str = Role.DEVELOPER
    key_id: int | None = None


class GatewayError(Exception):
    def __init__(self, status: int, message: str, *, code: str, param: str | None = None,
                 kind: str = "invalid_request_error", retry_after: int | None = None):
        super().__init__(message)
        self.status, self.message, self.code, self.param, self.kind = status, message, code, param, kind
        self.retry_after = retry_after

    def reply(self) -> "Reply":
        body = {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}
        reply = json_reply(body, status=self.status)
        if self.retry_after is not None:
            reply.headers["Retry-After"] = str(self.retry_after)
        return reply


@dataclass
class Reply:
    """A gateway answer, whichever front end sends it: whole bytes, or a stream of them."""

    status: int
    body: bytes | AsyncGenerator[bytes, None]
    headers: dict[str, str] = field(default_factory=dict)


def json_reply(payload: dict, *, status: int = 200) -> Reply:
    return Reply(status, json.dumps(payload).encode(), {"Content-Type": JSON})


def _http_client() -> httpx.AsyncClient:
    global _client
    if _client is None:
        # httpx's API on aiohttp's connections (httpx-aiohttp): reading a streamed token costs half the CPU of
        # httpx's own transport, the largest part of relaying it (bench/relay.py). No proxies from the
        # environment: a proxy would undo the egress guard's pinning to a checked address.
        transport = AiohttpTransport(trust_env=False,
                                     limits=httpx.Limits(max_connections=512, max_keepalive_connections=128))
        _client = httpx.AsyncClient(transport=transport, trust_env=False,
                                    timeout=httpx.Timeout(connect=3.0, read=300.0, write=30.0, pool=60.0))
        atexit.register(_leave_open, transport)
    return _client


def _leave_open(transport: AiohttpTransport) -> None:
    # At exit, where no event loop is left to close it: the process's end closes its connections, and aiohttp
    # would log a session still open as an error.
    if isinstance(transport.client, aiohttp.ClientSession):
        transport.client.detach()


def _key_caller(raw: str) -> Caller:
    """A live key whose maker is still a member of its workspace, with the role it acts with there (the member's,
    capped by the key's)."""
    api_key = authenticate_api_key(raw=raw, stamp_later=True)
    role = effective_role(user=api_key.created_by, api_key=api_key, workspace=api_key.workspace)
    if role is None:
        raise Unauthenticated("The maker of this API key is no longer a member of its workspace.")
    caller = Caller(workspace_id=api_key.workspace_id, role=role, key_id=api_key.pk)
    _trust(hash_secret(raw), api_key, caller)
    return caller


async def _authenticate(authorization: str) -> Caller:
    if not authorization.lower().startswith("bearer "):
        raise GatewayError(401, "Missing API key: send 'Authorization: Bearer <key>'.", code="invalid_api_key")
    raw = authorization[7:].strip()
    try:
        if raw.startswith(SERVICE_TOKEN_PREFIX):  # the platform's own RAG and agent calls: no database needed
            return Caller(workspace_id=authenticate_service_token(raw=raw))
        trusted_until, caller = _trusted_keys.get(hash_secret(raw), (0.0, None))
        if time.monotonic() < trusted_until:
            return caller
        # Not thread-sensitive: a sync view of this same process may be waiting on this very request.
        return await sync_to_async(_key_caller, thread_sensitive=False)(raw)
    except Unauthenticated as exc:
        raise GatewayError(401, exc.message, code="invalid_api_key")


def _trust(digest: str, api_key, caller: Caller) -> None:
    trust_s = KEY_TRUST_S
    if api_key.expires_at is not None:
        trust_s = min(trust_s, (api_key.expires_at - timezone.now()).total_seconds())
    if len(_trusted_keys) >= MAX_TRUSTED_KEYS:
        _trusted_keys.clear()
    _trusted_keys[digest] = (time.monotonic() + trust_s, caller)


async def admit(caller: Caller) -> None:
    """May this caller spend compute now: its role, then its key's and its workspace's rate limits (429 with
    Retry-After past either)."""
    if rank_of(caller.role) < ROLE_RANK[INFERENCE_ROLE]:
        raise GatewayError(403, f"Inference needs the {INFERENCE_ROLE} role; this key acts as {caller.role}. A "
                                f"viewer's key can list the models (/v1/models).", code="insufficient_role",
                           kind="permission_error")
    try:
        if caller.key_id is not None:
            await ratelimits.ahit(settings.GATEWAY_RATE_PER_KEY, "gateway-key", str(caller.key_id),
                                  what="this API key")
        await ratelimits.ahit(settings.GATEWAY_RATE_PER_WORKSPACE, "gateway-workspace", str(caller.workspace_id),
                              what="this workspace")
    except RateLimited as exc:
        raise GatewayError(429, exc.message, code="rate_limit_exceeded", kind="rate_limit_error",
                           retry_after=exc.retry_after)
    except ServiceUnavailable as exc:
        raise GatewayError(503, exc.message, code="unavailable", kind="server_error", retry_after=exc.retry_after)


def _parse_body(content: bytes) -> dict:
    try:
        body = json.loads(content)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise GatewayError(400, f"The request body is not valid JSON: {exc}", code="invalid_json")
    except ValueError as exc:  # an integer past Python's 4,300 digits
        raise GatewayError(400, f"The request body is not acceptable JSON: {exc}", code="invalid_json")
    if not isinstance(body, dict):
        raise GatewayError(400, "The request body must be a JSON object.", code="invalid_json")
    if not isinstance(body.get("model"), str) or not body["model"]:
        raise GatewayError(400, "'model' is required: the name of a deployment (see /v1/models).",
                           code="missing_model", param="model")
    if "stream" in body and not isinstance(body["stream"], bool):
        raise GatewayError(400, "'stream' must be true or false.", code="invalid_type", param="stream")
    return body


def _check_messages(messages) -> None:
    try:
        check_messages(messages)
    except InvalidMessages as exc:
        raise GatewayError(400, exc.message, code="invalid_messages", param=exc.param)


def _check_max_tokens(body: dict, target: Target) -> None:
    for param in ("max_tokens", "max_completion_tokens"):
        value = body.get(param)
        if value is None:
            continue
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise GatewayError(400, f"'{param}' must be a positive integer.", code="invalid_value", param=param)
        if target.context_length and value > target.context_length:
            raise GatewayError(400, f"'{param}' is {value}, beyond the context length of '{target.name}' "
                                    f"({target.context_length} tokens).", code="context_length_exceeded",
                               param=param)


async def _resolve(body: dict, caller: Caller) -> Target | GroupTarget:
    target = await router.resolve(body["model"])
    if target is None or not target.visible_to(caller.workspace_id):
        raise GatewayError(404, f"The model '{body['model']}' does not exist; /v1/models lists the deployments "
                                f"and model groups you can use.", code="model_not_found", param="model")
    return target


async def wait_while_starting(target: Target) -> Target:
    """A deployment whose replicas are starting (the first start, or a restart after its engine died) holds the
    request for up to GATEWAY_START_WAIT_S rather than failing it, as Knative's activator does: a replica that
    crashed mid-conversation costs the caller a pause, not an error. Past the wait: 503 with Retry-After."""
    if target.state != ServingState.STARTING:
        return target
    deadline = time.monotonic() + settings.GATEWAY_START_WAIT_S
    while time.monotonic() < deadline:
        await asyncio.sleep(TABLE_TTL_S / 2)
        latest = await router.resolve(target.name)
        if not isinstance(latest, Target) or latest.state != ServingState.STARTING:
            return latest or target
    raise GatewayError(503, f"The deployment '{target.name}' is still starting after "
                            f"{settings.GATEWAY_START_WAIT_S:.0f}s; try again shortly.", code="model_starting",
                       kind="server_error", retry_after=5)


def check_usable(target: Target, capability: str) -> Target:
    """The deployment is ready and can serve this endpoint, or the GatewayError that says why not."""
    if target.state != ServingState.READY or not target.routes:
        raise GatewayError(409, f"The deployment '{target.name}' is {target.state}; start it on the Models & "
                                f"Serving page.", code="model_not_ready", param="model")
    if capability not in target.capabilities:
        hint = {CHAT: "it is completion-only (no chat template); use /v1/completions or set a chat template",
                COMPLETION: "it does not serve text completions", EMBEDDING: "it is not an embedding model"}
        raise GatewayError(400, f"'{target.name}' cannot serve this endpoint: {hint[capability]}.",
                           code="unsupported_endpoint", param="model")
    return target


def check_group_capability(group: GroupTarget, capability: str) -> None:
    if capability not in group.capabilities:
        raise GatewayError(400, f"The model group '{group.name}' serves {', '.join(sorted(group.capabilities))}, "
                                f"not this endpoint.", code="unsupported_endpoint", param="model")


def _content_of(chunk: dict) -> str:
    parts = []
    for choice in chunk.get("choices") or []:
        delta = choice.get("delta") or {}
        parts.append(delta.get("content") or choice.get("text") or "")
    return "".join(parts)


@dataclass
class GroupNote:
    """For a request through a model group: which member answered and why, written with the request's figures
    once the answer's token counts are known."""

    group_id: int
    policy: str
    member: str
    threshold: float
    reason: str
    # Each member's cost per 1,000 tokens.
    costs: dict[str, float]
    score: float | None = None
    escalated: bool = False
    fallback: str = ""
    # The small member's usage, when its answer was set aside for the big one's.
    small_usage: dict | None = None


@dataclass
class Exchange:
    """One request on its way through the gateway: who asked, what for, and where it went."""

    request_id: str
    caller: Caller
    target: Target
    route: Route
    endpoint: str
    attempts: int
    timing: metrics.RequestTiming
    body: dict
    # Set for a call to a group's member; `note` only on the call whose answer the client gets.
    group_id: int | None = None
    note: GroupNote | None = None

    @staticmethod
    def wants_usage(body: dict) -> bool:
        options = body.get("stream_options")
        return isinstance(options, dict) and bool(options.get("include_usage"))


def record_request(exchange: Exchange, *, stream: bool, status: int, usage: dict | None, error: str = "") -> None:
    """Store the request's figures, with the token counts the engine reported (none if it reported none): its row
    is written after the answer, off the request's path (accounts/deferred_writes.py)."""
    target, timing = exchange.target, exchange.timing
    input_tokens = (usage or {}).get("prompt_tokens")
    output_tokens = (usage or {}).get("completion_tokens")
    metrics.observe(deployment=target.name, replica=exchange.route.label, status=status, timing=timing,
                    input_tokens=input_tokens, output_tokens=output_tokens)
    deferred_writes.insert(RequestRecord(
        request_id=exchange.request_id, deployment_id=target.deployment_id, replica_id=exchange.route.replica_id,
        workspace_id=exchange.caller.workspace_id, endpoint=exchange.endpoint, stream=stream, status=status,
        attempts=exchange.attempts, input_tokens=input_tokens, output_tokens=output_tokens, error=error[:2000],
        group_id=exchange.group_id, **timing.figures(output_tokens)))
    if exchange.note is not None:
        record_group_request(exchange.note, request_id=exchange.request_id,
                             workspace_id=exchange.caller.workspace_id, status=status, usage=usage)


def record_group_request(note: GroupNote, *, request_id: str, workspace_id: int, status: int,
                         usage: dict | None) -> None:
    """Which member answered and why, with each member's tokens and their cost."""
    tokens = {member: (0, 0) for member in GroupMember.values}
    answered = usage or {}
    tokens[note.member] = (answered.get("prompt_tokens") or 0, answered.get("completion_tokens") or 0)
    if note.small_usage:
        tokens[GroupMember.SMALL] = (note.small_usage.get("prompt_tokens") or 0,
                                     note.small_usage.get("completion_tokens") or 0)
    costs = {member: sum(tokens[member]) / 1000 * note.costs.get(member, 0.0) for member in tokens}
    deferred_writes.insert(GroupRequest(
        group_id=note.group_id, workspace_id=workspace_id, request_id=request_id, policy=note.policy,
        member=note.member, score=note.score, threshold=note.threshold, escalated=note.escalated,
        reason=note.reason[:2000], fallback=note.fallback[:2000], status=status,
        small_input_tokens=tokens[GroupMember.SMALL][0], small_output_tokens=tokens[GroupMember.SMALL][1],
        big_input_tokens=tokens[GroupMember.BIG][0], big_output_tokens=tokens[GroupMember.BIG][1],
        small_cost=costs[GroupMember.SMALL], big_cost=costs[GroupMember.BIG]))


async def _upstream_request(target: Target, url: str, content: bytes, headers: dict) -> httpx.Request:
    """Engines the platform started are called directly; an external endpoint is a user's URL, so it goes through
    the egress guard: resolved, checked against the allowlist, and pinned to the checked address."""
    if target.allowlist is None:
        return _http_client().build_request("POST", url, content=content, headers=headers)
    return await egress.pinned(_http_client(), "POST", url, allowlist=target.allowlist, headers=headers,
                               content=content)


async def open_upstream(target: Target, endpoint: str, content: bytes, stream: bool):
    """Send to a replica, failing over to another while nothing has reached the client yet."""
    tried: set[int] = set()
    common = {"Content-Type": JSON}
    if stream and target.engine in CLOSES_AFTER_STREAM:
        common["Connection"] = "close"
    last_error = "no replica is ready"
    if vault.unreadable(target.api_key):
        raise GatewayError(503, f"The API key saved for model '{target.name}' cannot be decrypted with this "
                                f"installation's secrets key: a platform administrator enters it again on the "
                                f"model's page, or puts back the FACTORY_SECRETS_KEY it was saved with.",
                           code="model_key_unreadable", kind="server_error")
    while (route := router.pick(target, exclude=tried)) is not None:
        tried.add(route.replica_id)
        # An engine the platform started takes its replica's key; an external endpoint its model's.
        key = route.api_key or target.api_key
        headers = common | ({"Authorization": f"Bearer {key}"} if key else {})
        try:
            request = await _upstream_request(target, f"{route.base_url}/{endpoint}", content, headers)
            response = await _http_client().send(request, stream=stream)
        except egress.EgressRefused as exc:
            last_error = f"replica {route.replica_id}: {exc}"
            router.cool_down(route, target.cooldown_s)
            continue
        except RETRYABLE as exc:
            last_error = f"replica {route.replica_id}: {exc.__class__.__name__} {exc}".strip()
            router.cool_down(route, target.cooldown_s)
            continue
        if response.status_code in REPLICA_FAULTS:
            last_error = f"replica {route.replica_id} answered {response.status_code}"
            await response.aclose()
            router.cool_down(route, target.cooldown_s)
            continue
        return route, response, len(tried)
    raise GatewayError(503, f"No replica of '{target.name}' could take the request ({last_error}); it will be "
                            f"retried automatically once a replica recovers.", code="no_healthy_replica",
                       kind="server_error")


def _gateway_asks_usage(target: Target, body: dict) -> bool:
    return target.engine in USAGE_ON_REQUEST and not Exchange.wants_usage(body)


def _upstream_content(target: Target, body: dict, content: bytes, stream: bool) -> bytes:
    """The client's own bytes, unless the gateway needs usage in the stream for its metrics: the engines that send
    it only when asked are asked, and the usage-only chunk is held back from a client that did not ask."""
    if stream and _gateway_asks_usage(target, body):
        options = body.get("stream_options") if isinstance(body.get("stream_options"), dict) else {}
        return json.dumps(body | {"stream_options": options | {"include_usage": True}}).encode()
    return content


class BodyTooLarge(Exception):
    """The request body is past the size limit; raised while it is read, before all of it arrived."""


async def dispatch(*, method: str, path: str, authorization: str,
                   read_body: Callable[[], Awaitable[bytes]]) -> Reply:
    """Answer a request for /v1/<path>, in the OpenAI error format whatever goes wrong. The caller is
    authenticated and admitted before the body is read."""
    received_at = time.perf_counter()
    try:
        if path == "models":
            return await _list_models(authorization)
        if path not in ENDPOINTS:
            raise GatewayError(404, f"No gateway endpoint at /v1/{path}; the gateway serves /v1/chat/completions, "
                                    f"/v1/completions, /v1/embeddings and /v1/models.", code="unknown_url")
        if method != "POST":
            raise GatewayError(405, "Use POST.", code="method_not_allowed")
        caller = await _authenticate(authorization)
        await admit(caller)
        try:
            content = await read_body()
        except BodyTooLarge as exc:
            raise GatewayError(413, str(exc), code="request_too_large")
        return await serve(path, method=method, content=content, caller=caller, received_at=received_at)
    except GatewayError as exc:
        return exc.reply()
    except Exception:
        logger.exception("The gateway failed on /v1/%s", path)
        return GatewayError(500, "The gateway failed on our side; it has been logged.", code="internal_error",
                            kind="server_error").reply()


async def serve(endpoint: str, *, method: str, content: bytes, caller: Caller,
                received_at: float | None = None) -> Reply:
    """Serve one OpenAI request to `endpoint` (a key of ENDPOINTS) for an authenticated and admitted caller."""
    timing = metrics.RequestTiming(received_at=received_at or time.perf_counter())
    request_id = uuid.uuid4().hex
    capability = ENDPOINTS[endpoint]
    if method != "POST":
        return GatewayError(405, "Use POST.", code="method_not_allowed").reply()
    try:
        body = _parse_body(content)
        if capability == CHAT:
            _check_messages(body.get("messages"))
        elif capability == COMPLETION and not isinstance(body.get("prompt"), (str, list)):
            raise GatewayError(400, "'prompt' must be a string or a list of strings.", code="invalid_prompt",
                               param="prompt")
        elif capability == EMBEDDING and not body.get("input"):
            raise GatewayError(400, "'input' must be a non-empty string or list.", code="invalid_input",
                               param="input")
        target = await _resolve(body, caller)
        if isinstance(target, GroupTarget):
            check_group_capability(target, capability)
            return await group_servers[MODEL_GROUP](target, endpoint=endpoint, body=body, caller=caller, timing=timing,
                                     request_id=request_id)
        target = await wait_while_starting(target)
        check_usable(target, capability)
        return await serve_target(target, endpoint=endpoint, body=body, content=content, caller=caller,
                                  timing=timing, request_id=request_id)
    except GatewayError as exc:
        return exc.reply()


async def serve_target(target: Target, *, endpoint: str, body: dict, content: bytes, caller: Caller,
                       timing: metrics.RequestTiming, request_id: str, note: GroupNote | None = None) -> Reply:
    """Send the request to one of the deployment's replicas and relay its answer; a GatewayError when none takes
    it (before anything reached the client)."""
    _check_max_tokens(body, target)
    stream = bool(body.get("stream"))
    sent, decision = body, None
    if ENDPOINTS[endpoint] == CHAT and "tools" in body and target.tool_strategy == ToolStrategy.CONSTRAINED:
        functions, choice = _tools_of(body)
        decision = await _decide_tool(target, endpoint, body, functions, choice)
        if decision.name is None:
            sent, decision = toolcalls.without_tools(body), None
        else:
            sent = toolcalls.arguments_request(body, next(f for f in functions if f["name"] == decision.name))
        content = json.dumps(sent).encode()
    maps_tool_calls = decision is not None
    upstream_stream = stream and not maps_tool_calls
    route, upstream, attempts = await open_upstream(
        target, endpoint, _upstream_content(target, sent, content, upstream_stream), upstream_stream)
    exchange = Exchange(request_id=request_id, caller=caller, target=target, route=route, endpoint=endpoint,
                        attempts=attempts, timing=timing, body=body, note=note,
                        group_id=note.group_id if note else None)
    if maps_tool_calls:
        reply = await _relay_tool_call(exchange, upstream, stream, decision)
    elif not stream:
        reply = await _relay_whole(exchange, upstream)
    else:
        reply = Reply(upstream.status_code, _relay_stream(exchange, upstream), {
            "Content-Type": upstream.headers.get("content-type", "text/event-stream"),
            "Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
    reply.headers["X-Request-Id"] = request_id
    return reply


def _tools_of(body: dict) -> tuple[list[dict], str]:
    try:
        functions = toolcalls.functions_of(body)
        return functions, toolcalls.choice_of(body, functions)
    except toolcalls.ToolsInvalid as exc:
        raise GatewayError(400, exc.message, code="invalid_tools", param=exc.param)


async def _decide_tool(target: Target, endpoint: str, body: dict, functions: list[dict],
                       choice: str) -> toolcalls.Decision:
    """Which tool the reply calls (None: it answers in words), for an engine that would drop `tools`: `none` and a
    named function decide themselves; otherwise the engine chooses among the tools nearest the request in a
    constrained step of its own (for `auto`, only when one is near enough, and offered "none" unless one is
    near indeed)."""
    if choice == toolcalls.NONE:
        return toolcalls.Decision(name=None)
    if choice not in (toolcalls.AUTO, toolcalls.REQUIRED):
        return toolcalls.Decision(name=choice)
    ranked = await asyncio.to_thread(toolcalls.ranked_tools, body, functions)
    candidates, may_decline = toolcalls.candidates_of(ranked, choice,
                                                      after_result=body["messages"][-1].get("role") == "tool")
    if not candidates:
        return toolcalls.Decision(name=None)
    if len(candidates) == 1 and not may_decline:
        return toolcalls.Decision(name=candidates[0]["name"])
    request = toolcalls.decision_request(body, candidates, may_decline=may_decline)
    _, upstream, _ = await open_upstream(target, endpoint, json.dumps(request).encode(), False)
    try:
        content = await upstream.aread()
    finally:
        await upstream.aclose()
    try:
        payload = json.loads(content)
    except json.JSONDecodeError:
        payload = None
    if upstream.status_code != 200 or not isinstance(payload, dict):
        error = payload.get("error") if isinstance(payload, dict) else None
        message = error.get("message") if isinstance(error, dict) else content.decode(errors="replace")[:500]
        status = upstream.status_code if 400 <= upstream.status_code < 600 else 502
        raise GatewayError(status, message, code="engine_error",
                           kind="invalid_request_error" if status < 500 else "server_error")
    return toolcalls.decision_of(payload, candidates, may_decline=may_decline)


def constrained_tools(body: dict) -> tuple[dict, bool]:
    """For a model group's cascade, which judges one whole answer, on an engine that would drop `tools`: the
    one-step request to send in place of `body`, and whether its answer is JSON to map back into tool calls."""
    functions, choice = _tools_of(body)
    if choice == toolcalls.NONE:
        return toolcalls.without_tools(body), False
    return toolcalls.constrained_request(body, functions, choice), True


async def read_whole(exchange: Exchange, upstream: httpx.Response) -> tuple[bytes, dict | None]:
    """The engine's whole answer, and the parsed JSON of a successful one."""
    try:
        content = await upstream.aread()
    finally:
        await upstream.aclose()
    exchange.timing.content_chunk(time.perf_counter())
    payload = None
    if upstream.status_code == 200:
        try:
            payload = json.loads(content)
        except json.JSONDecodeError:
            pass
    return content, payload if isinstance(payload, dict) else None


def record_whole(exchange: Exchange, upstream: httpx.Response, content: bytes, payload: dict | None, *,
                  stream: bool) -> None:
    error = "" if upstream.status_code == 200 else content.decode(errors="replace")[:500]
    record_request(exchange, stream=stream, status=upstream.status_code, usage=(payload or {}).get("usage"),
                   error=error)


async def _relay_whole(exchange: Exchange, upstream: httpx.Response) -> Reply:
    content, payload = await read_whole(exchange, upstream)
    record_whole(exchange, upstream, content, payload, stream=False)
    return Reply(upstream.status_code, content, {"Content-Type": upstream.headers.get("content-type", JSON)})


async def _relay_tool_call(exchange: Exchange, upstream: httpx.Response, stream: bool,
                           decision: toolcalls.Decision) -> Reply:
    """The constrained arguments mapped back into a tool call, whole or as a stream's chunks (which all arrive at
    once: the JSON must be complete before it can be mapped); its usage counts the decision step too."""
    content, payload = await read_whole(exchange, upstream)
    if payload is None or "choices" not in payload:
        record_whole(exchange, upstream, content, payload, stream=stream)
        return Reply(upstream.status_code, content, {"Content-Type": upstream.headers.get("content-type", JSON)})
    reply = toolcalls.call_reply(payload, decision)
    record_whole(exchange, upstream, content, reply, stream=stream)
    if stream:
        return Reply(200, toolcalls.as_stream(reply, include_usage=Exchange.wants_usage(exchange.body)),
                     {"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    return json_reply(reply)


async def _relay_stream(exchange: Exchange, upstream: httpx.Response):
    """Forward the engine's events as they complete, as the bytes that came, reading each on the way for the metrics:
    a byte check finds a token's content, and only an event that may carry the usage or end the stream is parsed."""
    parser, usage, finished = SSEParser(), None, False
    status, error = upstream.status_code, ""
    hold_back_usage = _gateway_asks_usage(exchange.target, exchange.body)
    timing = exchange.timing
    try:
        async for raw in upstream.aiter_raw():
            arrived = time.perf_counter()
            block = parser.feed_bytes(raw)
            if not block:
                continue
            if finished or not may_hold_usage_or_done(block):
                if not finished:
                    one_event = block.find(b"\n\n") == len(block) - 2  # a token a read: the usual case, not split
                    for event in (block,) if one_event else block.split(b"\n\n"):
                        if has_content(event):
                            timing.content_chunk(arrived)
                yield block
                continue
            forward = []
            for event in events_of(block):
                finished = finished or event.is_done
                chunk = event.json()
                if chunk is not None and not finished:
                    if _content_of(chunk):
                        timing.content_chunk(arrived)
                    if chunk.get("usage"):
                        usage = chunk["usage"]
                        if hold_back_usage and not chunk.get("choices"):
                            continue  # the usage-only chunk the gateway asked for, not the client
                forward.append(event.encode())
            if forward:
                yield b"".join(forward)
        if rest := parser.close_bytes():
            yield rest
    except httpx.HTTPError as exc:
        # Bytes already reached the client, so there is no retry: end the stream with an error event.
        status, error = 502, f"The replica failed mid-stream: {exc.__class__.__name__}"
        router.cool_down(exchange.route, exchange.target.cooldown_s)
        yield f"data: {json.dumps({'error': {'message': error, 'type': 'server_error'}})}\n\n".encode()
    except (asyncio.CancelledError, GeneratorExit):
        # A hang-up reaches the stream as a cancellation, or as the stream being closed where the server reports
        # it on the next send. Clients hang up as soon as they read [DONE]; only a hang-up before it counts.
        if not finished:
            status, error = 499, "The client disconnected mid-stream."
        raise
    finally:
        await upstream.aclose()
        record_request(exchange, stream=True, status=status, usage=usage, error=error)


async def _list_models(authorization: str) -> Reply:
    caller = await _authenticate(authorization)
    targets = await router.visible_targets(caller.workspace_id)
    return json_reply({"object": "list", "data": [
        {"id": t.name, "object": "model", "created": 0, "owned_by": "ai-factory",
         "capabilities": sorted(t.capabilities)} for t in targets]})


def django_response(reply: Reply) -> HttpResponse:
    if isinstance(reply.body, bytes):
        return HttpResponse(reply.body, status=reply.status, headers=reply.headers)
    return StreamingHttpResponse(reply.body, status=reply.status, headers=reply.headers)


@csrf_exempt
async def gateway_view(request: HttpRequest, path: str) -> HttpResponse:
    """/v1/ through Django: what factory/asgi.py's lean path serves, for Django's test client."""

    async def read_body() -> bytes:
        return request.body

    return django_response(await dispatch(method=request.method, path=path, read_body=read_body,
                                          authorization=request.headers.get("Authorization", "")))
