"""One call of a published app: the pinned config version's pipeline run for a question, with its trace stored
whatever the outcome (answered, failed, or the client went away mid-stream)."""

import asyncio
import contextvars
import logging
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from asgiref.sync import sync_to_async

from accounts.errors import NotFound, ValidationFailed
from rag_studio.rag import RagResult
from rag_studio.services import pipeline_for
from runtime.access import Access
from runtime.models import Channel, Conversation, Trace, TraceStatus
from serving.models import Deployment

logger = logging.getLogger(__name__)
MAX_QUERY_CHARS = 4000
MAX_END_USER_CHARS = 128
HISTORY_TURNS = 6
STORED_TEXT_CHARS = 600
_background: set[asyncio.Task] = set()


@dataclass
class Call:
    access: Access
    channel: str
    query: str
    stream: bool
    end_user: str
    history: list[dict] = field(default_factory=list)
    conversation: Conversation | None = None
    message_id: uuid.UUID = field(default_factory=uuid.uuid4)
    started: float = field(default_factory=time.perf_counter)


def clean_query(value) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ValidationFailed("'query' must be a non-empty string.", fields={"query": ["Required."]})
    if len(value) > MAX_QUERY_CHARS:
        raise ValidationFailed(f"'query' is {len(value)} characters; the limit is {MAX_QUERY_CHARS}.",
                               fields={"query": ["Too long."]})
    return value.strip()


def _end_user(value, access: Access) -> str:
    if value is None or value == "":
        return access.end_user_default
    if not isinstance(value, str) or len(value) > MAX_END_USER_CHARS:
        raise ValidationFailed(f"'user' must be a string of at most {MAX_END_USER_CHARS} characters.",
                               fields={"user": ["Invalid."]})
    return value


def prepare(*, access: Access, channel: str, query, stream: bool = False, user=None, conversation_id=None,
            history: list[dict] | None = None) -> Call:
    """Check the question and find (or start) its conversation. A conversation belongs to one end user of one
    app: anyone else's id is reported as unknown."""
    call = Call(access=access, channel=channel, query=clean_query(query), stream=stream,
                end_user=_end_user(user, access), history=history or [])
    if conversation_id not in (None, ""):
        conversation = None
        try:
            conversation = Conversation.objects.filter(app=access.app, end_user=call.end_user,
                                                       public_id=uuid.UUID(str(conversation_id))).first()
        except ValueError:
            pass
        if conversation is None:
            raise NotFound(f"Conversation '{conversation_id}' not found for this user of '{access.app.slug}'.")
        call.conversation, call.history = conversation, conversation_history(conversation)
    elif channel in (Channel.CHAT, Channel.WIDGET):
        call.conversation = Conversation.objects.create(app=access.app, end_user=call.end_user)
    return call


def conversation_history(conversation: Conversation) -> list[dict]:
    turns = list(conversation.traces.filter(status=TraceStatus.OK).order_by("-created_at", "-id")
                 .values_list("query", "answer")[:HISTORY_TURNS])
    history = []
    for query, answer in reversed(turns):
        history += [{"role": "user", "content": query}, {"role": "assistant", "content": answer}]
    return history


def usage_of(result: RagResult | None) -> dict:
    usage = (result.usage if result else None) or {}
    prompt, completion = usage.get("input_tokens"), usage.get("output_tokens")
    return {"prompt_tokens": prompt, "completion_tokens": completion,
            "total_tokens": (prompt or 0) + (completion or 0) if prompt is not None else None}


def _hit_summary(n: int, hit) -> dict:
    return {"n": n, "chunk_id": hit.chunk_id, "document": hit.filename, "document_id": hit.document_id,
            "page": hit.page, "score": hit.rerank if hit.rerank is not None else hit.fused,
            "scores": {"dense": hit.dense, "keyword": hit.keyword, "fused": hit.fused, "rerank": hit.rerank},
            "text": hit.text[:STORED_TEXT_CHARS]}


def public_hits(result: RagResult) -> list[dict]:
    return [_hit_summary(n, hit) for n, hit in enumerate(result.hits, start=1)]


def public_citations(result: RagResult) -> list[dict]:
    return [{**c, "text": c["text"][:STORED_TEXT_CHARS]} for c in result.citations()]


def save_trace(call: Call, result: RagResult | None, status: str, error: str = "") -> Trace:
    settings = call.access.release.config_version.settings
    deployment = settings.get("model", "")
    model = Deployment.objects.filter(name=deployment).values_list("model__name", flat=True).first() or ""
    timings = result.timings_ms if result else {}
    usage = usage_of(result)
    answered = result is not None and status != TraceStatus.ERROR
    return Trace.objects.create(
        app=call.access.app, release=call.access.release, conversation=call.conversation,
        public_id=call.message_id, app_key=call.access.app_key, channel=call.channel, end_user=call.end_user,
        stream=call.stream, query=call.query, queries=result.queries if result else [],
        answer=result.answer if result else "", hits=public_hits(result) if result else [],
        citations=public_citations(result) if answered and result.answer else [],
        deployment=deployment, model=model, input_tokens=usage["prompt_tokens"],
        output_tokens=usage["completion_tokens"], retrieval_ms=timings.get("retrieval"),
        ttft_ms=timings.get("ttft"), latency_ms=round((time.perf_counter() - call.started) * 1000, 2),
        status=status, error=error[:4000])


async def _save_detached(call: Call, result: RagResult | None, status: str, error: str) -> None:
    try:
        await sync_to_async(save_trace, thread_sensitive=False)(call, result, status, error)
    except Exception:
        logger.exception("Could not store the trace of %s", call.message_id)


def _save_in_background(call: Call, result: RagResult | None, status: str, error: str) -> None:
    # A fresh context: the request's context carries asgiref's per-request executor, which is gone by the time
    # the task reaches the database.
    task = asyncio.create_task(_save_detached(call, result, status, error), context=contextvars.Context())
    _background.add(task)
    task.add_done_callback(_background.discard)


async def run(call: Call) -> AsyncIterator[tuple[str, object]]:
    """The pipeline's events: ("hits", result) before the first token, ("token", text)…, ("done", result). The
    trace is stored before "done" is passed on, so the message id it carries can take feedback at once."""
    result, status, error = None, TraceStatus.CANCELLED, ""
    try:
        pipeline = await sync_to_async(pipeline_for, thread_sensitive=False)(call.access.release.config_version)
        async for kind, value in pipeline.astream(call.query, call.history):
            if kind == "done":
                result, status = value, TraceStatus.OK
                await sync_to_async(save_trace, thread_sensitive=False)(call, result, status)
            elif kind == "hits":
                result = value
            yield kind, value
    except Exception as exc:
        status, error = TraceStatus.ERROR, f"{type(exc).__name__}: {exc}"
        raise
    finally:
        # Failed, or the client disconnected (the stream is cancelled or closed mid-way): store it without
        # awaiting, since a cancelled task may not get to run an await.
        if status != TraceStatus.OK:
            _save_in_background(call, result, status, error)


def retrieve(call: Call) -> RagResult:
    """Retrieval only, as the pinned config does it (rewrites included), for debugging and load tests; its trace
    is stored either way. Runs in a worker thread."""
    try:
        result = pipeline_for(call.access.release.config_version).retrieve(call.query, call.history)
    except Exception as exc:
        save_trace(call, None, TraceStatus.ERROR, f"{type(exc).__name__}: {exc}")
        raise
    save_trace(call, result, TraceStatus.OK)
    return result
