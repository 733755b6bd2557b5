"""What decides, per request, which member of a model group answers: pure functions of the request, the small
model's answer and the group's settings, shared by the gateway and by calibration (so a threshold picked on the
calibration curve means the same thing when it serves).

- route: a difficulty score in [0, 1] from rules over the request's text (its length, keywords, patterns); the big
  member answers when the score is at or above the threshold.
- cascade: the small member answers first; its confidence is the geometric mean (or the minimum) of its tokens'
  probabilities, exp(mean or min log-prob) from the engine's logprobs, in (0, 1]; the answer is kept when the
  confidence is at or above the threshold and it passes the self-check (not empty), else the big member answers.

Both thresholds are in [0, 1], so one range check holds for every policy.
"""

import math
import re
from dataclasses import dataclass

ROUTE_DEFAULTS = {
    # "rules" (below), or "classifier": logistic regression on the request's embedding from
    # `embedding_deployment`, trained by calibration (serving/groups/classifier.py).
    "score": "rules",
    "embedding_deployment": "",
    # Characters of request text at which the length alone makes the score 1.
    "length_scale": 2000,
    # Added to the score when any keyword (case-insensitive) or any pattern (a regular expression) matches.
    "keywords": [],
    "keyword_weight": 0.5,
    "patterns": [],
    "pattern_weight": 0.5,
}
ROUTE_SCORES = ("rules", "classifier")
CASCADE_DEFAULTS = {"confidence": "mean"}
CONFIDENCE_SIGNALS = ("mean", "min")
MAX_RULES = 200


class PolicySettingsInvalid(ValueError):
    """The group's settings cannot work; the message names the setting."""


@dataclass(frozen=True)
class RouteScore:
    score: float
    why: str


def request_text(body: dict) -> str:
    """The text a route rule reads: every user message's text (a chat's messages, or a completion's prompt)."""
    if isinstance(body.get("messages"), list):
        parts = []
        for message in body["messages"]:
            if isinstance(message, dict) and message.get("role") == "user":
                content = message.get("content")
                if isinstance(content, list):
                    content = " ".join(part.get("text", "") for part in content if isinstance(part, dict))
                parts.append(content if isinstance(content, str) else "")
        return "\n".join(parts)
    prompt = body.get("prompt")
    return prompt if isinstance(prompt, str) else "\n".join(p for p in prompt or [] if isinstance(p, str))


def route_settings(raw: dict) -> dict:
    """The route's settings with defaults filled in, or PolicySettingsInvalid naming the bad one."""
    if not isinstance(raw or {}, dict):
        raise PolicySettingsInvalid("'route' must be an object of rules.")
    value = {**ROUTE_DEFAULTS, **{k: v for k, v in (raw or {}).items() if k in ROUTE_DEFAULTS}}
    if value["score"] not in ROUTE_SCORES:
        raise PolicySettingsInvalid(f"'score' must be one of {', '.join(ROUTE_SCORES)}.")
    if not isinstance(value["embedding_deployment"], str):
        raise PolicySettingsInvalid("'embedding_deployment' must be the name of an embedding deployment.")
    scale = value["length_scale"]
    if not isinstance(scale, (int, float)) or isinstance(scale, bool) or scale <= 0:
        raise PolicySettingsInvalid("'length_scale' must be a positive number of characters.")
    for weight in ("keyword_weight", "pattern_weight"):
        if not isinstance(value[weight], (int, float)) or isinstance(value[weight], bool) \
                or not 0 <= value[weight] <= 1:
            raise PolicySettingsInvalid(f"'{weight}' must be a number from 0 to 1.")
    for listed in ("keywords", "patterns"):
        items = value[listed]
        if not isinstance(items, list) or len(items) > MAX_RULES or \
                not all(isinstance(item, str) and item.strip() for item in items):
            raise PolicySettingsInvalid(f"'{listed}' must be a list of at most {MAX_RULES} non-empty strings.")
        value[listed] = [item.strip() for item in items]
    for pattern in value["patterns"]:
        try:
            re.compile(pattern)
        except re.error as exc:
            raise PolicySettingsInvalid(f"The pattern '{pattern}' is not a regular expression: {exc}.")
    return value


def route_score(text: str, settings: dict) -> RouteScore:
    """min(1, length part + keyword part + pattern part), and the parts that made it, in words."""
    rules = route_settings(settings)
    length_part = min(1.0, len(text) / rules["length_scale"])
    parts = [f"length {len(text)} chars: {length_part:.2f}"]
    lowered = text.lower()
    score = length_part
    keyword = next((k for k in rules["keywords"] if k.lower() in lowered), None)
    if keyword is not None:
        score += rules["keyword_weight"]
        parts.append(f"keyword '{keyword}': {rules['keyword_weight']:.2f}")
    pattern = next((p for p in rules["patterns"] if re.search(p, text)), None)
    if pattern is not None:
        score += rules["pattern_weight"]
        parts.append(f"pattern '{pattern}': {rules['pattern_weight']:.2f}")
    score = min(1.0, score)
    return RouteScore(score=round(score, 4), why=" + ".join(parts))


def cascade_settings(raw: dict) -> dict:
    if not isinstance(raw or {}, dict):
        raise PolicySettingsInvalid("'cascade' must be an object.")
    value = {**CASCADE_DEFAULTS, **{k: v for k, v in (raw or {}).items() if k in CASCADE_DEFAULTS}}
    if value["confidence"] not in CONFIDENCE_SIGNALS:
        raise PolicySettingsInvalid(f"'confidence' must be one of {', '.join(CONFIDENCE_SIGNALS)}.")
    return value


def token_logprobs(choice: dict) -> list[float]:
    """The sampled tokens' log-probs of one choice of a chat or completion answer (OpenAI's `logprobs.content`,
    which llama-server fills when asked with `logprobs: true`)."""
    logprobs = choice.get("logprobs") or {}
    content = logprobs.get("content") if isinstance(logprobs, dict) else None
    return [float(t["logprob"]) for t in content or [] if isinstance(t, dict) and
            isinstance(t.get("logprob"), (int, float))]


def confidence(logprobs: list[float], signal: str) -> float | None:
    """exp(mean) or exp(min) of the token log-probs, in (0, 1]; None for an answer without tokens."""
    if not logprobs:
        return None
    value = sum(logprobs) / len(logprobs) if signal == "mean" else min(logprobs)
    return math.exp(max(value, -745.0))  # exp underflows to 0.0 below about -745


def answer_text(choice: dict) -> str:
    message = choice.get("message")
    if isinstance(message, dict):
        return message.get("content") or ""
    return choice.get("text") or ""


@dataclass(frozen=True)
class CascadeVerdict:
    keep_small: bool
    confidence: float | None
    why: str


def cascade_verdict(choice: dict, *, threshold: float, signal: str) -> CascadeVerdict:
    """Keep the small answer, or escalate, and why."""
    level = confidence(token_logprobs(choice), signal)
    has_tool_calls = bool((choice.get("message") or {}).get("tool_calls"))
    if not answer_text(choice).strip() and not has_tool_calls:
        return CascadeVerdict(False, level, "self-check failed: the small model's answer is empty")
    if level is None:
        return CascadeVerdict(False, None, "the engine returned no log-probs for the small answer")
    if level >= threshold:
        return CascadeVerdict(True, level, f"{signal} token confidence {level:.3f} >= threshold {threshold:.3f}")
    return CascadeVerdict(False, level, f"{signal} token confidence {level:.3f} < threshold {threshold:.3f}")
