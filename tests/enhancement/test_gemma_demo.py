"""The demo path on the real engine: the Gemma-3-270M base (which ships without a chat template) is instruction-tuned
on the shipped dataset, exported to Q4_K_M with Gemma's turn format inside the GGUF, deployed in one click, and
chats through the gateway's /v1/chat/completions."""

import json
from pathlib import Path

import httpx
import pytest

from serving.gguf_info import read_gguf
from serving.models import Deployment, ServingState
from serving.presets import GEMMA3, register_presets
from tests.conftest import wait_for
from tests.enhancement.conftest import finished, start

pytestmark = [pytest.mark.worker, pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def _ready(name: str) -> bool:
    deployment = Deployment.objects.get(name=name)
    if deployment.state == ServingState.FAILED:
        pytest.fail(f"{name} failed: {deployment.replicas.first().last_error}")
    return deployment.state == ServingState.READY


@pytest.mark.timeout(900)
def test_gemma_is_tuned_quantized_deployed_and_chats_through_the_gateway(tuner, celery_worker_process, web_server,
                                                                          settings):
    register_presets(lambda line: None)
    # The web process shares the worker's node, as on the appliance: one click deploys there.
    settings.NODE_NAME = node = celery_worker_process["node"]
    job = start(tuner, node, base_model=GEMMA3, name="gemma-chat", quantizations=("q4_k_m",), max_steps=4,
                cutoff=128, learning_rate=5e-4, save_steps=50, eval_steps=50)

    done = wait_for(lambda: finished(job), timeout=720, interval=2, what="the Gemma job to finish")
    detail = tuner.get(f"/api/enhancement/jobs/{job.pk}/").json()
    assert done.state == "succeeded", f"{done.error}\n{tuner.get(f'/api/enhancement/jobs/{job.pk}/log/').json()}"
    rows = {row["model"]: row for row in detail["report"]["rows"]}
    assert rows["base"]["quantization"] == "Q4_K_M" and rows["output"]["quantization"] == "q4_k_m"
    assert rows["output"]["perplexity"] > 1 and rows["output"]["decode_tokens_per_s"] > 0
    [output] = detail["outputs"]
    assert output["quantization"] == "Q4_K_M"
    assert "<start_of_turn>model" in read_gguf(Path(done.output_models.get().path)).chat_template

    deployed = tuner.post(f"/api/enhancement/jobs/{job.pk}/deploy/", {"model": output["name"]}, format="json")
    assert deployed.status_code == 201, deployed.json()
    name = deployed.json()["name"]
    wait_for(lambda: _ready(name), timeout=180, what=f"{name} to be ready")
    chat = httpx.post(f"{web_server}/v1/chat/completions", headers={"Authorization": f"Bearer {tuner.key}"},
                      json={"model": name, "max_tokens": 32, "temperature": 0,
                            "messages": [{"role": "user", "content": "Give an antonym for the word \"big\"."}]},
                      timeout=120)

    assert chat.status_code == 200, chat.text
    answer = chat.json()["choices"][0]["message"]["content"]
    assert answer.strip()
    metrics = tuner.get(f"/api/enhancement/jobs/{job.pk}/metrics/").json()["samples"]
    print(json.dumps({"metrics": metrics, "report": detail["report"], "chat": answer}, ensure_ascii=False))
