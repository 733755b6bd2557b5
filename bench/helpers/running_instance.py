"""What the serving benchmarks share: Django set up as `make run` runs it, a throwaway API key, a bench deployment
of the SmolLM2 preset started and stopped through serving.services, and client-side timing of chat completions
with the definitions in serving/metrics.py.

Run the benchmarks from the repository root against a running instance (`make run`)."""

import os
import platform
import secrets
import shlex
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import TypeVar

import django
import httpx
from django.conf import settings

REPO_ROOT = Path(__file__).resolve().parents[2]


def _use_instance_settings() -> None:
    """`make run` writes the settings it started the instance with to .run/env (its URL, data dir, Redis and
    database URL). Read them before Django does, so that a benchmark talks to that instance and uses its database
    and broker even on non-default ports; a variable set in the environment wins."""
    env_file = REPO_ROOT / ".run" / "env"
    if not env_file.exists():
        return
    for line in env_file.read_text().splitlines():
        name, _, value = line.removeprefix("export ").partition("=")
        os.environ.setdefault(name, "".join(shlex.split(value)))


_use_instance_settings()
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "factory.settings")
django.setup()

# The project's models can only be imported once Django is set up.
from django.contrib.auth import get_user_model  # noqa: E402

from accounts.models import Workspace  # noqa: E402
from accounts.services import Actor, create_api_key, revoke_api_key  # noqa: E402
from cluster.models import Node  # noqa: E402
from serving import services  # noqa: E402
from serving.engines.base import engine  # noqa: E402
from serving.metrics import RequestTiming  # noqa: E402
from serving.models import Deployment, Model, Replica, RequestRecord, ServingState  # noqa: E402
from serving.sse import SSEParser  # noqa: E402

# FACTORY_URL is where the platform answers; the gateway is under /v1 and the Prometheus scrape at /metrics.
PLATFORM_URL = os.environ.get("FACTORY_URL", "http://127.0.0.1:8000").rstrip("/").removesuffix("/v1")
GATEWAY_URL = f"{PLATFORM_URL}/v1"
PRESET_MODEL = "smollm2-135m-instruct"
ADMIN_USERNAME = "admin"
REPLICA_START_TIMEOUT_S = 180
REPLICA_STOP_TIMEOUT_S = 60
# Generous, so that a replica stuck behind a queue of streams still counts as slow rather than failed.
CLIENT_TIMEOUT = httpx.Timeout(connect=5.0, read=120.0, write=10.0, pool=120.0)

T = TypeVar("T")

TOPICS = (
    "the moon", "volcanoes", "honey bees", "the river Nile", "glaciers", "octopuses", "the printing press",
    "rainbows", "coral reefs", "the speed of light", "penguins", "the Sahara desert", "tea", "lighthouses",
    "thunderstorms", "the human heart", "bamboo", "comets", "the piano", "salt", "owls", "tides", "maple syrup",
    "the Eiffel Tower", "earthworms", "sunflowers", "the Arctic fox", "copper", "sourdough bread", "whales",
    "the compass", "cacti", "hot air balloons", "snowflakes", "the violin", "rubber", "jellyfish", "the abacus",
    "Mount Everest", "fireflies",
)


def prompts(count: int) -> list[str]:
    """`count` different short questions; past the topic list they stay distinct by their number."""
    return [f"In two sentences, tell me something interesting about {TOPICS[i % len(TOPICS)]}"
            + (f" (question {i + 1})." if i >= len(TOPICS) else ".") for i in range(count)]


def chat_body(*, model: str, prompt: str, max_tokens: int, stream: bool) -> dict:
    """A chat completion; a stream asks for the usage chunk, whose token count TPOT is computed with."""
    body = {"model": model, "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens,
            "temperature": 0, "stream": stream}
    return body | {"stream_options": {"include_usage": True}} if stream else body


@lru_cache(maxsize=4)
def _vocabulary(model_path: str):
    from llama_cpp import Llama

    return Llama(model_path=model_path, vocab_only=True, verbose=False)


def count_tokens(model_path: str, text: str) -> int:
    """Tokens in `text` by the GGUF's own tokenizer (its vocabulary only, never the weights), for answers that
    come without a usage count, such as a published app's."""
    if not text:
        return 0
    return len(_vocabulary(model_path).tokenize(text.encode(), add_bos=False, special=True))


def wait_for(read: Callable[[], T], *, done: Callable[[T], bool], timeout_s: float, interval_s: float = 0.25,
             what: str) -> T:
    """Poll `read` until `done` holds for its value; the last value is returned, or TimeoutError raised."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = read()
        if done(value):
            return value
        if time.monotonic() >= deadline:
            raise TimeoutError(f"Timed out after {timeout_s:.0f}s waiting for {what} (last seen: {value}).")
        time.sleep(interval_s)


def print_header(title: str, measures: str) -> None:
    print(f"== {title}")
    print(measures)
    # Anything else busy on the box shows up in the figures, hence the load average.
    load = ", ".join(f"{value:.2f}" for value in os.getloadavg())
    print(f"Machine: {platform.node()}, {os.cpu_count()} CPU cores (nproc), load average {load}, Python "
          f"{platform.python_version()}; gateway {GATEWAY_URL}; node {settings.NODE_NAME}")


@dataclass
class BenchDeployment:
    """A started deployment of the SmolLM2 preset, with a workspace API key to call the gateway with."""

    deployment: Deployment
    api_key: str

    @property
    def name(self) -> str:
        return self.deployment.name

    @property
    def model_path(self) -> str:
        return self.deployment.model.path

    def replicas(self) -> list[Replica]:
        return list(Replica.objects.filter(deployment=self.deployment).order_by("pk"))

    def describe(self) -> str:
        replicas = ", ".join(f"replica {r.pk} weight {r.weight:g} pid {r.pid} at {r.base_url}"
                             for r in self.replicas())
        settings_ = self.deployment.settings
        return (f"Deployment {self.name} ({PRESET_MODEL}, llama-server, threads={settings_['threads']} and "
                f"{engine('llamacpp').slots(model=self.deployment.model, settings=settings_)} slots per replica, "
                f"cooldown {self.deployment.cooldown_s:g}s): {replicas}")

    def record_count(self) -> int:
        return RequestRecord.objects.filter(deployment=self.deployment).count()

    def wait_for_records(self, expected: int, *, timeout_s: float = 15.0) -> int:
        """The gateway writes a request's row in the background just after answering; wait for all of them.
        Returns how many arrived, which is fewer than expected if some were never written."""
        try:
            return wait_for(self.record_count, done=lambda count: count >= expected, timeout_s=timeout_s,
                            what=f"{expected} request records")
        except TimeoutError:
            return self.record_count()


def _replica_states(deployment: Deployment) -> list[str]:
    return list(Replica.objects.filter(deployment=deployment).order_by("pk").values_list("state", flat=True))


def _start(actor: Actor, deployment: Deployment) -> None:
    services.start_deployment(actor=actor, deployment=deployment)
    states = wait_for(lambda: _replica_states(deployment),
                      done=lambda states: all(s in (ServingState.READY, ServingState.FAILED) for s in states),
                      timeout_s=REPLICA_START_TIMEOUT_S, what=f"the replicas of {deployment.name} to start")
    if ServingState.FAILED in states:
        errors = Replica.objects.filter(deployment=deployment, state=ServingState.FAILED).values_list(
            "last_error", flat=True)
        raise RuntimeError(f"A replica of {deployment.name} failed to start: {' | '.join(errors)}")


def _stop_and_delete(actor: Actor, deployment: Deployment) -> None:
    # A replica being (re)started by a job or the health check would outlive a stop sent now.
    wait_for(lambda: _replica_states(deployment), done=lambda states: ServingState.STARTING not in states,
             timeout_s=REPLICA_START_TIMEOUT_S, what=f"the replicas of {deployment.name} to finish starting")
    services.stop_deployment(actor=actor, deployment=deployment)
    wait_for(lambda: _replica_states(deployment),
             done=lambda states: all(s == ServingState.STOPPED for s in states),
             timeout_s=REPLICA_STOP_TIMEOUT_S, what=f"the replicas of {deployment.name} to stop")
    # Bench traffic would only blur the platform's request history, so its rows go with the deployment.
    RequestRecord.objects.filter(deployment=deployment).delete()
    deployment.delete()


@contextmanager
def bench_deployment(*, label: str, weights: list[float], threads: int,
                     cooldown_s: float = 30.0) -> Iterator[BenchDeployment]:
    """Create and start `bench-<label>-<random>` with one replica per weight on this node, and an API key in the
    admin's first workspace; on the way out stop and delete the deployment and revoke the key."""
    admin = get_user_model().objects.get(username=ADMIN_USERNAME)
    actor = Actor(user=admin)
    workspace = Workspace.objects.filter(memberships__user=admin).order_by("memberships__created_at").first()
    issued = create_api_key(actor=actor, workspace=workspace, name=f"bench-{label}")
    try:
        node = Node.objects.get(name=settings.NODE_NAME)
        model = Model.objects.get(workspace=None, name=PRESET_MODEL)
        deployment = services.create_deployment(
            actor=actor, workspace=None, model=model, name=f"bench-{label}-{secrets.token_hex(3)}",
            settings_={"threads": threads}, replicas=[(node, weight) for weight in weights], cooldown_s=cooldown_s)
        try:
            _start(actor, deployment)
            deployment.refresh_from_db()
            yield BenchDeployment(deployment=deployment, api_key=issued.secret)
        finally:
            _stop_and_delete(actor, deployment)
    finally:
        revoke_api_key(actor=actor, api_key=issued.api_key)


@dataclass
class StreamResult:
    """One streamed chat completion as the client saw it. `timing` follows serving.metrics: `received_at` is when
    the client sent the request, and every SSE event with content is a content chunk."""

    timing: RequestTiming
    finished_at: float = 0.0
    pieces: list[str] = field(default_factory=list)
    output_tokens: int | None = None
    error: str = ""

    @property
    def ok(self) -> bool:
        return not self.error

    @property
    def text(self) -> str:
        return "".join(self.pieces)

    def tpot_ms(self) -> float | None:
        # Chunks are not tokens: the engine's usage count says how many tokens the answer took.
        return self.timing.tpot_ms(self.output_tokens) if self.output_tokens else None


def _chunk_content(chunk: dict) -> str:
    return "".join((choice.get("delta") or {}).get("content") or "" for choice in chunk.get("choices") or [])


async def stream_chat(client: httpx.AsyncClient, *, base_url: str, api_key: str | None, body: dict,
                      to_llama_server: bool = False) -> StreamResult:
    """Send a streaming chat completion and time its content chunks. Any way the stream can go wrong (an HTTP
    error, a transport error, an error event, no [DONE]) ends up in `error`, never raised. A request straight to a
    llama-server asks for the connection close that server does after a stream anyway, as the gateway does
    (serving.gateway.CLOSES_AFTER_STREAM), rather than race it."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    if to_llama_server:
        headers["Connection"] = "close"
    result = StreamResult(timing=RequestTiming(received_at=time.perf_counter()))
    finished = False
    try:
        async with client.stream("POST", f"{base_url}/chat/completions", json=body, headers=headers) as response:
            if response.status_code != 200:
                detail = (await response.aread()).decode(errors="replace")[:200]
                result.error = f"HTTP {response.status_code}: {detail}"
            else:
                parser = SSEParser()
                # Past [DONE], read on to the end of the body so that the connection goes back to the pool.
                async for raw in response.aiter_raw():
                    arrived = time.perf_counter()
                    for event in parser.feed(raw):
                        finished = finished or event.is_done
                        chunk = event.json()
                        if finished or chunk is None:
                            continue
                        if "error" in chunk:
                            result.error = f"error event: {chunk['error'].get('message', chunk['error'])}"
                        if content := _chunk_content(chunk):
                            result.timing.content_chunk(arrived)
                            result.pieces.append(content)
                        if chunk.get("usage"):
                            result.output_tokens = chunk["usage"].get("completion_tokens")
    except httpx.HTTPError as exc:
        result.error = f"{exc.__class__.__name__}: {exc}"
    if not result.error and not finished:
        result.error = "the stream ended without [DONE]"
    result.finished_at = time.perf_counter()
    return result
