"""Serving one gateway request through a model group (DESIGN.md §4, Model groups).

- route: the difficulty score decides before generation; the chosen member's answer is relayed as any deployment's
  (streamed live).
- cascade: the small member answers first, whole, with its tokens' log-probs; a kept answer reaches the client then
  (streamed as chunks all at once when the client asked for a stream: the small answer is buffered until accepted,
  so the client never sees text that is then withdrawn); an escalated request is sent to the big member, whose
  answer streams live. The client's TTFT includes the small member's time either way.
- speculative: one deployment of the big model that decodes with the draft; relayed as it is.

A member that is not ready, or that no replica of can take the request before anything reached the client, is
replaced by the other member: the request still answers, and its GroupRequest records the fallback. The member
asked last (the fallback, or the only member) is waited for while it starts, as a deployment is. A member that
fails mid-stream ends the stream with an error event, as any deployment's does: text already sent cannot be taken
back.
"""

import json
import time
import uuid

from serving import metrics, toolcalls
from serving.engines.base import CHAT, EMBEDDING
from serving.gateway import (
    ENDPOINTS,
    MODEL_GROUP,
    Caller,
    Exchange,
    GatewayError,
    GroupNote,
    Reply,
    check_usable,
    constrained_tools,
    group_servers,
    json_reply,
    open_upstream,
    read_whole,
    record_request,
    record_whole,
    serve_target,
    wait_while_starting,
)
from serving.groups import classifier, policies
from serving.models import GroupMember, GroupPolicy, ToolStrategy
from serving.router import GroupTarget, Target, router


async def _member(group: GroupTarget, member: str, capability: str, *, wait: bool = False) -> Target:
    """The member's deployment, ready for this endpoint, or the GatewayError that says why not. With `wait`, a
    member that is (re)starting is waited for (the gateway's start wait) rather than refused."""
    name = group.members.get(member)
    target = await router.resolve(name) if name else None
    if not isinstance(target, Target):
        raise GatewayError(409, f"The model group '{group.name}' has no {member} member that serves.",
                           code="model_not_ready", param="model")
    if wait:
        target = await wait_while_starting(target)
    return check_usable(target, capability)


def _note(group: GroupTarget, member: str, reason: str, **fields) -> GroupNote:
    return GroupNote(group_id=group.group_id, policy=group.policy, member=member, threshold=group.threshold,
                     reason=reason, costs=group.costs, **fields)


def _other(member: str) -> str:
    return GroupMember.SMALL if member == GroupMember.BIG else GroupMember.BIG


async def _serve_member(group: GroupTarget, member: str, note: GroupNote, *, endpoint: str, body: dict,
                        caller: Caller, timing: metrics.RequestTiming, request_id: str) -> Reply:
    """The chosen member answers; when it cannot (not ready, no replica takes the request) the other one does, and
    the note says so."""
    capability = ENDPOINTS[endpoint]
    content = json.dumps(body).encode()
    other = _other(member)
    has_other = other in group.members
    try:
        target = await _member(group, member, capability, wait=not has_other)
        return await serve_target(target, endpoint=endpoint, body=body, content=content, caller=caller,
                                  timing=timing, request_id=request_id, note=note)
    except GatewayError as exc:
        if not has_other or exc.status not in (409, 503):
            raise
        note.member = other
        note.fallback = f"the {member} member could not answer ({exc.message}); the {other} member answered"
        target = await _member(group, other, capability, wait=True)
        return await serve_target(target, endpoint=endpoint, body=body, content=content, caller=caller,
                                  timing=timing, request_id=request_id, note=note)


@group_servers.registering(MODEL_GROUP)
async def serve_group(group: GroupTarget, *, endpoint: str, body: dict, caller: Caller,
                      timing: metrics.RequestTiming, request_id: str) -> Reply:
    kwargs = {"endpoint": endpoint, "body": body, "caller": caller, "timing": timing, "request_id": request_id}
    if group.policy == GroupPolicy.ROUTE:
        score, why = await _route_score(group, body, caller=caller)
        member = GroupMember.BIG if score >= group.threshold else GroupMember.SMALL
        comparison = ">=" if member == GroupMember.BIG else "<"
        note = _note(group, member, f"route score {score:.3f} {comparison} threshold {group.threshold:.3f} ({why})",
                     score=score)
        return await _serve_member(group, member, note, **kwargs)
    if group.policy == GroupPolicy.CASCADE:
        return await _cascade(group, **kwargs)
    note = _note(group, GroupMember.BIG, "speculative: the big model decodes with its draft")
    return await _serve_member(group, GroupMember.BIG, note, **kwargs)


async def _route_score(group: GroupTarget, body: dict, *, caller: Caller) -> tuple[float, str]:
    """The request's difficulty and what made it: the classifier's, on the request's embedding, where the group
    has one; the rules' otherwise, or when the embedding cannot be had (and the reason says so)."""
    text = policies.request_text(body)
    try:
        rules = policies.route_settings(group.settings.get("route") or {})
        verdict = policies.route_score(text, rules)
    except policies.PolicySettingsInvalid as exc:
        raise GatewayError(409, f"The model group '{group.name}' has unusable route settings: {exc}",
                           code="group_misconfigured", param="model")
    trained = group.settings.get("classifier")
    if rules["score"] != "classifier" or not trained:
        return verdict.score, verdict.why
    try:
        embedding = await _embedding(trained["embedding_deployment"], text, caller=caller, group=group)
        score = round(classifier.score(trained, embedding), 4)
    except (GatewayError, classifier.ClassifierUnavailable) as exc:
        reason = exc.message if isinstance(exc, GatewayError) else str(exc)
        return verdict.score, f"classifier unavailable ({reason}); rules: {verdict.why}"
    return score, f"classifier: P(big answers better) on {trained['embedding_deployment']}'s embedding"


async def _embedding(deployment: str, text: str, *, caller: Caller, group: GroupTarget) -> list[float]:
    """The request's embedding from the classifier's embedding deployment, recorded as the group's request."""
    target = await router.resolve(deployment)
    if not isinstance(target, Target):
        raise GatewayError(409, f"no embedding deployment '{deployment}'", code="model_not_ready")
    check_usable(target, EMBEDDING)
    route, upstream, attempts = await open_upstream(
        target, "embeddings", json.dumps({"model": deployment, "input": text}).encode(), False)
    exchange = Exchange(request_id=uuid.uuid4().hex, caller=caller, target=target, route=route,
                        endpoint="embeddings", attempts=attempts, timing=metrics.RequestTiming(time.perf_counter()),
                        body={}, group_id=group.group_id)
    content, payload = await read_whole(exchange, upstream)
    record_whole(exchange, upstream, content, payload, stream=False)
    try:
        return [float(x) for x in payload["data"][0]["embedding"]]
    except (TypeError, KeyError, IndexError, ValueError):
        raise GatewayError(502, f"'{deployment}' answered {upstream.status_code} without an embedding",
                           code="member_failed")


async def _cascade(group: GroupTarget, *, endpoint: str, body: dict, caller: Caller,
                   timing: metrics.RequestTiming, request_id: str) -> Reply:
    kwargs = {"endpoint": endpoint, "body": body, "caller": caller, "timing": timing, "request_id": request_id}
    capability = ENDPOINTS[endpoint]
    signal = policies.cascade_settings(group.settings.get("cascade") or {})["confidence"]
    try:
        small = await _member(group, GroupMember.SMALL, capability)
    except GatewayError as exc:
        note = _note(group, GroupMember.BIG, "the small member could not answer first", escalated=True,
                     fallback=f"the small member could not answer ({exc.message}); the big member answered")
        return await _serve_member(group, GroupMember.BIG, note, **kwargs)
    small_timing = metrics.RequestTiming(received_at=timing.received_at)
    small_id = uuid.uuid4().hex
    try:
        payload, exchange = await _small_answer(small, group, endpoint=endpoint, body=body, caller=caller,
                                                timing=small_timing, request_id=small_id)
    except GatewayError as exc:
        note = _note(group, GroupMember.BIG, "the small member failed", escalated=True,
                     fallback=f"the small member failed ({exc.message}); the big member answered")
        return await _serve_member(group, GroupMember.BIG, note, **kwargs)
    choice = (payload.get("choices") or [{}])[0]
    verdict = policies.cascade_verdict(choice, threshold=group.threshold, signal=signal)
    if verdict.keep_small or GroupMember.BIG not in group.members:
        reason = verdict.why if verdict.keep_small else f"{verdict.why}; kept: the group has no big member"
        note = _note(group, GroupMember.SMALL, reason, score=verdict.confidence)
        return await _keep_small(payload, exchange, note, request_id=request_id)
    # The set-aside answer is recorded under its own id; the client's id goes to the big member's answer.
    record_request(exchange, stream=False, status=200, usage=payload.get("usage"))
    note = _note(group, GroupMember.BIG, f"escalated: {verdict.why}", score=verdict.confidence, escalated=True,
                 small_usage=payload.get("usage"))
    return await _serve_member(group, GroupMember.BIG, note, **kwargs)


async def _small_answer(small: Target, group: GroupTarget, *, endpoint: str, body: dict, caller: Caller,
                        timing: metrics.RequestTiming, request_id: str) -> tuple[dict, Exchange]:
    """The small member's whole answer with its tokens' log-probs, recorded as its own request (the group's id on
    it); a GatewayError when it could not answer."""
    sent, maps_tool_calls = body, False
    if ENDPOINTS[endpoint] == CHAT and "tools" in body and small.tool_strategy == ToolStrategy.CONSTRAINED:
        sent, maps_tool_calls = constrained_tools(body)
    # One log-prob per token is all the confidence needs (llama-server reports them only for n_probs >= 1); a
    # client that asked for more alternatives gets them.
    asked = body.get("logprobs" if endpoint == "completions" else "top_logprobs")
    alternatives = asked if isinstance(asked, int) and not isinstance(asked, bool) and asked >= 1 else 1
    sent = {key: value for key, value in sent.items() if key != "stream_options"} | {"stream": False}
    sent |= {"logprobs": alternatives} if endpoint == "completions" else {"logprobs": True,
                                                                         "top_logprobs": alternatives}
    route, upstream, attempts = await open_upstream(small, endpoint, json.dumps(sent).encode(), False)
    exchange = Exchange(request_id=request_id, caller=caller, target=small, route=route, endpoint=endpoint,
                        attempts=attempts, timing=timing, body=body, group_id=group.group_id)
    content, payload = await read_whole(exchange, upstream)
    if payload is None or not payload.get("choices"):
        record_whole(exchange, upstream, content, payload, stream=False)
        raise GatewayError(502, f"the small member answered {upstream.status_code}", code="member_failed")
    if maps_tool_calls:
        payload = toolcalls.tool_reply(payload)
    return payload, exchange


async def _keep_small(payload: dict, exchange: Exchange, note: GroupNote, *, request_id: str) -> Reply:
    """The small answer as the client asked for it: whole, or as a stream's chunks sent at once; its log-probs
    only to a client that asked for them. Recorded under the client's request id, timed from the request (its
    first and last content arrive together, when the whole answer is there)."""
    body = exchange.body
    exchange.request_id, exchange.note = request_id, note
    record_request(exchange, stream=bool(body.get("stream")), status=200, usage=payload.get("usage"))
    if not body.get("logprobs"):
        payload = payload | {"choices": [{k: v for k, v in c.items() if k != "logprobs"} for c in payload["choices"]]}
    if body.get("stream"):
        chunks = _as_stream(payload, endpoint=exchange.endpoint, include_usage=Exchange.wants_usage(body))
        reply = Reply(200, _once(chunks), {"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    else:
        reply = json_reply(payload)
    reply.headers["X-Request-Id"] = request_id
    return reply


async def _once(chunk: bytes):
    yield chunk


def _as_stream(payload: dict, *, endpoint: str, include_usage: bool) -> bytes:
    if endpoint == "chat/completions":
        return toolcalls.as_stream(payload, include_usage=include_usage)
    head = {"id": payload.get("id"), "object": "text_completion", "created": payload.get("created"),
            "model": payload.get("model")}
    chunks = [head | {"choices": [{"index": c.get("index", 0), "text": c.get("text") or "",
                                   "finish_reason": c.get("finish_reason")}]} for c in payload["choices"]]
    if include_usage and payload.get("usage"):
        chunks.append(head | {"choices": [], "usage": payload["usage"]})
    return b"".join(f"data: {json.dumps(chunk, ensure_ascii=False)}\n\n".encode() for chunk in chunks) + \
        b"data: [DONE]\n\n"
