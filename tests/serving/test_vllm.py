"""vLLM replicas need an NVIDIA GPU. Off a GPU node the engine refuses clearly; on one, a real `vllm serve`
replica is started and answers through the gateway's engine interface."""

import importlib.util
import os
import shutil

import pytest

from cluster import inventory
from cluster.models import Device
from cluster.services import register_node
from serving.engines.base import engine
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
    import httpx

    from serving.engines import process
    from serving.models import Model

    model_dir = os.environ.get("FACTORY_VLLM_TEST_MODEL")
    if not model_dir:
        pytest.skip("set FACTORY_VLLM_TEST_MODEL to a local Hugging Face model directory (no downloads here)")
    model = Model(name="vllm-test", kind="hf", path=model_dir, chat_template="{{ messages }}")
    port = process.free_port()
    spec = engine("vllm").launch_spec(model=model, settings={"gpu_memory_utilization": 0.5}, served_name="vllm-test",
                                      port=port)
    pid = process.launch(spec.argv, log_path=tmp_path / "vllm.log", env=spec.env)
    try:
        process.wait_healthy(f"http://127.0.0.1:{port}{spec.health_path}", pid=pid, log_path=tmp_path / "vllm.log",
                             timeout_s=spec.start_timeout_s)
        answer = httpx.post(f"http://127.0.0.1:{port}/v1/completions",
                            json={"model": "vllm-test", "prompt": "Hello", "max_tokens": 8}, timeout=120)
        assert answer.status_code == 200 and answer.json()["choices"][0]["text"]
    finally:
        process.terminate(pid)
