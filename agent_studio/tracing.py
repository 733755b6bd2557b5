"""A run's recorder: a LangChain callback handler that sees every gateway model call and every tool call of the
run (nested graphs included), stores each as a RunStep, publishes it live, keeps the run's counters and lease, and
holds the run to its limits: it raises, ending the run with the reason, when the run is cancelled, past its time,
or about to exceed its model or tool calls. The templates record their own steps (plan, answer) through `record`.
The tokens of a call tagged ANSWER_TAG (the answer being written) are published as they come, not stored: the
answer step and the run keep the whole text."""

import threading
import time
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import F
from django.utils import timezone
from langchain_core.callbacks import BaseCallbackHandler

from accounts.cancellation import Cancellation
from agent_studio import events
from agent_studio.models import AgentRun, RunStep, StepKind
from agent_studio.strategies import ANSWER_TAG, GATEWAY_TAG
from rag_studio.pipeline.screening import screen_text

DETAIL_CHARS = 4000
CANCEL_CHECK_S = 0.5
INJECTION_ONLY = {"pii": "allow", "secret": "allow", "injection": "flag"}


class RunCancelled(Exception):
    pass


class RunLimitReached(Exception):
    pass


def _clip(text, limit: int = DETAIL_CHARS) -> str:
    text = text if isinstance(text, str) else str(text)
    return text if len(text) <= limit else text[:limit] + "…"


def injection_flags(text: str) -> list[str]:
    """Phrases aimed at the model that rag_studio's screening finds in a tool result: shown on the step, and
    counted by the safety evaluation as indirect injection attempts."""
    return [finding.preview for finding in screen_text(text, INJECTION_ONLY).findings]


def step_payload(step: RunStep) -> dict:
    return {"index": step.index, "kind": step.kind, "name": step.name, "ok": step.ok, "detail": step.detail,
            "latency_ms": step.latency_ms, "input_tokens": step.input_tokens, "output_tokens": step.output_tokens,
            "at": step.created_at.isoformat()}


class Recorder(BaseCallbackHandler):
    raise_error = True  # a cancelled run or a spent limit must stop the graph, not be logged and ignored

    def __init__(self, run: AgentRun, *, owner: str, cancellation: Cancellation):
        self.run_pk, self.public_id, self.owner, self.cancellation = run.pk, run.public_id, owner, cancellation
        self.limits = run.version.settings["limits"]
        self.lock = threading.Lock()
        self.index = run.steps.count()
        self.model_calls, self.tool_calls = run.model_calls, run.tool_calls
        self.deadline = time.monotonic() + self.limits["timeout_s"]
        self.cancel_checked = float("-inf")
        self.pending: dict = {}
        self.answering: set = set()

    # ---- limits ----

    def check(self, *, strict: bool = False) -> None:
        """Before each model and tool call: the run's time, and whether it was cancelled (its Cancellation, and a
        database read: before a model call at most every CANCEL_CHECK_S, before a tool call, which may act on the
        world, always)."""
        now = time.monotonic()
        if not self.cancellation.cancelled and (strict or now - self.cancel_checked >= CANCEL_CHECK_S):
            self.cancel_checked = now
            if AgentRun.objects.filter(pk=self.run_pk, cancel_requested=True).exists():
                self.cancellation.cancel()
        if self.cancellation.cancelled:
            raise RunCancelled("The run was cancelled.")
        if now > self.deadline:
            raise RunLimitReached(f"The run took longer than its limit of {self.limits['timeout_s']} s.")

    # ---- steps ----

    def record(self, kind: str, name: str, detail: dict, *, ok: bool = True, latency_ms: float | None = None,
               input_tokens: int | None = None, output_tokens: int | None = None) -> RunStep:
        with self.lock:
            self.index += 1
            with transaction.atomic():
                step = RunStep.objects.create(run_id=self.run_pk, index=self.index, kind=kind, name=name[:128],
                                              detail=detail, ok=ok, latency_ms=latency_ms,
                                              input_tokens=input_tokens, output_tokens=output_tokens)
                counters = {"lease_until": timezone.now() + timedelta(seconds=settings.RUN_LEASE_S),
                            "model_calls": self.model_calls, "tool_calls": self.tool_calls}
                if input_tokens or output_tokens:
                    counters |= {"input_tokens": F("input_tokens") + (input_tokens or 0),
                                 "output_tokens": F("output_tokens") + (output_tokens or 0)}
                AgentRun.objects.filter(pk=self.run_pk, lease_owner=self.owner).update(**counters)
        events.publish(self.public_id, "step", step_payload(step))
        return step

    # ---- model calls (only those that reach the gateway) ----

    def on_chat_model_start(self, serialized, messages, *, run_id, tags=None, metadata=None, **kwargs):
        if GATEWAY_TAG not in (tags or []):
            return
        self.check()
        with self.lock:
            if self.model_calls >= self.limits["max_steps"]:
                raise RunLimitReached(f"The agent reached its limit of {self.limits['max_steps']} model calls "
                                      f"without finishing.")
            self.model_calls += 1
            self.pending[run_id] = (time.perf_counter(), (metadata or {}).get("ls_model_name", ""))
            if ANSWER_TAG in tags:
                self.answering.add(run_id)

    def on_llm_new_token(self, token, *, run_id, **kwargs):
        if token and run_id in self.answering:
            events.publish(self.public_id, "token", {"text": token})

    def on_llm_end(self, response, *, run_id, **kwargs):
        self.answering.discard(run_id)
        started = self.pending.pop(run_id, None)
        if started is None:
            return
        message = response.generations[0][0].message if response.generations and response.generations[0] else None
        usage = (getattr(message, "usage_metadata", None) or {}) if message is not None else {}
        detail = {"content": _clip(getattr(message, "content", "") or "")}
        if getattr(message, "tool_calls", None):
            detail["tool_calls"] = [{"name": call["name"], "arguments": call["args"]} for call in message.tool_calls]
        self.record(StepKind.MODEL, started[1] or "model", detail, latency_ms=(time.perf_counter() - started[0]) * 1000,
                    input_tokens=usage.get("input_tokens"), output_tokens=usage.get("output_tokens"))

    def on_llm_error(self, error, *, run_id, **kwargs):
        self.answering.discard(run_id)
        started = self.pending.pop(run_id, None)
        if started is not None:
            self.record(StepKind.MODEL, started[1] or "model", {"error": _clip(f"{type(error).__name__}: {error}")},
                        ok=False, latency_ms=(time.perf_counter() - started[0]) * 1000)

    # ---- tool calls ----

    def on_tool_start(self, serialized, input_str, *, run_id, inputs=None, **kwargs):
        self.check(strict=True)
        with self.lock:
            if self.tool_calls >= self.limits["max_tool_calls"]:
                raise RunLimitReached(f"The agent reached its limit of {self.limits['max_tool_calls']} tool calls.")
            self.tool_calls += 1
            name = (serialized or {}).get("name") or kwargs.get("name") or "tool"
            self.pending[run_id] = (time.perf_counter(), name, inputs if inputs is not None else input_str)

    def on_tool_end(self, output, *, run_id, **kwargs):
        started = self.pending.pop(run_id, None)
        if started is None:
            return
        text = getattr(output, "content", output)
        text = text if isinstance(text, str) else str(text)
        detail = {"arguments": started[2], "result": _clip(text)}
        flags = injection_flags(text)
        if flags:
            detail["injection_flags"] = flags
        self.record(StepKind.TOOL, started[1], detail, ok=not text.startswith("Tool error"),
                    latency_ms=(time.perf_counter() - started[0]) * 1000)

    def on_tool_error(self, error, *, run_id, **kwargs):
        started = self.pending.pop(run_id, None)
        if started is not None and not isinstance(error, (RunCancelled, RunLimitReached)):
            self.record(StepKind.TOOL, started[1], {"arguments": started[2],
                                                    "error": _clip(f"{type(error).__name__}: {error}")},
                        ok=False, latency_ms=(time.perf_counter() - started[0]) * 1000)
