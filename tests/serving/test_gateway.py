"""The gateway, end to end: deployments started as jobs on a real Celery worker, real llama.cpp and embedding
engine processes, the real ASGI web process, and the official OpenAI and LangChain clients."""

import json
import os
import signal

import httpx
import pytest
from django.contrib.auth import get_user_model
from openai import OpenAI

from accounts.services import SYSTEM, Actor, create_api_key, create_workspace
from cluster import inventory
from cluster.models import Node
from cluster.services import register_node
from serving import services
from serving.engines import process
from serving.models import Deployment, Replica, RequestRecord, ServingState
from serving.presets import GEMMA3, MINILM, SMOLLM2, register_presets
from tests.conftest import METRICS_TOKEN, stop_engines_and_flush, wait_for

pytestmark = pytest.mark.worker


def _ready(name: str) -> bool:
    deployment = Deployment.objects.get(name=name)
    if deployment.state == ServingState.FAILED:
        pytest.fail(f"{name} failed: {deployment.replicas.first().last_error}")
    return deployment.state == ServingState.READY


@pytest.fixture(scope="module")
def stack(celery_worker_process, web_server, django_db_blocker):
    with django_db_blocker.unblock():
        node = register_node(name=celery_worker_process["node"], resources=inventory.probe())
        models = register_presets(lambda line: None)
        for name, replicas in ((SMOLLM2, 2), (GEMMA3, 1), (MINILM, 1)):
            deployment = services.create_deployment(actor=SYSTEM, workspace=None, model=models[name], name=name,
                                                    replicas=[(node, 1.0)] * replicas, cooldown_s=5)
            services.start_deployment(actor=SYSTEM, deployment=deployment)
        for name in (SMOLLM2, GEMMA3, MINILM):
            wait_for(lambda: _ready(name), timeout=180, what=f"{name} to be ready")
        owner = get_user_model().objects.create_user(username="gw-owner", password="x" * 12)
        workspace = create_workspace(actor=Actor(user=owner), name="Gateway users")
        key = create_api_key(actor=Actor(user=owner), workspace=workspace, name="gw").secret
        yield {"url": web_server, "key": key, "workspace": workspace}
        stop_engines_and_flush()


@pytest.fixture
def live_db(django_db_blocker):
    with django_db_blocker.unblock():
        yield


@pytest.fixture
def client(stack) -> OpenAI:
    return OpenAI(base_url=f"{stack['url']}/v1", api_key=stack["key"], max_retries=0)


def test_the_openai_client_streams_a_chat_and_the_request_is_measured(stack, client, live_db):
    before = RequestRecord.objects.count()
    chunks = list(client.chat.completions.create(
        model=SMOLLM2, messages=[{"role": "user", "content": "Name three colours."}], stream=True, max_tokens=24))

    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text.strip()
    record = wait_for(lambda: RequestRecord.objects.count() > before and RequestRecord.objects.first(),
                      what="the request's metrics row")
    assert (record.status, record.stream, record.endpoint) == (200, True, "chat/completions")
    assert 0 < record.ttft_ms <= record.e2e_ms
    assert 1 < record.output_tokens <= 24
    assert record.tpot_ms == pytest.approx((record.e2e_ms - record.ttft_ms) / (record.output_tokens - 1))
    assert record.input_tokens > 0
    scrape = httpx.get(f"{stack['url']}/metrics", headers={"Authorization": f"Bearer {METRICS_TOKEN}"}).text
    assert f'factory_ttft_seconds_count{{deployment="{SMOLLM2}"' in scrape


def test_non_streaming_chat_completions_and_models(stack, client):
    answer = client.chat.completions.create(model=SMOLLM2, messages=[{"role": "user", "content": "Say hi."}],
                                            max_tokens=8)
    assert answer.choices[0].message.content
    assert answer.usage.completion_tokens > 0
    completion = client.completions.create(model=GEMMA3, prompt="The capital of France is", max_tokens=6)
    assert completion.choices[0].text
    # Gemma's GGUF has no chat template; the preset's own makes the base model chat.
    gemma_chat = client.chat.completions.create(model=GEMMA3, messages=[{"role": "user", "content": "Hello"}],
                                                max_tokens=6)
    assert gemma_chat.choices[0].message.content is not None and gemma_chat.usage.prompt_tokens > 3
    listed = {m.id for m in client.models.list().data}
    assert {SMOLLM2, GEMMA3, MINILM} <= listed


def test_langchain_chat_and_embeddings_work_unchanged(stack):
    from langchain_openai import ChatOpenAI, OpenAIEmbeddings

    chat = ChatOpenAI(model=SMOLLM2, base_url=f"{stack['url']}/v1", api_key=stack["key"], max_tokens=12)
    assert chat.invoke("Say hello.").content
    assert "".join(chunk.content for chunk in chat.stream("Count to three.")).strip()
    # check_embedding_ctx_length=False: otherwise LangChain fetches a tiktoken vocabulary from the internet.
    embeddings = OpenAIEmbeddings(model=MINILM, base_url=f"{stack['url']}/v1", api_key=stack["key"],
                                  check_embedding_ctx_length=False)
    vectors = embeddings.embed_documents(["cats purr", "stock markets fell"])
    assert [len(v) for v in vectors] == [384, 384]


@pytest.mark.parametrize("body, status, code", [
    (b"{not json", 400, "invalid_json"),
    (b'{"messages": [{"role": "user", "content": "hi"}]}', 400, "missing_model"),
    (b'{"model": "smollm2-135m-instruct", "messages": "hi"}', 400, "invalid_messages"),
    (b'{"model": "smollm2-135m-instruct", "messages": [{"role": "wizard", "content": "hi"}]}', 400,
     "invalid_messages"),
    (b'{"model": "smollm2-135m-instruct", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 999999}',
     400, "context_length_exceeded"),
    (b'{"model": "no-such-model", "messages": [{"role": "user", "content": "hi"}]}', 404, "model_not_found"),
    (b'{"model": "all-minilm-l6-v2", "messages": [{"role": "user", "content": "hi"}]}', 400, "unsupported_endpoint"),
])
def test_bad_requests_get_openai_style_errors(stack, body, status, code):
    response = httpx.post(f"{stack['url']}/v1/chat/completions", content=body,
                          headers={"Authorization": f"Bearer {stack['key']}", "Content-Type": "application/json"})
    assert response.status_code == status
    error = response.json()["error"]
    assert error["code"] == code and error["message"] and "type" in error


def test_the_usage_chunk_reaches_only_clients_that_ask_for_it(stack, client, live_db):
    def stream(**options) -> list:
        return list(client.chat.completions.create(
            model=SMOLLM2, messages=[{"role": "user", "content": "Hi"}], stream=True, max_tokens=5, **options))

    before = RequestRecord.objects.count()
    unasked = stream()
    asked = stream(stream_options={"include_usage": True})

    assert all(chunk.choices and chunk.usage is None for chunk in unasked)
    assert asked[-1].choices == [] and asked[-1].usage.completion_tokens == 5
    wait_for(lambda: RequestRecord.objects.count() == before + 2, what="both requests' metrics rows")
    measured = RequestRecord.objects.order_by("-id")[:2]
    assert [record.output_tokens for record in measured] == [5, 5]


def test_a_prompt_beyond_a_slot_s_context_is_refused_by_the_engine_with_a_400(stack, live_db):
    context = Deployment.objects.get(name=SMOLLM2).settings.get("context_length") or 4096
    response = httpx.post(f"{stack['url']}/v1/chat/completions", timeout=60,
                          headers={"Authorization": f"Bearer {stack['key']}"},
                          json={"model": SMOLLM2, "stream": True, "max_tokens": 4,
                                "messages": [{"role": "user", "content": "cat " * (context + 100)}]})

    assert response.status_code == 400
    assert "context" in response.json()["error"]["message"]


def test_parallel_slots_serve_concurrent_streams_and_report_their_load(stack, live_db):
    import concurrent.futures

    deployment = Deployment.objects.get(name=SMOLLM2)
    auth = {"Authorization": f"Bearer {stack['key']}"}
    seen_busy = []

    def long_stream() -> int:
        with httpx.stream("POST", f"{stack['url']}/v1/chat/completions", headers=auth, timeout=120,
                          # llama-server's ignore_eos: every stream is long enough to overlap the others,
                          # however soon the model would have stopped.
                          json={"model": SMOLLM2, "stream": True, "max_tokens": 48, "ignore_eos": True,
                                "messages": [{"role": "user", "content": "Tell a long story."}]}) as response:
            chunks = [json.loads(line[6:]) for line in response.iter_lines() if line.startswith("data: {")]
            return sum(1 for chunk in chunks if chunk["choices"] and chunk["choices"][0]["delta"].get("content"))

    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        streams = [pool.submit(long_stream) for _ in range(4)]
        while not all(stream.done() for stream in streams):
            engine = httpx.get(f"{stack['url']}/api/serving/deployments/{deployment.name}/engine/",
                               headers=auth, timeout=10).json()
            seen_busy.append(sum(r.get("slots_busy", 0) for r in engine["replicas"].values()))
        streamed = [stream.result() for stream in streams]

    assert min(streamed) > 10
    assert max(seen_busy) >= 2, "two replicas with several slots each should run the streams side by side"
    reports = httpx.get(f"{stack['url']}/api/serving/deployments/{deployment.name}/engine/", headers=auth,
                        timeout=10).json()["replicas"].values()
    assert all(r["slots_total"] >= 2 and r["kv_cache_capacity"] >= 2 * 2048 for r in reports)
    assert sum(r["output_tokens_total"] for r in reports) >= sum(streamed)


WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}


def test_smollm2_calls_tools_through_the_gateway_though_its_template_has_no_tool_format(stack, client, live_db):
    assert Deployment.objects.get(name=SMOLLM2).tool_strategy == "constrained"
    question = [{"role": "user", "content": "What is the weather in Paris?"}]

    # A tiny model's choice between calling and answering is its own; only the form of each is asserted.
    either = client.chat.completions.create(model=SMOLLM2, messages=question, tools=[WEATHER_TOOL], max_tokens=60)
    named = client.chat.completions.create(model=SMOLLM2, messages=question, tools=[WEATHER_TOOL], max_tokens=60,
                                           tool_choice={"type": "function", "function": {"name": "get_weather"}})
    chunks = list(client.chat.completions.create(model=SMOLLM2, messages=question, tools=[WEATHER_TOOL],
                                                 tool_choice="required", max_tokens=60, stream=True))

    if either.choices[0].finish_reason == "tool_calls":
        assert either.choices[0].message.tool_calls[0].function.name == "get_weather"
    else:
        assert isinstance(either.choices[0].message.content, str) and not either.choices[0].message.tool_calls
    call = named.choices[0].message.tool_calls[0]
    assert named.choices[0].finish_reason == "tool_calls"
    assert call.function.name == "get_weather" and isinstance(json.loads(call.function.arguments)["city"], str)
    streamed = [c.choices[0].delta.tool_calls[0] for c in chunks if c.choices and c.choices[0].delta.tool_calls]
    assert streamed[0].function.name == "get_weather"
    assert isinstance(json.loads(streamed[0].function.arguments)["city"], str)
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


def test_a_langchain_agent_loop_runs_on_smollm2_tool_calls(stack):
    from langchain_core.messages import HumanMessage, ToolMessage
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI

    @tool
    def get_weather(city: str) -> str:
        """Get the current weather in a city."""
        return f"It is 18 degrees and sunny in {city}."

    chat = ChatOpenAI(model=SMOLLM2, base_url=f"{stack['url']}/v1", api_key=stack["key"], max_tokens=60,
                      temperature=0)
    with_tools = chat.bind_tools([get_weather], tool_choice="get_weather")
    messages = [HumanMessage("What is the weather in Paris?")]
    asked = with_tools.invoke(messages)
    assert asked.tool_calls and asked.tool_calls[0]["name"] == "get_weather"

    messages += [asked, ToolMessage(get_weather.invoke(asked.tool_calls[0]["args"]),
                                    tool_call_id=asked.tool_calls[0]["id"])]
    final = chat.bind_tools([get_weather], tool_choice="none").invoke(messages)
    assert isinstance(final.content, str) and not final.tool_calls


def test_malformed_tools_are_a_400_naming_the_field(stack):
    response = httpx.post(f"{stack['url']}/v1/chat/completions", headers={"Authorization": f"Bearer {stack['key']}"},
                          json={"model": SMOLLM2, "messages": [{"role": "user", "content": "hi"}],
                                "tools": [{"type": "function", "function": {"name": "bad name"}}]})
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "tools[0].function.name"


def test_missing_or_revoked_keys_are_refused(stack):
    missing = httpx.get(f"{stack['url']}/v1/models")
    assert missing.status_code == 401 and missing.json()["error"]["code"] == "invalid_api_key"
    wrong = httpx.get(f"{stack['url']}/v1/models", headers={"Authorization": "Bearer afk_123456789012.nope"})
    assert wrong.status_code == 401


def test_a_stopped_deployment_answers_409_until_started_again(stack, live_db):
    services.stop_deployment(actor=SYSTEM, deployment=Deployment.objects.get(name=GEMMA3))
    wait_for(lambda: Deployment.objects.get(name=GEMMA3).state == ServingState.STOPPED, what="gemma stopped")

    def completion() -> httpx.Response:
        return httpx.post(f"{stack['url']}/v1/completions", json={"model": GEMMA3, "prompt": "x", "max_tokens": 2},
                          headers={"Authorization": f"Bearer {stack['key']}"})

    refused = wait_for(lambda: (r := completion()).status_code == 409 and r, what="the router to see the stop")
    assert refused.json()["error"]["code"] == "model_not_ready"
    stopped = Deployment.objects.get(name=GEMMA3)
    assert all(replica.pid is None for replica in stopped.replicas.all())
    states = list(stopped.events.values_list("to_state", flat=True))
    assert ServingState.DRAINING in states and ServingState.STOPPED in states

    services.start_deployment(actor=SYSTEM, deployment=stopped)
    wait_for(lambda: _ready(GEMMA3), timeout=120, what="gemma ready again")
    assert wait_for(lambda: completion().status_code == 200, what="gemma to answer again")


@pytest.mark.slow
def test_a_killed_replica_costs_no_request_and_is_restarted(stack, client, live_db, celery_worker_process):
    from serving.tasks import check_local_replicas

    victim = Deployment.objects.get(name=SMOLLM2).replicas.order_by("id").first()
    os.kill(victim.pid, signal.SIGKILL)
    for _ in range(6):
        answer = client.chat.completions.create(model=SMOLLM2, messages=[{"role": "user", "content": "Hi"}],
                                                max_tokens=4)
        assert answer.choices[0].message.content is not None

    def health_check_then(state: str) -> bool:
        check_local_replicas.apply_async(queue=f"node.{celery_worker_process['node']}")
        return wait_for(lambda: Replica.objects.get(pk=victim.pk).state == state, timeout=10, what=state)

    assert health_check_then(ServingState.FAILED)
    # The first restart waits 2 s of backoff; the next health check after that relaunches the engine.
    wait_for(lambda: _tolerant(health_check_then, ServingState.READY), timeout=60, interval=1,
             what="the replica to be restarted")
    restarted = Replica.objects.get(pk=victim.pk)
    assert restarted.restarts == 1 and restarted.pid != victim.pid and process.is_alive(restarted.pid)


def _tolerant(check, *args) -> bool:
    try:
        return check(*args)
    except AssertionError:
        return False


def test_a_non_streaming_request_is_measured_and_found_by_its_request_id(stack, live_db):
    auth = {"Authorization": f"Bearer {stack['key']}"}
    response = httpx.post(f"{stack['url']}/v1/chat/completions", headers=auth, timeout=60, json={
        "model": SMOLLM2, "messages": [{"role": "user", "content": "Say yes."}], "max_tokens": 6})
    assert response.status_code == 200
    request_id = response.headers["X-Request-Id"]

    record = wait_for(lambda: RequestRecord.objects.filter(request_id=request_id).first(), what="the row")
    assert (record.stream, record.status) == (False, 200)
    assert record.output_tokens == response.json()["usage"]["completion_tokens"]
    looked_up = httpx.get(f"{stack['url']}/api/serving/requests/{request_id}/", headers=auth).json()
    assert looked_up["e2e_ms"] == pytest.approx(record.e2e_ms)


def test_a_model_llama_server_cannot_load_fails_its_replica_with_the_engine_s_reason(stack, live_db, tmp_path,
                                                                                    celery_worker_process):
    import gguf
    import numpy as np

    writer = gguf.GGUFWriter(str(tmp_path / "alien.gguf"), "alien")
    writer.add_context_length(512)
    writer.add_tensor("weight", np.zeros((4, 4), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    model = services.register_model(actor=SYSTEM, workspace=stack["workspace"], name="alien",
                                    path=str(tmp_path / "alien.gguf"))
    node = Node.objects.get(name=celery_worker_process["node"])
    deployment = services.create_deployment(actor=SYSTEM, workspace=stack["workspace"], model=model, name="alien",
                                            replicas=[(node, 1.0)])
    services.start_deployment(actor=SYSTEM, deployment=deployment)

    wait_for(lambda: Deployment.objects.get(pk=deployment.pk).state == ServingState.FAILED, timeout=60,
             what="the deployment to fail")
    assert "unknown model architecture: 'alien'" in deployment.replicas.get().last_error
