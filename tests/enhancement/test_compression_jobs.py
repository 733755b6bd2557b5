"""Prune and distill jobs on a real worker: each output a new model, with a report against the base."""

import json

import pytest
from django.test import Client
from gguf import GGUFReader

from accounts.services import SYSTEM
from cluster.models import Node
from enhancement.runner import run_dir
from serving.models import Deployment, Model, ServingState
from serving.services import create_deployment, start_deployment
from tests.conftest import wait_for
from tests.enhancement.conftest import finished

pytestmark = [pytest.mark.worker, pytest.mark.django_db(transaction=True)]


def report_rows(client, job) -> dict:
    detail = client.get(f"/api/enhancement/jobs/{job}/").json()
    return {row["model"]: row for row in detail["report"]["rows"]}, detail


@pytest.mark.timeout(600)
@pytest.mark.slow
def test_pruning_mlp_channels_makes_a_smaller_model_and_reports_what_it_cost(tuner, celery_worker_process):
    answer = tuner.post("/api/enhancement/jobs/prune/", {
        "name": "slim", "base_model": "smollm2-135m-instruct", "method": "mlp_channels", "sparsity": 0.25,
        "quantizations": ["q8_0"], "node": celery_worker_process["node"]}, format="json")
    assert answer.status_code == 201, answer.json()

    done = wait_for(lambda: finished(answer.json()["id"]), timeout=540, interval=1, what="the prune job")

    rows, detail = report_rows(tuner, done.pk)
    assert done.state == "succeeded", f"{done.error}\n{(run_dir(done) / 'train.log').read_text()[-3000:]}"
    # 25% of 1536 channels is 1152, between multiples of 256: the tie keeps more, 1280 (a sixth pruned).
    assert detail["report"]["pruning"]["intermediate_size"] == {"before": 1536, "after": 1280}
    assert detail["report"]["pruning"]["sparsity"] == pytest.approx(1 / 6)
    [output] = done.output_models.all()
    assert GGUFReader(output.path).fields["llama.feed_forward_length"].contents() == 1280
    assert output.parameter_count < 0.92 * Model.objects.get(name="smollm2-135m-instruct").parameter_count
    assert rows["output"]["perplexity_ratio"] > 1  # nothing recovered what the channels held
    page = Client()
    page.login(username="tuner", password="x" * 12)
    shown = page.get(f"/enhancement/jobs/{done.pk}/").content.decode()
    assert "Pruned by mlp_channels: 0.167 of the weights or channels removed (0.25 requested)." in shown
    assert 'data-report="output-q8_0"' in shown


@pytest.mark.timeout(600)
@pytest.mark.slow
def test_sequence_distillation_trains_the_student_on_the_teacher_deployments_answers(tuner, celery_worker_process,
                                                                                    web_server):
    node = Node.objects.get(name=celery_worker_process["node"])
    teacher = create_deployment(actor=SYSTEM, workspace=None, model=Model.objects.get(name="smollm2-135m-instruct"),
                                name="teacher", replicas=[(node, 1.0)])
    start_deployment(actor=SYSTEM, deployment=teacher)
    wait_for(lambda: Deployment.objects.get(pk=teacher.pk).state == ServingState.READY, timeout=180,
             what="the teacher deployment")
    answer = tuner.post("/api/enhancement/jobs/distill/", {
        "name": "pupil", "student": "smollm2-135m-instruct", "dataset": tuner.dataset.pk, "mode": "sequence",
        "teacher": "teacher", "max_prompts": 3, "node": node.name, "quantizations": ["q8_0"],
        "hyperparameters": {"max_steps": 2, "batch_size": 2, "cutoff": 64, "eval_steps": 50}}, format="json")
    assert answer.status_code == 201, answer.json()

    done = wait_for(lambda: finished(answer.json()["id"]), timeout=540, interval=1, what="the distill job")

    assert done.state == "succeeded", f"{done.error}\n{(run_dir(done) / 'train.log').read_text()[-3000:]}"
    taught = [json.loads(line)["messages"] for line in (run_dir(done) / "teacher.jsonl").read_text().splitlines()]
    validation = tuner.dataset.validation_count
    assert len(taught) == 3 + validation  # the teacher's three answers, then the validation split as it was
    assert all(messages[-1]["role"] == "assistant" and messages[-1]["content"] for messages in taught)
    rows, detail = report_rows(tuner, done.pk)
    assert detail["outputs"][0]["name"] == "pupil-q8-0" and rows["output"]["perplexity"] > 1


@pytest.mark.timeout(600)
@pytest.mark.slow
def test_int8_quantization_makes_hugging_face_weights_measured_through_transformers(tuner, celery_worker_process):
    answer = tuner.post("/api/enhancement/jobs/quantize/", {
        "name": "int8", "base_model": "smollm2-135m-instruct", "quantizations": ["int8"],
        "node": celery_worker_process["node"]}, format="json")
    assert answer.status_code == 201, answer.json()

    done = wait_for(lambda: finished(answer.json()["id"]), timeout=540, interval=1, what="the int8 job")

    rows, detail = report_rows(tuner, done.pk)
    assert done.state == "succeeded", f"{done.error}\n{(run_dir(done) / 'train.log').read_text()[-3000:]}"
    [output] = done.output_models.all()
    assert output.kind == "hf" and output.name == "int8-int8"
    config = json.loads((run_dir(done) / "model-int8" / "config.json").read_text())
    assert config["quantization_config"]["quant_method"] == "torchao"
    # int8 linear layers (the tied embedding stays float): well under the float32 model's 540 MB.
    assert rows["output"]["size_bytes"] < 250e6
    # The same model, read by another runtime at another precision: its perplexity stays close to the base's.
    assert 0.9 < rows["output"]["perplexity_ratio"] < 1.1, rows
    assert rows["output"]["decode_tokens_per_s"] > 0 and rows["output"]["token_f1"] is not None
    page = Client()
    page.login(username="tuner", password="x" * 12)
    assert 'data-report="output-int8"' in page.get(f"/enhancement/jobs/{done.pk}/").content.decode()
    # Hugging Face weights are vLLM's to serve, on a GPU node: a CPU node says why not.
    refused = tuner.post(f"/api/enhancement/jobs/{done.pk}/deploy/",
                         {"model": output.name, "node": celery_worker_process["node"]}, format="json")
    assert refused.status_code == 400 and "vLLM needs a GPU" in refused.json()["error"]["message"], refused.json()
    # This server's node (the test process's) never joined the pool: a 400 that says so, not a 500.
    unregistered = tuner.post(f"/api/enhancement/jobs/{done.pk}/deploy/", {"model": output.name}, format="json")
    assert unregistered.status_code == 400 and "is not in the pool" in unregistered.json()["error"]["message"]
