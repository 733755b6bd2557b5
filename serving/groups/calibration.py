"""Calibration: both members of a group answer prompts that have reference answers, each answer is scored, and the
threshold of each policy is swept into a cost-quality curve.

A curve point at threshold t says what the group would have done on these prompts: the share of requests the big
member answers, its share of the big member's tokens (against every request going to big), and the mean quality
of the answers the group returns, also relative to big-only. Route sends a request to big when its score >= t;
cascade keeps the small answer when its confidence >= t (and it is not empty), so a cascade's escalated request
costs both members. The decisions are the gateway's own (serving/groups/policies.py).

Where the route names an embedding deployment, every prompt is embedded too, and a classifier is trained on the
outcomes (serving/groups/classifier.py): its cross-validated scores draw a third curve, `route-classifier`.

The members are called through the gateway with the workspace's service token, so every calibration request is
measured and recorded like any other.
"""

import json

import httpx
from django.conf import settings
from django.utils import timezone

from accounts.services import service_token
from serving.groups import classifier, policies, scoring
from serving.models import CalibrationRun, CalibrationState

MAX_ITEMS = 500
MAX_TEXT_CHARS = 8000
# The quality relative to big-only that the suggested point keeps at least.
SUGGESTED_QUALITY = 0.95
REQUEST_TIMEOUT_S = 300.0


class CalibrationInputInvalid(ValueError):
    """Prompts that cannot be calibrated on; the message names the line or item."""


def _item(raw, where: str) -> dict:
    if not isinstance(raw, dict):
        raise CalibrationInputInvalid(f"{where} is not an object with a prompt and a reference.")
    prompt = raw.get("prompt")
    if prompt is None and isinstance(raw.get("instruction"), str):
        prompt = raw["instruction"] + (f"\n\n{raw['input']}" if isinstance(raw.get("input"), str) and raw["input"]
                                       else "")
    reference = raw.get("reference", raw.get("output"))
    if not isinstance(prompt, str) or not prompt.strip():
        raise CalibrationInputInvalid(f"{where} has no prompt (a 'prompt' string).")
    if not isinstance(reference, str) or not reference.strip():
        raise CalibrationInputInvalid(f"{where} has no reference answer (a 'reference' string): calibration scores "
                                      f"each member's answer against it.")
    if len(prompt) > MAX_TEXT_CHARS or len(reference) > MAX_TEXT_CHARS:
        raise CalibrationInputInvalid(f"{where} is longer than {MAX_TEXT_CHARS} characters.")
    return {"prompt": prompt.strip(), "reference": reference.strip()}


def checked_items(items) -> list[dict]:
    """Prompt/reference pairs as given by the API or a studio, checked."""
    if not isinstance(items, list) or not items:
        raise CalibrationInputInvalid("Give a non-empty list of {prompt, reference} items.")
    if len(items) > MAX_ITEMS:
        raise CalibrationInputInvalid(f"At most {MAX_ITEMS} items are calibrated on at once; got {len(items)}.")
    return [_item(raw, f"Item {index + 1}") for index, raw in enumerate(items)]


def items_from_jsonl(content: bytes) -> list[dict]:
    """An uploaded JSONL file: one {"prompt", "reference"} object per line ({"instruction", "input", "output"}
    too, the shape of instruction datasets)."""
    try:
        text = content.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise CalibrationInputInvalid("The file is not UTF-8 text.")
    items = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            raw = json.loads(line)
        except ValueError as exc:
            raise CalibrationInputInvalid(f"Line {number} is not JSON: {exc}.")
        items.append(_item(raw, f"Line {number}"))
        if len(items) > MAX_ITEMS:
            raise CalibrationInputInvalid(f"At most {MAX_ITEMS} items are calibrated on at once.")
    if not items:
        raise CalibrationInputInvalid("The file has no items.")
    return items


def _sweep(outcomes: list[dict], decide, thresholds: list[float]) -> list[dict]:
    """One point per threshold; `decide(outcome, t)` is True when the big member answers."""
    big_quality = sum(o["big"]["quality"] for o in outcomes) / len(outcomes)
    big_tokens_all = sum(o["big"]["tokens"] for o in outcomes) or 1
    points = []
    for threshold in thresholds:
        to_big = [decide(o, threshold) for o in outcomes]
        quality = sum(o["big"]["quality"] if big else o["small"]["quality"]
                      for o, big in zip(outcomes, to_big)) / len(outcomes)
        points.append({
            "threshold": round(threshold, 4),
            "big_share_requests": round(sum(to_big) / len(outcomes), 4),
            "big_share_tokens": round(sum(o["big"]["tokens"] for o, big in zip(outcomes, to_big) if big)
                                      / big_tokens_all, 4),
            "quality": round(quality, 4),
            "relative_quality": round(quality / big_quality, 4) if big_quality > 0 else None,
        })
    return points


def _thresholds(values: list[float | None]) -> list[float]:
    """Every threshold at which a decision changes, with both ends of [0, 1]."""
    return sorted({0.0, 1.0, *(round(v, 4) for v in values if v is not None)})


def route_would_send_big(outcome: dict, threshold: float) -> bool:
    return outcome["route_score"] >= threshold


def cascade_would_escalate(outcome: dict, threshold: float) -> bool:
    confidence = outcome["small"]["confidence"]
    return not outcome["small"]["answer"].strip() or confidence is None or confidence < threshold


def classifier_would_send_big(outcome: dict, threshold: float) -> bool:
    return outcome["classifier_score"] >= threshold


def curves(outcomes: list[dict]) -> dict:
    drawn = {
        "route": _sweep(outcomes, route_would_send_big, _thresholds([o["route_score"] for o in outcomes])),
        "cascade": _sweep(outcomes, cascade_would_escalate,
                          _thresholds([o["small"]["confidence"] for o in outcomes])),
    }
    if all("classifier_score" in o for o in outcomes):
        drawn["route-classifier"] = _sweep(outcomes, classifier_would_send_big,
                                           _thresholds([o["classifier_score"] for o in outcomes]))
    return drawn


def suggested(points: list[dict], target: float = SUGGESTED_QUALITY) -> dict | None:
    """The point with the least big-model share of tokens that keeps `target` of big-only quality."""
    good = [p for p in points if p["relative_quality"] is not None and p["relative_quality"] >= target]
    return min(good, key=lambda p: (p["big_share_tokens"], p["big_share_requests"], -p["quality"])) if good else None


def summary(outcomes: list[dict], drawn: dict) -> dict:
    count = len(outcomes)
    return {
        "items": count,
        "ungraded_answers": sum(o[m].get("ungraded", False) for o in outcomes for m in ("small", "big")),
        "big_only_quality": round(sum(o["big"]["quality"] for o in outcomes) / count, 4),
        "small_only_quality": round(sum(o["small"]["quality"] for o in outcomes) / count, 4),
        "suggested": {policy: suggested(points) for policy, points in drawn.items()},
    }


def _ask(client: httpx.Client, deployment: str, prompt: str, run: CalibrationRun, *, logprobs: bool) -> dict:
    # A token per call: a long calibration outlives any one service token.
    token = service_token(workspace_id=run.workspace_id or run.group.workspace_id)
    body = {"model": deployment, "messages": [{"role": "user", "content": prompt}], "max_tokens": run.max_tokens,
            "temperature": run.temperature}
    if logprobs:
        body |= {"logprobs": True, "top_logprobs": 1}
    response = client.post("/chat/completions", json=body, headers={"Authorization": f"Bearer {token}"})
    if response.status_code != 200:
        raise RuntimeError(f"'{deployment}' answered {response.status_code}: {response.text[:300]}")
    return response.json()


def _embed(client: httpx.Client, deployment: str, text: str, run: CalibrationRun) -> list[float]:
    token = service_token(workspace_id=run.workspace_id or run.group.workspace_id)
    response = client.post("/embeddings", json={"model": deployment, "input": text},
                           headers={"Authorization": f"Bearer {token}"})
    if response.status_code != 200:
        raise RuntimeError(f"'{deployment}' answered {response.status_code}: {response.text[:300]}")
    return response.json()["data"][0]["embedding"]


def _classify(outcomes: list[dict], embedding_deployment: str) -> dict:
    """Train the route's classifier where the prompts were embedded: its weights for the summary, and each
    outcome's cross-validated score for the curve; or why it could not be trained."""
    if not embedding_deployment:
        return {}
    try:
        trained, scores = classifier.train(outcomes, embedding_deployment)
    except classifier.ClassifierUnavailable as exc:
        return {"classifier_note": str(exc)}
    for outcome, score in zip(outcomes, scores):
        outcome["classifier_score"] = score
    return {"classifier": trained}


def _judged(client: httpx.Client, run: CalibrationRun, item: dict, answer: str) -> float:
    """The judge deployment's grade of `answer`; an answer it gives no number for scores 0, noted as ungraded."""
    token = service_token(workspace_id=run.workspace_id or run.group.workspace_id)
    prompt = scoring.JUDGE_PROMPT.format(question=item["prompt"], reference=item["reference"], answer=answer)
    response = client.post("/chat/completions", headers={"Authorization": f"Bearer {token}"}, json={
        "model": run.judge, "messages": [{"role": "user", "content": prompt}], "max_tokens": 8, "temperature": 0})
    if response.status_code != 200:
        raise RuntimeError(f"The judge '{run.judge}' answered {response.status_code}: {response.text[:300]}")
    grade = scoring.judge_grade(policies.answer_text((response.json().get("choices") or [{}])[0]))
    return -1.0 if grade is None else grade


def _answer(payload: dict, item: dict, run: CalibrationRun, signal: str, client: httpx.Client) -> dict:
    choice = (payload.get("choices") or [{}])[0]
    usage = payload.get("usage") or {}
    answer = policies.answer_text(choice)
    if run.metric == scoring.JUDGE:
        quality = _judged(client, run, item, answer)
        ungraded, quality = quality < 0, max(quality, 0.0)
    else:
        quality, ungraded = scoring.score(run.metric, answer, item["reference"]), False
    return {"answer": answer, "quality": round(quality, 4), "ungraded": ungraded,
            "tokens": (usage.get("prompt_tokens") or 0) + (usage.get("completion_tokens") or 0),
            "confidence": policies.confidence(policies.token_logprobs(choice), signal)}


def calibrate(run_id: int) -> None:
    """Run a calibration to its end: answers are stored as they come, so a redelivered task goes on from the
    first item without an outcome; a failure is stored on the run with its reason."""
    run = CalibrationRun.objects.select_related("group__big", "group__small").get(pk=run_id)
    going = CalibrationRun.objects.filter(pk=run.pk, state__in=[CalibrationState.QUEUED, CalibrationState.RUNNING])
    if not going.update(state=CalibrationState.RUNNING):
        return  # done, failed or cancelled
    group = run.group
    signal = policies.cascade_settings(group.settings.get("cascade") or {})["confidence"]
    route_rules = group.settings.get("route") or {}
    embedding_deployment = policies.route_settings(route_rules)["embedding_deployment"]
    outcomes = list(run.outcomes)
    try:
        with httpx.Client(base_url=settings.GATEWAY_URL, timeout=REQUEST_TIMEOUT_S, trust_env=False) as client:
            for item in run.items[len(outcomes):]:
                if not going.exists():
                    return  # cancelled: the answers so far stay on the run
                small = _ask(client, group.small.name, item["prompt"], run, logprobs=True)
                big = _ask(client, group.big.name, item["prompt"], run, logprobs=False)
                outcome = {
                    "prompt": item["prompt"], "reference": item["reference"],
                    "route_score": policies.route_score(item["prompt"], route_rules).score,
                    "small": _answer(small, item, run, signal, client),
                    "big": _answer(big, item, run, signal, client)}
                if embedding_deployment:
                    outcome["embedding"] = _embed(client, embedding_deployment, item["prompt"], run)
                outcomes.append(outcome)
                going.update(outcomes=outcomes)
        trained = _classify(outcomes, embedding_deployment)
        drawn = curves(outcomes)
        going.update(
            state=CalibrationState.DONE, curves=drawn, summary=summary(outcomes, drawn) | trained, outcomes=outcomes,
            finished_at=timezone.now())
    except (httpx.HTTPError, RuntimeError, ValueError, policies.PolicySettingsInvalid) as exc:
        going.update(
            state=CalibrationState.FAILED, error=f"{exc.__class__.__name__}: {exc}"[:2000],
            finished_at=timezone.now())
