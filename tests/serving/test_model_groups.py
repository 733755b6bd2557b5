"""Model groups without engines: what the policies decide and say, the calibration curve against hand-computed
points, and every refusal a user can meet through the API and the GUI (issue 19, "Bad input")."""

import io
import json

import pytest
from django.test import Client
from rest_framework.test import APIClient

from accounts.services import SYSTEM, Actor, create_api_key
from cluster import inventory, queues
from cluster.services import register_node
from serving import services
from serving.groups import calibration, policies
from serving.models import CalibrationRun, CalibrationState, ModelGroup
from serving.presets import GEMMA3, MINILM, SMOLLM2, register_presets
from tests.conftest import UNREAD_QUEUE

pytestmark = pytest.mark.django_db

# A SmolLM2 answer through llama-server with `logprobs: true, top_logprobs: 1`, as the engine sent it (trimmed).
RECORDED_CHOICE = {"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": " Paris."},
                   "logprobs": {"content": [
                       {"id": 7042, "token": " Paris", "logprob": -0.24842411279678345, "top_logprobs": []},
                       {"id": 30, "token": ".", "logprob": -0.3992047607898712, "top_logprobs": []}]}}


@pytest.fixture
def stack(make_workspace, settings):
    node = register_node(name=settings.NODE_NAME, resources=inventory.probe())
    models = register_presets(lambda line: None)
    deployments = {name: services.create_deployment(actor=SYSTEM, workspace=None, model=models[name], name=name,
                                                    replicas=[(node, 1.0)]) for name in (SMOLLM2, GEMMA3, MINILM)}
    workspace = make_workspace("Acme", "ann", dev="developer", vic="viewer")
    ann = workspace.memberships.get(role="owner").user
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION="Bearer " + create_api_key(actor=Actor(user=ann), workspace=workspace,
                                                                  name="ann").secret)
    return {"workspace": workspace, "ann": ann, "api": api, "deployments": deployments, "models": models}


def _group(api, **fields):
    body = {"name": "assistant", "policy": "cascade", "big": GEMMA3, "small": SMOLLM2, "threshold": 0.5} | fields
    return api.post("/api/serving/groups/", body, format="json")


def test_the_route_score_says_what_made_it():
    rules = {"length_scale": 100, "keywords": ["prove"], "patterns": [r"\d+\s*[*/]\s*\d+"]}
    easy = policies.route_score("Say hi.", rules)
    hard = policies.route_score("Prove that 12 * 7 is 84.", rules)

    assert easy.score == pytest.approx(0.07) and "keyword" not in easy.why
    assert hard.score == 1.0
    assert "keyword 'prove'" in hard.why and "pattern" in hard.why


def test_the_cascade_keeps_a_confident_answer_and_escalates_the_rest():
    mean = (-0.24842411279678345 - 0.3992047607898712) / 2
    kept = policies.cascade_verdict(RECORDED_CHOICE, threshold=0.7, signal="mean")
    escalated = policies.cascade_verdict(RECORDED_CHOICE, threshold=0.7, signal="min")
    empty = policies.cascade_verdict(RECORDED_CHOICE | {"message": {"content": " "}}, threshold=0.0, signal="mean")

    assert kept.keep_small and kept.confidence == pytest.approx(2.718281828 ** mean)
    assert not escalated.keep_small and "0.671 < threshold 0.700" in escalated.why
    assert not empty.keep_small and "self-check" in empty.why


def test_the_curve_matches_hand_computed_points():
    def outcome(score, confidence, small_q, big_q, big_tokens):
        return {"route_score": score, "small": {"answer": "x", "quality": small_q, "tokens": 10,
                                                "confidence": confidence},
                "big": {"answer": "y", "quality": big_q, "tokens": big_tokens, "confidence": None}}

    outcomes = [outcome(0.1, 0.9, 1.0, 1.0, 30), outcome(0.6, 0.3, 0.0, 1.0, 10), outcome(0.9, 0.8, 0.5, 0.5, 60)]
    drawn = calibration.curves(outcomes)
    cascade = {p["threshold"]: p for p in drawn["cascade"]}

    # At 0.5 only the answer of confidence 0.3 escalates: 1 of 3 requests, 10 of 100 big tokens, quality (1+1+.5)/3.
    assert cascade[0.8] == {"threshold": 0.8, "big_share_requests": 0.3333, "big_share_tokens": 0.1,
                            "quality": 0.8333, "relative_quality": 1.0}
    assert cascade[0.0]["big_share_requests"] == 0 and cascade[0.0]["relative_quality"] == 0.6
    route = {p["threshold"]: p for p in drawn["route"]}
    assert route[0.6]["big_share_requests"] == 0.6667 and route[0.6]["quality"] == 0.8333
    assert calibration.summary(outcomes, drawn)["suggested"]["cascade"]["threshold"] == 0.8


def test_a_cascade_group_is_one_name_and_a_studio_can_answer_with_it(stack):
    from agent_studio.config import check_settings
    from rag_studio import services as rag_services

    response = _group(stack["api"])

    assert response.status_code == 201, response.content
    assert response.json()["policy"] == "cascade" and response.json()["small"] == SMOLLM2
    ann = Actor(user=stack["ann"])
    kb = rag_services.create_knowledge_base(actor=ann, workspace=stack["workspace"], name="Docs")
    config = rag_services.save_rag_config(actor=ann, workspace=stack["workspace"], name="QA", knowledge_base=kb,
                                          template="citations", model="assistant")
    assert config.model == "assistant"
    assert check_settings(workspace=stack["workspace"], template="tool_calling", raw={"model": "assistant"})


@pytest.mark.parametrize("fields, status, field, words", [
    ({"threshold": 1.5}, 400, "threshold", "from 0 to 1"),
    ({"threshold": -0.1}, 400, "threshold", "from 0 to 1"),
    ({"small": ""}, 400, "small", "needs a 'small' deployment"),
    ({"small": "nope"}, 400, "small", "No deployment called 'nope'"),
    ({"small": MINILM}, 400, "small", "cannot chat"),
    ({"small": GEMMA3}, 400, "small", "another deployment"),
    ({"policy": "vote"}, 400, "policy", "not a valid choice"),
    ({"settings": {"route": {"patterns": ["("]}}}, 400, "settings", "not a regular expression"),
    ({"name": SMOLLM2}, 409, None, "already the name of a deployment"),
])
def test_bad_groups_are_refused_with_the_reason(stack, fields, status, field, words):
    response = _group(stack["api"], **fields)

    assert response.status_code == status, response.content
    error = response.json()["error"]
    assert words in json.dumps(error)
    if field:
        assert field in error.get("fields", {})


def test_a_speculative_group_whose_vocabularies_differ_is_refused_with_the_reason(stack):
    response = _group(stack["api"], policy="speculative")

    assert response.status_code == 400
    assert "'smollm2-135m-instruct' cannot draft for 'gemma-3-270m'" in response.json()["error"]["message"]
    assert "tokenizers differ (llama against gpt2)" in response.json()["error"]["message"]
    assert not ModelGroup.objects.exists()


def test_a_viewer_cannot_make_or_change_a_group(stack):
    _group(stack["api"])
    viewer = APIClient()
    viewer.credentials(HTTP_AUTHORIZATION="Bearer " + create_api_key(
        actor=Actor(user=stack["ann"]), workspace=stack["workspace"], name="v", role="viewer").secret)

    assert _group(viewer, name="other").status_code == 403
    assert viewer.patch("/api/serving/groups/assistant/", {"threshold": 0.1}, format="json").status_code == 403
    assert viewer.get("/api/serving/groups/assistant/").json()["threshold"] == 0.5


def test_calibration_prompts_without_references_or_stopped_members_are_refused(stack):
    _group(stack["api"])
    lines = b'{"prompt": "What is 2 + 2?", "reference": "4"}\n{"prompt": "Name a colour."}\n'
    missing = stack["api"].post("/api/serving/groups/assistant/calibrate/",
                                {"file": io.BytesIO(lines)}, format="multipart")
    stopped = stack["api"].post("/api/serving/groups/assistant/calibrate/",
                                {"items": [{"prompt": "What is 2 + 2?", "reference": "4"}]}, format="json")

    assert missing.status_code == 400
    assert "Line 2 has no reference answer" in missing.json()["error"]["message"]
    assert stopped.status_code == 409 and "start gemma-3-270m, smollm2-135m-instruct first" in \
        stopped.json()["error"]["message"]
    assert not CalibrationRun.objects.exists()


def _finished_run(group, workspace) -> CalibrationRun:
    outcomes = [{"prompt": "p", "reference": "r", "route_score": 0.2,
                 "small": {"answer": "a", "quality": 1.0, "tokens": 10, "confidence": 0.9},
                 "big": {"answer": "b", "quality": 1.0, "tokens": 20, "confidence": None}},
                {"prompt": "q", "reference": "s", "route_score": 0.7,
                 "small": {"answer": "a", "quality": 0.0, "tokens": 10, "confidence": 0.4},
                 "big": {"answer": "b", "quality": 1.0, "tokens": 20, "confidence": None}}]
    drawn = calibration.curves(outcomes)
    return CalibrationRun.objects.create(group=group, workspace=workspace, source="test",
                                         metric="token_f1", items=[], outcomes=outcomes, curves=drawn,
                                         summary=calibration.summary(outcomes, drawn), state=CalibrationState.DONE)


def test_picking_a_point_of_the_curve_sets_the_policy_and_threshold(stack):
    _group(stack["api"])
    group = ModelGroup.objects.get()
    run = _finished_run(group, stack["workspace"])

    off_curve = stack["api"].post(f"/api/serving/calibrations/{run.pk}/pick/", {"policy": "route", "threshold": 0.5},
                                  format="json")
    picked = stack["api"].post(f"/api/serving/calibrations/{run.pk}/pick/", {"policy": "route", "threshold": 0.7},
                               format="json")

    assert off_curve.status_code == 400 and "not a point of the route curve" in off_curve.json()["error"]["message"]
    assert picked.status_code == 200
    assert (picked.json()["policy"], picked.json()["threshold"]) == ("route", 0.7)
    assert CalibrationRun.objects.get().chosen["big_share_requests"] == 0.5


def test_the_group_page_draws_the_curve_and_a_point_is_picked_there(stack):
    _group(stack["api"])
    group = ModelGroup.objects.get()
    run = _finished_run(group, stack["workspace"])
    browser = Client()
    browser.force_login(stack["ann"])

    page = browser.get("/serving/groups/assistant/").content.decode()
    assert 'id="chart-curve"' in page and 'id="curve-data"' in page
    assert page.count("Use this point") == len(run.curves["route"]) + len(run.curves["cascade"])
    browser.post("/serving/groups/assistant/", {"action": "pick", "run": run.pk, "pick": "cascade:0.9"})

    group.refresh_from_db()
    assert (group.policy, group.threshold) == ("cascade", 0.9)
    assert "assistant" in browser.get("/serving/").content.decode()


def test_a_rag_eval_set_is_calibrated_on_through_serving_s_prompt_sources(stack):
    from rag_studio import services as rag_services
    from rag_studio.models import EvalItem, EvalSet

    _group(stack["api"])
    kb = rag_services.create_knowledge_base(actor=Actor(user=stack["ann"]), workspace=stack["workspace"],
                                            name="Docs")
    complete = EvalSet.objects.create(workspace=stack["workspace"], knowledge_base=kb, name="faq", source="uploaded")
    EvalItem.objects.create(eval_set=complete, question="What is 2 + 2?", expected_answer="4")
    partial = EvalSet.objects.create(workspace=stack["workspace"], knowledge_base=kb, name="half", source="uploaded")
    EvalItem.objects.create(eval_set=partial, question="What is 2 + 2?", expected_answer="4")
    EvalItem.objects.create(eval_set=partial, question="Why?", expected_answer="")

    def calibrate(set_id):
        return stack["api"].post("/api/serving/groups/assistant/calibrate/",
                                 {"prompt_source": "rag-eval-set", "prompt_set": set_id}, format="json")

    assert "Item 2 has no reference answer" in calibrate(partial.pk).json()["error"]["message"]
    assert calibrate(987654).status_code == 404
    # The set was read: what stops it now is only that the members are not running.
    assert calibrate(complete.pk).status_code == 409
    browser = Client()
    browser.force_login(stack["ann"])
    assert f'value="rag-eval-set:{complete.pk}"' in browser.get("/serving/groups/assistant/").content.decode()


def _outcomes_with_embeddings() -> list[dict]:
    """Prompts whose embeddings say which member answers better: the first coordinate is high where big wins."""
    outcomes = []
    for index in range(12):
        big_wins = index % 2 == 0
        outcomes.append({"prompt": f"p{index}", "reference": "r", "route_score": 0.1,
                         "embedding": [1.0 + index / 100 if big_wins else -1.0 - index / 100, 0.5],
                         "small": {"answer": "a", "quality": 0.0 if big_wins else 1.0, "tokens": 10,
                                   "confidence": 0.5},
                         "big": {"answer": "b", "quality": 1.0, "tokens": 20, "confidence": None}})
    return outcomes


def test_the_route_classifier_learns_from_calibration_outcomes_and_its_curve_is_cross_validated():
    from sklearn.linear_model import LogisticRegression

    from serving.groups import classifier

    outcomes = _outcomes_with_embeddings()
    trained, scores = classifier.train(outcomes, "all-minilm-l6-v2")

    assert trained["cv_accuracy"] == 1.0 and trained["needs_big"] == 6
    assert all((score >= 0.5) == (index % 2 == 0) for index, score in enumerate(scores))
    fitted = LogisticRegression(class_weight="balanced", max_iter=1000).fit(
        [o["embedding"] for o in outcomes], classifier.labels(outcomes))
    assert classifier.score(trained, [0.3, 0.5]) == pytest.approx(fitted.predict_proba([[0.3, 0.5]])[0, 1])
    with pytest.raises(classifier.ClassifierUnavailable, match="at least two of each kind"):
        classifier.train(outcomes[:3], "all-minilm-l6-v2")


def test_picking_a_classifier_point_routes_by_the_classifier(stack):
    from serving.groups import classifier

    refused = _group(stack["api"], settings={"route": {"score": "classifier"}})
    assert refused.status_code == 400 and "needs one trained by calibration" in refused.json()["error"]["message"]
    _group(stack["api"])
    group = ModelGroup.objects.get()
    outcomes = _outcomes_with_embeddings()
    trained, scores = classifier.train(outcomes, MINILM)
    for outcome, score in zip(outcomes, scores):
        outcome["classifier_score"] = score
    drawn = calibration.curves(outcomes)
    run = CalibrationRun.objects.create(group=group, workspace=stack["workspace"], source="test", metric="token_f1",
                                        outcomes=outcomes, curves=drawn, state=CalibrationState.DONE,
                                        summary=calibration.summary(outcomes, drawn) | {"classifier": trained})
    point = calibration.suggested(drawn["route-classifier"])

    picked = stack["api"].post(f"/api/serving/calibrations/{run.pk}/pick/",
                               {"policy": "route-classifier", "threshold": point["threshold"]}, format="json")

    assert picked.status_code == 200, picked.content
    assert point["big_share_requests"] == 0.5 and point["relative_quality"] == 1.0
    group.refresh_from_db()
    assert group.policy == "route" and group.settings["route"]["score"] == "classifier"
    assert group.settings["classifier"]["coef"] == trained["coef"]


def test_a_judge_s_reply_is_read_as_a_grade_and_an_unknown_judge_is_refused(stack):
    from serving.groups.scoring import judge_grade

    assert (judge_grade("7/10"), judge_grade("Score: 12."), judge_grade(" 8.5"), judge_grade("good")) == (
        0.7, 1.0, 0.85, None)
    _group(stack["api"])
    refused = stack["api"].post("/api/serving/groups/assistant/calibrate/", {
        "items": [{"prompt": "What is 2 + 2?", "reference": "4"}], "judge": "nope"}, format="json")
    assert refused.status_code == 400 and "No deployment named 'nope'" in refused.json()["error"]["message"]
    assert "judge" in refused.json()["error"]["fields"]


def test_setup_groups_the_presets_once(stack):
    from serving.presets import PRESET_GROUP, make_preset_group

    said = []
    make_preset_group(said.append)
    make_preset_group(said.append)

    group = ModelGroup.objects.get(name=PRESET_GROUP)
    assert (group.workspace, group.policy, group.big.name, group.small.name) == (None, "cascade", GEMMA3, SMOLLM2)
    assert len(said) == 1 and PRESET_GROUP in said[0]
    assert PRESET_GROUP in [g["name"] for g in stack["api"].get("/api/serving/groups/").json()["results"]]


def test_a_queued_calibration_is_cancelled_and_leaves_the_line(stack, monkeypatch):
    from serving import tasks

    monkeypatch.setattr(tasks, "CALIBRATION_QUEUE", UNREAD_QUEUE)
    monkeypatch.setattr(queues, "INTERACTIVE", UNREAD_QUEUE)
    queues.broker().delete(UNREAD_QUEUE)
    _group(stack["api"])
    run = CalibrationRun.objects.create(group=ModelGroup.objects.get(), workspace=stack["workspace"], source="test",
                                        metric="token_f1", items=[{"prompt": "p", "reference": "r"}])
    queues.send(tasks.calibrate_group.name, [run.pk], queue=UNREAD_QUEUE, workspace_id=stack["workspace"].pk)
    assert stack["api"].get(f"/api/serving/calibrations/{run.pk}/").json()["queue"]["position"] == 1

    cancelled = stack["api"].post(f"/api/serving/calibrations/{run.pk}/cancel/")

    assert cancelled.status_code == 200 and cancelled.json()["state"] == "cancelled"
    assert queues.waiting(UNREAD_QUEUE) == []
    calibration.calibrate(run.pk)  # a message a worker had taken already: nothing is asked of the members
    run.refresh_from_db()
    assert (run.state, run.outcomes) == (CalibrationState.CANCELLED, [])
    assert stack["api"].post(f"/api/serving/calibrations/{run.pk}/cancel/").status_code == 409
