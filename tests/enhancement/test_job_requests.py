"""What a fine-tune or compression request is refused for, before anything runs: each a 400 naming the problem."""

import pytest
from bs4 import BeautifulSoup
from django.contrib.auth import get_user_model
from django.test import Client

from accounts.services import Actor, add_member
from cluster.models import Workload
from cluster.scheduling import pool
from enhancement.models import EnhancementJob
from enhancement.services import import_sample_dataset

pytestmark = pytest.mark.django_db


@pytest.fixture
def client(make_workspace, key_client, this_node):
    workspace = make_workspace("Tuning", owner="tuner")
    api = key_client("tuner", workspace)
    api.dataset = import_sample_dataset(actor=Actor(user=get_user_model().objects.get(username="tuner")),
                                        workspace=workspace)
    api.workspace = workspace
    return api


def finetune(client, **overrides):
    body = {"name": "tune", "base_model": "smollm2-135m-instruct", "dataset": client.dataset.pk,
            "hyperparameters": {"max_steps": 4}, "quantizations": ["q8_0"], **overrides}
    return client.post("/api/enhancement/jobs/", body, format="json")


def test_a_valid_request_is_queued_with_the_plan_it_will_run_with(client, smollm2):
    answer = finetune(client)
    assert answer.status_code == 201, answer.json()
    job = answer.json()
    assert job["state"] == "queued" and job["stage"] == "queued"
    chosen = job["plan"]["chosen"]
    assert chosen["tensor_parallel"] == chosen["pipeline_parallel"] == chosen["data_parallel"] == 1
    assert job["hyperparameters"]["micro_batch_size"] == chosen["micro_batch"]
    assert job["hyperparameters"]["gradient_accumulation"] * chosen["micro_batch"] == 4
    assert finetune(client).status_code == 409


def test_an_external_model_is_not_trainable(client, smollm2):
    from serving.models import Model

    Model.objects.create(workspace=client.workspace, name="remote", kind="external", url="https://api.example.com/v1")
    answer = finetune(client, base_model="remote")
    assert answer.status_code == 400
    assert "'remote' is an external endpoint" in answer.json()["error"]["message"]


@pytest.mark.parametrize("settings_, message", [
    ({"learning_rate": 5}, "learning_rate must be between"),
    ({"lora_rank": 0}, "lora_rank must be between 1 and 1024"),
    ({"cutoff": "long"}, "cutoff must be a whole number"),
    ({"lora_targets": ["q_proj", "attention"]}, "LoRA targets must be among"),
    ({"batch_size": 6, "micro_batch_size": 4}, "must be a multiple of the micro-batch size"),
    ({"warmup": 3}, "Unknown setting(s): warmup"),
])
def test_hyperparameters_out_of_range_are_named(client, smollm2, settings_, message):
    answer = finetune(client, hyperparameters=settings_)
    assert answer.status_code == 400
    assert message in answer.json()["error"]["message"]


def test_a_plan_that_cannot_fit_the_node_is_refused(client, smollm2):
    answer = finetune(client, method="full", hyperparameters={"cutoff": 32768, "batch_size": 4096})
    assert answer.status_code == 400
    assert "No layout fits" in answer.json()["error"]["message"]


def test_the_planner_endpoint_plans_for_hardware_entered_by_hand(client, smollm2):
    answer = client.post("/api/enhancement/plan/", {
        "model": "smollm2-135m-instruct", "method": "full", "sequence_length": 2048, "batch_size": 12,
        "devices": [{"count": 6, "memory_gb": 24, "tflops": 80}]}, format="json")
    assert answer.status_code == 200, answer.json()
    plans = answer.json()["plans"]
    assert {p["tensor_parallel"] for p in plans} <= {1, 3}
    assert plans[0]["rank"] == 1 and plans[0]["why"].startswith("fastest estimate")


def test_a_gguf_cannot_be_quantized_back_to_f16(client, smollm2):
    answer = client.post("/api/enhancement/jobs/quantize/", {"name": "q", "base_model": "smollm2-135m-instruct",
                                                             "quantizations": ["f16"]}, format="json")
    assert answer.status_code == 400
    assert "cannot be turned back into f16" in answer.json()["error"]["message"]


@pytest.mark.parametrize("body, message", [
    ({"method": "mlp_channels", "sparsity": 0.95}, "must be between 0.05 and 0.75"),
    ({"method": "magnitude", "sparsity": 0.5, "recovery_steps": 10}, "A recovery fine-tune needs a dataset"),
    ({"method": "heads", "sparsity": 0.5}, "\"heads\" is not a valid choice"),
])
def test_a_prune_request_out_of_range_is_refused(client, smollm2, body, message):
    answer = client.post("/api/enhancement/jobs/prune/", {"name": "p", "base_model": "smollm2-135m-instruct", **body},
                         format="json")
    assert answer.status_code == 400
    assert message in answer.json()["error"]["message"]


def test_a_prune_request_is_queued_with_its_settings(client, smollm2):
    answer = client.post("/api/enhancement/jobs/prune/", {
        "name": "slim", "base_model": "smollm2-135m-instruct", "method": "mlp_channels", "sparsity": 0.25,
        "recovery_steps": 4, "dataset": client.dataset.pk}, format="json")
    assert answer.status_code == 201, answer.json()
    job = answer.json()
    assert (job["kind"], job["state"], job["method"]) == ("prune", "queued", "lora")
    assert job["compression"] == {"method": "mlp_channels", "sparsity": 0.25, "recovery_steps": 4}
    assert job["hyperparameters"]["max_steps"] == 4 and job["quantizations"] == ["q8_0"]


def test_logit_distillation_needs_a_teacher_with_the_students_tokenizer(client, smollm2):
    from serving.presets import GEMMA3, register_presets

    register_presets(lambda line: None)
    body = {"name": "kd", "student": "smollm2-135m-instruct", "dataset": client.dataset.pk, "mode": "logits"}
    answer = client.post("/api/enhancement/jobs/distill/", {**body, "teacher": GEMMA3}, format="json")
    assert answer.status_code == 400
    assert "'gemma-3-270m' and 'smollm2-135m-instruct' tokenize differently" in answer.json()["error"]["message"]

    same = client.post("/api/enhancement/jobs/distill/", {**body, "teacher": "smollm2-135m-instruct"}, format="json")
    assert same.status_code == 201, same.json()
    assert same.json()["compression"]["mode"] == "logits" and same.json()["compression"]["alpha"] == 0.5


def test_sequence_distillation_needs_a_teacher_deployment(client, smollm2):
    answer = client.post("/api/enhancement/jobs/distill/", {
        "name": "seq", "student": "smollm2-135m-instruct", "dataset": client.dataset.pk, "mode": "sequence",
        "teacher": "no-such-deployment"}, format="json")
    assert answer.status_code == 400
    assert "No deployment called 'no-such-deployment'" in answer.json()["error"]["message"]


def test_a_job_across_two_nodes_trains_one_data_parallel_worker_per_node_on_ray(client, smollm2, this_node,
                                                                                  tmp_path):
    from cluster import inventory
    from cluster.services import register_node
    from enhancement.models import EnhancementJob
    from enhancement.runner import build_spec

    register_node(name="node-b", resources=inventory.probe())
    answer = finetune(client, more_nodes=["node-b"], hyperparameters={"max_steps": 4, "batch_size": 4})
    assert answer.status_code == 201, answer.json()
    job = answer.json()
    chosen = job["plan"]["chosen"]
    assert (chosen["data_parallel"], chosen["tensor_parallel"], chosen["pipeline_parallel"]) == (2, 1, 1)
    assert chosen["nodes"] == 2 and job["plan"]["nodes"] == [this_node.name, "node-b"]
    assert job["hyperparameters"]["workers"] == 2 and job["node"] == this_node.name
    spec = build_spec(EnhancementJob.objects.get(pk=job["id"]), tmp_path)
    assert spec["plan_nodes"] == [this_node.name, "node-b"]

    one_worker = finetune(client, name="tune-2", more_nodes=["node-b"],
                          hyperparameters={"max_steps": 4, "batch_size": 4, "workers": 1})
    assert one_worker.status_code == 400
    assert "Across 2 nodes the plan trains on 2 data-parallel workers" in one_worker.json()["error"]["message"]


def test_a_job_across_nodes_without_a_ray_cluster_fails_with_what_to_start(monkeypatch):
    from types import SimpleNamespace

    from enhancement.training import distributed, run as training_run

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    run = SimpleNamespace(hyper={"workers": 2}, spec={"plan_nodes": ["node-a", "node-b"]})
    with pytest.raises(distributed.RayMissing, match="set RAY_ADDRESS in the environment of node-a's worker"):
        distributed.train_on_ray(run, None, training_run.ray_worker)


def test_the_new_job_page_plans_across_the_ticked_nodes_and_queues_one_worker_per_node(client, smollm2, this_node):
    from django.test import Client

    from cluster import inventory
    from cluster.services import register_node
    from enhancement.models import EnhancementJob

    register_node(name="node-b", resources=inventory.probe())
    browser = Client()
    browser.login(username="tuner", password="correct-horse-battery")
    form = {"name": "across", "base_model": "smollm2-135m-instruct", "dataset": client.dataset.pk,
            "node": this_node.name, "more_nodes": ["node-b"], "method": "lora", "batch_size": "4", "max_steps": "4",
            "quantizations": ["q8_0"]}
    page = browser.post("/enhancement/jobs/new/", {**form, "action": "plan"})
    assert page.status_code == 200 and page.context["plan"]
    assert b"Train across more nodes" in page.content
    assert {p.data_parallel for p in page.context["plan"]} >= {2}

    started = browser.post("/enhancement/jobs/new/", {**form, "action": "start"})
    job = EnhancementJob.objects.get(name="across")
    assert started.status_code == 302 and job.hyperparameters["workers"] == 2
    assert job.plan["nodes"] == [this_node.name, "node-b"]


def test_the_new_job_form_asks_the_pool_for_a_class_the_role_may_use_and_a_device_range(client, smollm2, this_node):
    owner = Actor(user=get_user_model().objects.get(username="tuner"))
    get_user_model().objects.create_user(username="dev", password="correct-horse-battery")
    add_member(actor=owner, workspace=client.workspace, username="dev", role="developer")
    browser = Client(HTTP_ACCEPT_LANGUAGE="en")
    browser.login(username="dev", password="correct-horse-battery")
    form = BeautifulSoup(browser.get("/enhancement/jobs/new/").content, "lxml")
    assert [option["value"] for option in form.select("select[name=priority] option")] == ["low", "normal"]
    assert form.select_one("select[name=priority] option[selected]")["value"] == "normal"

    job = {"name": "elastic", "base_model": "smollm2-135m-instruct", "dataset": client.dataset.pk,
           "node": this_node.name, "method": "lora", "batch_size": "2", "max_steps": "4", "quantizations": ["q8_0"],
           "priority": "low", "min_workers": "1", "workers": "2", "action": "start"}
    assert browser.post("/enhancement/jobs/new/", job).status_code == 302
    asked = Workload.objects.get(job=EnhancementJob.objects.get(name="elastic").cluster_job)
    assert (asked.priority, asked.min_devices, asked.max_devices) == ("low", 1, 2)

    slots = pool.capacity()[this_node.name][pool.CPU_SLOT]
    for refused, message in [
        ({"priority": "urgent"}, "The urgent class needs the owner role in this workspace; you may use low, normal."),
        ({"min_workers": "2", "workers": "1"}, "min_workers (2), the fewest devices the job runs on, cannot exceed "
                                               "workers (1), the most."),
        ({"workers": str(2 * slots), "batch_size": str(2 * slots)},
         f"This job asks for up to {2 * slots} cpu-slot, and node {this_node.name} has {slots} on one node."),
    ]:
        page = browser.post("/enhancement/jobs/new/", {**job, "name": "refused", **refused}, follow=True)
        assert message in BeautifulSoup(page.content, "lxml").get_text(), refused
    assert not EnhancementJob.objects.filter(name="refused").exists()

    chinese = Client(HTTP_ACCEPT_LANGUAGE="zh-hans")
    chinese.login(username="dev", password="correct-horse-battery")
    page = chinese.post("/enhancement/jobs/new/", {**job, "name": "refused", "min_workers": "2", "workers": "1"},
                        follow=True).content.decode()
    assert "设备与优先级" in page
    assert "min_workers（2）是作业运行的最少设备数，不能超过最多设备数 workers（1）。" in page
