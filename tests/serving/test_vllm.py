"""vLLM replicas need an NVIDIA GPU. Off a GPU node the engine refuses clearly. Its settings, command line and
health checks are tested without one, against a stand-in `vllm` (a small HTTP server that answers as vLLM does:
/health once loaded, /metrics in vLLM's names, /v1 only with the key), since no GPU exists where the suite runs; on
a GPU node, a real `vllm serve` replica is started and answers through the gateway's engine interface."""

import importlib.util
import json
import os
import re
import shutil
import stat
import sys

import httpx
import pytest

from accounts.services import SYSTEM
from cluster import inventory
from cluster.models import Device
from cluster.services import register_node
from serving import services
from serving.engines import process
from serving.engines.base import EngineRefused, Listen, engine
from serving.presets import SMOLLM2, register_presets

GPU_PRESENT = shutil.which("nvidia-smi") is not None and importlib.util.find_spec("vllm") is not None


@pytest.mark.django_db
def test_vllm_is_refused_on_a_node_without_a_gpu(make_workspace, key_client):
    workspace = make_workspace("Acme", owner="ann")
    register_presets(lambda line: None)
    register_node(name="cpu-box", resources=inventory.probe())
    Device.objects.filter(node__name="cpu-box").delete()

    response = key_client("ann", workspace).post("/api/serving/deployments/", {
        "model": SMOLLM2, "engine": "vllm", "replicas": [{"node": "cpu-box", "weight": 1}], "start": False,
    }, format="json")

    assert response.status_code == 400
    assert response.json()["error"]["message"] == "vLLM needs a GPU, and node 'cpu-box' has none."


@pytest.mark.gpu
@pytest.mark.skipif(not GPU_PRESENT, reason="needs an NVIDIA GPU and `pip install -e .[vllm]`; CI has neither")
@pytest.mark.django_db
def test_a_vllm_replica_serves_openai_chat_on_a_gpu_node(tmp_path):
    from serving.models import Model

    model_dir = os.environ.get("FACTORY_VLLM_TEST_MODEL")
    if not model_dir:
        pytest.skip("set FACTORY_VLLM_TEST_MODEL to a local Hugging Face model directory (no downloads here)")
    model = Model(name="vllm-test", kind="hf", path=model_dir, chat_template="{{ messages }}")
    port = process.free_port()
    key = process.write_key_file(tmp_path / "vllm.key", "test-key")
    spec = engine("vllm").launch_spec(model=model, settings={"gpu_memory_utilization": 0.5}, served_name="vllm-test",
                                      listen=Listen(host="127.0.0.1", port=port, key_file=key))
    pid = process.launch(spec.argv, log_path=tmp_path / "vllm.log", env=spec.env)
    try:
        process.wait_healthy(f"http://127.0.0.1:{port}{spec.health_path}", pid=pid, log_path=tmp_path / "vllm.log",
                             timeout_s=spec.start_timeout_s)
        answer = httpx.post(f"http://127.0.0.1:{port}/v1/completions", headers={"Authorization": "Bearer test-key"},
                            json={"model": "vllm-test", "prompt": "Hello", "max_tokens": 8}, timeout=120)
        assert answer.status_code == 200 and answer.json()["choices"][0]["text"]
    finally:
        process.terminate(pid)


H100S = """\
0, NVIDIA H100 80GB HBM3, 81559, GPU-1f7a6c1e-0d2b-4a7b-9b8e-3c1d2e4f5a6b
1, NVIDIA H100 80GB HBM3, 81559, GPU-1f7a6c1e-0d2b-4a7b-9b8e-3c1d2e4f5a6c
"""
# What vLLM's /metrics says of a replica with 3 requests running and 1 waiting (vLLM 0.10's names; its
# cache_config_info gauge carries the KV cache's blocks as labels).
VLLM_METRICS = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="chat"} 3.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="chat"} 1.0
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="chat"} 0.125
# HELP vllm:prompt_tokens_total Number of prefill tokens processed.
# TYPE vllm:prompt_tokens_total counter
vllm:prompt_tokens_total{engine="0",model_name="chat"} 5120.0
# HELP vllm:generation_tokens_total Number of generation tokens processed.
# TYPE vllm:generation_tokens_total counter
vllm:generation_tokens_total{engine="0",model_name="chat"} 2048.0
# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="16",cache_dtype="auto",enable_prefix_caching="True",engine="0",\
gpu_memory_utilization="0.85",num_cpu_blocks="None",num_gpu_blocks="8192"} 1.0
"""

# A stand-in for `vllm serve`: it records how it was started, answers /health with 503 while "loading" and then
# 200, /metrics with VLLM_METRICS, and /v1/models only with the key from VLLM_API_KEY, as vLLM does.
FAKE_VLLM = """#!{python}
import json, os, sys, time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

args = sys.argv[1:]
option = lambda name: args[args.index(name) + 1]
json.dump({{"argv": args, "key": os.environ.get("VLLM_API_KEY"), "gpus": os.environ.get("CUDA_VISIBLE_DEVICES")}},
          open({record!r}, "w"))
loaded = time.monotonic() + 0.5

class Handler(BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def do_GET(self):
        if self.path == "/health":
            status, body = (200 if time.monotonic() > loaded else 503), b""
        elif self.path == "/metrics":
            status, body = 200, {metrics!r}.encode()
        elif self.headers.get("Authorization") != "Bearer " + os.environ["VLLM_API_KEY"]:
            status, body = 401, b'{{"error": "Unauthorized"}}'
        else:
            status, body = 200, json.dumps({{"data": [{{"id": option("--served-model-name")}}]}}).encode()
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

ThreadingHTTPServer((option("--host"), int(option("--port"))), Handler).serve_forever()
"""


@pytest.fixture
def gpu_node():
    reading = inventory.Resources(hostname="gpu-box", cpu_cores=16, memory_bytes=64 * 2**30,
                                  memory_available_bytes=32 * 2**30, load_average=[0.0, 0.0, 0.0],
                                  gpus=inventory.parse_nvidia_smi(H100S), llama_cuda=True)
    return register_node(name="gpu-box", resources=reading)


@pytest.mark.django_db
@pytest.mark.parametrize("settings_, message", [
    ({"tensor_parallel_size": 4}, "A tensor-parallel size of 4 needs 4 GPUs; node 'gpu-box' gives this replica 2."),
    ({"tensor_parallel_size": 2, "gpus": "1"}, "needs 2 GPUs; node 'gpu-box' gives this replica 1."),
    ({"gpus": "2"}, "Node 'gpu-box' has no GPU 2 (its GPUs: 0, 1)."),
    ({"gpus": "all"}, "'gpus' must name the node's GPUs by index"),
    ({"gpu_memory_utilization": 1.5}, "'gpu_memory_utilization' must be a share of the GPU's memory"),
    ({"max_num_seqs": 0}, "'max_num_seqs' must be a whole number, at least 1"),
    ({"context_length": 100_000}, "beyond what 'smollm2-135m-instruct' was trained for (8192)"),
    ({"dtype": "int4"}, "'dtype' must be one of auto, bfloat16, float16"),
])
def test_vllm_settings_out_of_range_are_refused_with_the_reason(gpu_node, settings_, message):
    model = register_presets(lambda line: None)[SMOLLM2]
    with pytest.raises(services.ValidationFailed, match=re.escape(message)):
        services.create_deployment(actor=SYSTEM, workspace=None, model=model, engine_name="vllm",
                                   settings_=settings_, replicas=[(gpu_node, 1.0)])


@pytest.mark.django_db
def test_a_vllm_replica_is_launched_with_its_settings_answers_health_and_reports_its_load(gpu_node, tmp_path):
    model = register_presets(lambda line: None)[SMOLLM2]
    deployment = services.create_deployment(
        actor=SYSTEM, workspace=None, model=model, name="chat", engine_name="vllm", replicas=[(gpu_node, 1.0)],
        settings_={"tensor_parallel_size": 2, "gpus": "0,1", "gpu_memory_utilization": 0.9, "max_num_seqs": 64,
                   "context_length": 4096, "dtype": "bfloat16"})
    adapter = engine("vllm")
    assert adapter.cpu_threads(deployment.settings) == 0  # it computes on the GPUs, not the node's cores
    port = process.free_port()
    key = process.write_key_file(tmp_path / "chat.key", "replica-key")
    spec = adapter.launch_spec(model=model, settings=deployment.settings, served_name="chat",
                               listen=Listen(host="127.0.0.1", port=port, key_file=key))
    assert spec.argv == [
        "vllm", "serve", model.path, "--served-model-name", "chat", "--host", "127.0.0.1", "--port", str(port),
        "--tensor-parallel-size", "2", "--gpu-memory-utilization", "0.9", "--max-num-seqs", "64",
        "--max-model-len", "4096", "--dtype", "bfloat16"]
    assert "replica-key" not in " ".join(spec.argv)  # the key goes by the environment, not the process list
    assert (spec.health_path, spec.start_timeout_s) == ("/health", 900.0)

    fakes = tmp_path / "bin"
    fakes.mkdir()
    record = tmp_path / "started.json"
    fake = fakes / "vllm"
    fake.write_text(FAKE_VLLM.format(python=sys.executable, record=str(record), metrics=VLLM_METRICS))
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    log = tmp_path / "vllm.log"
    pid = process.launch(spec.argv, log_path=log, env={**spec.env, "PATH": f"{fakes}:{os.environ['PATH']}"})
    try:
        root = f"http://127.0.0.1:{port}"
        process.wait_healthy(f"{root}{spec.health_path}", pid=pid, log_path=log, timeout_s=30)
        started = json.loads(record.read_text())
        assert started == {"argv": spec.argv[1:], "key": "replica-key", "gpus": "0,1"}
        assert process.probe(f"{root}/health")  # health needs no key
        assert httpx.get(f"{root}/v1/models").status_code == 401
        assert httpx.get(f"{root}/v1/models", headers={"Authorization": "Bearer replica-key"}).json()["data"] == [
            {"id": "chat"}]
        assert adapter.live_stats(f"{root}/v1", "replica-key", deployment.settings) == {
            "slots_total": 64, "slots_busy": 3, "requests_waiting": 1, "kv_cache_tokens": 16384,
            "kv_cache_capacity": 131072, "kv_cache_use": 0.125, "prompt_tokens_total": 5120,
            "output_tokens_total": 2048}
    finally:
        process.terminate(pid)
    assert not process.is_alive(pid)
    assert adapter.live_stats(f"{root}/v1", "replica-key")["error"].startswith("The engine did not report its load")


def test_vllm_refuses_a_registered_model_it_cannot_serve():
    class Kind:
        kind = "external"

        def get_kind_display(self):
            return "External endpoint"

    with pytest.raises(EngineRefused, match="vLLM serves model directories or GGUF files"):
        engine("vllm").check(model=Kind(), node=None)
