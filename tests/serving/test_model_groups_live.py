"""Model groups on the real platform: SmolLM2-135M (small) and Gemma-3-270M with the registry's chat template (big,
until the instruction-tuned Gemma of the model-enhancement issue lands) on llama-server, started by a real Celery
worker, answering through the real ASGI gateway to the official OpenAI client."""

import time

import httpx
import pytest
from django.contrib.auth import get_user_model
from django.test import Client
from openai import OpenAI

from accounts.services import SYSTEM, Actor, create_api_key, create_workspace
from serving import services
from serving.engines.base import auth_headers
from serving.groups import services as group_services
from serving.models import (
    CalibrationRun,
    CalibrationState,
    Deployment,
    GroupRequest,
    ModelGroup,
    RequestRecord,
    ServingState,
)
from serving.presets import GEMMA3, MINILM, SMOLLM2
from tests.conftest import deploy_presets, stop_engines_and_flush, wait_for

pytestmark = pytest.mark.worker
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def stack(celery_worker_process, web_server, django_db_blocker):
    with django_db_blocker.unblock():
        deploy_presets({SMOLLM2: 1, GEMMA3: 1, MINILM: 1}, cooldown_s=5)
        owner = get_user_model().objects.create_user(username="group-owner", password="x" * 12)
        workspace = create_workspace(actor=Actor(user=owner), name="Groups")
        key = create_api_key(actor=Actor(user=owner), workspace=workspace, name="groups").secret
        deployments = {name: Deployment.objects.get(name=name) for name in (SMOLLM2, GEMMA3)}
        group = group_services.create_group(actor=Actor(user=owner), workspace=workspace, name="assistant",
                                            policy="cascade", big=deployments[GEMMA3],
                                            small=deployments[SMOLLM2], threshold=0.0)
        yield {"url": web_server, "key": key, "workspace": workspace, "owner": owner, "group": group}
        stop_engines_and_flush()


@pytest.fixture
def client(stack) -> OpenAI:
    return OpenAI(base_url=f"{stack['url']}/v1", api_key=stack["key"], max_retries=0)


def _set(group, **fields):
    ModelGroup.objects.filter(pk=group.pk).update(**fields)
    time.sleep(1.2)  # the gateway's routing table is at most a second old (serving/router.py TABLE_TTL_S)


def _record_of(request_id: str) -> GroupRequest:
    return wait_for(lambda: GroupRequest.objects.filter(request_id=request_id).first(), what="the group's record")


def test_the_openai_client_streams_a_chat_from_a_group_and_the_record_says_who_answered(stack, client, live_db):
    raw = client.chat.completions.with_raw_response.create(model="assistant", messages=QUESTION, stream=True,
                                                           max_tokens=24)
    request_id = raw.headers["x-request-id"]
    text = "".join(c.choices[0].delta.content or "" for c in raw.parse() if c.choices)

    assert text.strip()
    record = _record_of(request_id)
    # Threshold 0: any answer with tokens is kept, so the small member answered.
    assert (record.member, record.escalated, record.policy) == ("small", False, "cascade")
    assert "confidence" in record.reason and ">= threshold 0.000" in record.reason
    assert record.small_output_tokens > 0 and record.big_output_tokens == 0 and record.small_cost > 0
    measured = wait_for(lambda: RequestRecord.objects.filter(request_id=request_id).first(), what="its figures")
    assert measured.group_id == stack["group"].pk and measured.deployment.name == SMOLLM2
    assert measured.stream and 0 < measured.ttft_ms <= measured.e2e_ms
    assert "assistant" in [m.id for m in client.models.list().data]
    browser = Client()
    browser.force_login(stack["owner"])
    assert 'value="assistant"' in browser.get("/serving/playground/").content.decode()


def test_a_cascade_escalates_below_its_threshold_and_counts_both_members(stack, client, live_db):
    _set(stack["group"], threshold=1.0)
    reply = client.chat.completions.with_raw_response.create(model="assistant", messages=QUESTION, max_tokens=16)

    assert reply.parse().choices[0].message.content is not None
    record = _record_of(reply.headers["x-request-id"])
    assert (record.member, record.escalated) == ("big", True)
    assert record.reason.startswith("escalated: mean token confidence") and "< threshold 1.000" in record.reason
    assert record.small_output_tokens > 0 and record.big_output_tokens > 0
    assert record.small_cost > 0 and record.big_cost > 0


def test_a_route_group_sends_long_or_flagged_requests_to_big(stack, client, live_db):
    _set(stack["group"], policy="route", threshold=0.5, settings={"route": {"keywords": ["prove"]}})
    easy = client.chat.completions.with_raw_response.create(model="assistant", messages=QUESTION, max_tokens=8)
    hard = client.chat.completions.with_raw_response.create(
        model="assistant", messages=[{"role": "user", "content": "Prove that the sky is blue."}], max_tokens=8)

    assert _record_of(easy.headers["x-request-id"]).member == "small"
    flagged = _record_of(hard.headers["x-request-id"])
    assert flagged.member == "big" and "keyword 'prove'" in flagged.reason


def test_a_route_by_classifier_scores_the_request_s_embedding(stack, client, live_db):
    # A classifier that says "big" whatever the embedding (all weights 0, intercept 5: P = 0.993).
    trained = {"embedding_deployment": MINILM, "coef": [0.0] * 384, "intercept": 5.0}
    _set(stack["group"], policy="route", threshold=0.5,
         settings={"route": {"score": "classifier", "embedding_deployment": MINILM}, "classifier": trained})
    reply = client.chat.completions.with_raw_response.create(model="assistant", messages=QUESTION, max_tokens=8)

    record = _record_of(reply.headers["x-request-id"])
    assert record.member == "big" and record.score == pytest.approx(0.9933, abs=1e-4)
    assert f"classifier: P(big answers better) on {MINILM}'s embedding" in record.reason
    assert RequestRecord.objects.filter(group=stack["group"], deployment__name=MINILM, status=200).exists()


def test_calibration_draws_the_curve_and_a_picked_point_sets_the_threshold(stack, live_db):
    _set(stack["group"], policy="cascade", threshold=0.5, settings={"route": {"embedding_deployment": MINILM}})
    api = httpx.Client(base_url=f"{stack['url']}/api", headers={"Authorization": f"Bearer {stack['key']}"})
    items = [{"prompt": "What is the capital of France?", "reference": "Paris"},
             {"prompt": "What is 2 + 2?", "reference": "4"},
             {"prompt": "Name the largest ocean.", "reference": "The Pacific Ocean"}]
    started = api.post("/serving/groups/assistant/calibrate/", json={"items": items, "max_tokens": 16})

    assert started.status_code == 202, started.text
    run = wait_for(lambda: CalibrationRun.objects.filter(pk=started.json()["id"], state__in=[
        CalibrationState.DONE, CalibrationState.FAILED]).first(), timeout=240, what="the calibration")
    assert run.state == CalibrationState.DONE, run.error
    assert len(run.outcomes) == 3 and {"route", "cascade"} == set(run.curves)
    # Every prompt was embedded for the route's classifier; three prompts are too few to train one, and it says so.
    assert all(len(o["embedding"]) == 384 for o in run.outcomes)
    assert "at least two of each kind" in run.summary["classifier_note"]
    shares = [p["big_share_requests"] for p in run.curves["cascade"]]
    assert [p["threshold"] for p in run.curves["cascade"]][::len(shares) - 1] == [0.0, 1.0]
    assert shares == sorted(shares)  # a higher threshold never escalates fewer requests
    point = run.curves["cascade"][1]
    picked = api.post(f"/serving/calibrations/{run.pk}/pick/", json={"policy": "cascade",
                                                                      "threshold": point["threshold"]})
    assert picked.status_code == 200
    assert ModelGroup.objects.get(pk=stack["group"].pk).threshold == point["threshold"]


def test_a_judge_deployment_grades_the_calibration_answers(stack, live_db):
    _set(stack["group"], policy="cascade", threshold=0.5, settings={})
    api = httpx.Client(base_url=f"{stack['url']}/api", headers={"Authorization": f"Bearer {stack['key']}"})
    started = api.post("/serving/groups/assistant/calibrate/", json={
        "items": [{"prompt": "What is the capital of France?", "reference": "Paris"}], "max_tokens": 8,
        "judge": GEMMA3})

    assert started.status_code == 202, started.text
    run = wait_for(lambda: CalibrationRun.objects.filter(pk=started.json()["id"], state__in=[
        CalibrationState.DONE, CalibrationState.FAILED]).first(), timeout=240, what="the judged calibration")
    assert (run.state, run.metric, run.judge) == (CalibrationState.DONE, "judge", GEMMA3), run.error
    assert all(0 <= run.outcomes[0][m]["quality"] <= 1 for m in ("small", "big"))
    assert "ungraded_answers" in run.summary


def test_a_stopped_member_is_replaced_and_the_fallback_recorded(stack, client, live_db):
    _set(stack["group"], policy="cascade", threshold=0.0)
    small = Deployment.objects.get(name=SMOLLM2)
    services.stop_deployment(actor=SYSTEM, deployment=small)
    wait_for(lambda: Deployment.objects.get(name=SMOLLM2).state == ServingState.STOPPED, timeout=60,
             what="SmolLM2 to stop")
    time.sleep(1.2)  # the gateway's routing table is at most a second old

    reply = client.chat.completions.with_raw_response.create(model="assistant", messages=QUESTION, max_tokens=8)

    record = _record_of(reply.headers["x-request-id"])
    assert record.member == "big" and "the small member could not answer" in record.fallback


def test_a_speculative_group_decodes_with_a_draft_of_the_same_vocabulary(stack, client, live_db):
    gemma = Deployment.objects.get(name=GEMMA3)
    group = group_services.create_group(actor=Actor(user=stack["owner"]), workspace=stack["workspace"],
                                        name="gemma-drafted", policy="speculative", big=gemma, draft=gemma.model)
    speculative = group.speculative_deployment
    wait_for(lambda: Deployment.objects.get(pk=speculative.pk).state == ServingState.READY, timeout=180,
             what="the speculative deployment")

    reply = client.chat.completions.with_raw_response.create(model="gemma-drafted", messages=QUESTION,
                                                             max_tokens=16)

    assert reply.parse().choices[0].message.content
    assert _record_of(reply.headers["x-request-id"]).reason.startswith("speculative")
    replica = speculative.replicas.get()
    metrics = httpx.get(f"{replica.base_url.removesuffix('/v1')}/metrics", headers=auth_headers(replica.api_key))
    drafted = next(line for line in metrics.text.splitlines()
                   if line.startswith("llamacpp:spec_decode_num_draft_tokens_total"))
    assert float(drafted.split()[-1]) > 0
    group_services.delete_group(actor=Actor(user=stack["owner"]), group=group)
    wait_for(lambda: Deployment.objects.get(pk=speculative.pk).state == ServingState.STOPPED, timeout=60,
             what="the speculative deployment to stop with its group")

