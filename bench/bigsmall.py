"""Big/small model groups (issue 19): route and cascade at the threshold calibration chooses, measured on prompts
held out from that calibration, against big-only and small-only.

    .venv/bin/python -m bench.bigsmall [--prompts 120] [--max-tokens 48] [--threads 2] [--seed 19]

The pair is the platform's presets as `make run` deploys them, launched as the llamacpp engine launches them:
SmolLM2-135M-Instruct (small) and Gemma-3-270M with the registry's chat template (big; the instruction-tuned Gemma
of the model-enhancement issue replaces it once it lands). The prompts and references are the instruction set
that ships with the platform (enhancement/samples/instructions.jsonl, English and Chinese), split at random in two
halves: calibration and held-out.

Every prompt is answered by both members, one request at a time, straight from the engines (no gateway): the
small member with its tokens' log-probs, as the cascade asks for them. The group's decisions are then the
gateway's own functions (serving/groups/policies.py via calibration.py) applied to those answers, so each policy's
figures are what the group would have served: quality (token-F1 against the reference), the big member's share of
requests and of tokens (its compute: prompt and answer tokens through the big model), and p50 latency (route: the
chosen member's; cascade: the small member's, plus the big member's when it escalates). The gateway's own few
milliseconds are bench.serving_overhead's subject, not this one's.

Needs no running instance. The target: at least 40% less big-model compute at 95% or more of big-only quality.
"""

import argparse
import json
import random
import secrets
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

from bench.helpers.running_instance import REPO_ROOT, print_header, wait_for
from serving.engines import process
from serving.engines.base import Listen, auth_headers, engine
from serving.groups import calibration, policies, scoring
from serving.metrics import percentile
from serving.models import Model
from serving.presets import GEMMA3, GEMMA3_CHAT_TEMPLATE, SMOLLM2, _gemma3_path, _smollm2_path

PROMPTS = REPO_ROOT / "enhancement" / "samples" / "instructions.jsonl"
ENGINE_START_TIMEOUT_S = 240
TARGET_COMPUTE_SAVED = 0.40
TARGET_QUALITY = 0.95


def _start(model: Model, threads: int, workdir: Path) -> tuple[int, str, str]:
    """A llama-server of `model` as the llamacpp engine launches it: (pid, base URL, key)."""
    port, key = process.free_port(), secrets.token_urlsafe(24)
    key_file = process.write_key_file(workdir / f"{model.name}.key", key)
    spec = engine("llamacpp").launch_spec(model=model, settings={"threads": threads, "parallel": 1},
                                          served_name=model.name,
                                          listen=Listen(host="127.0.0.1", port=port, key_file=key_file))
    log = workdir / f"{model.name}.log"
    pid = process.launch(spec.argv, log_path=log, env=spec.env)
    root = f"http://127.0.0.1:{port}"

    def healthy() -> bool:
        if not process.is_alive(pid):
            raise RuntimeError(f"{model.name} exited:\n{process.log_tail(log)}")
        return process.probe(f"{root}/health")

    wait_for(healthy, done=bool, timeout_s=ENGINE_START_TIMEOUT_S, what=f"{model.name} to start")
    return pid, f"{root}/v1", key


def _ask(client: httpx.Client, base_url: str, key: str, prompt: str, args, *, logprobs: bool) -> tuple[dict, float]:
    body = {"messages": [{"role": "user", "content": prompt}], "max_tokens": args.max_tokens,
            "temperature": args.temperature}
    if logprobs:
        body |= {"logprobs": True, "top_logprobs": 1}
    started = time.perf_counter()
    response = client.post(f"{base_url}/chat/completions", json=body, headers=auth_headers(key))
    elapsed_ms = (time.perf_counter() - started) * 1000
    response.raise_for_status()
    return response.json(), elapsed_ms


def _outcome(item: dict, small: tuple[dict, float], big: tuple[dict, float]) -> dict:
    """What calibration stores for a prompt, plus each member's latency."""

    def member(payload: dict, latency_ms: float) -> dict:
        choice, usage = payload["choices"][0], payload.get("usage") or {}
        answer = policies.answer_text(choice)
        return {"answer": answer, "quality": scoring.token_f1(answer, item["reference"]),
                "tokens": (usage.get("prompt_tokens") or 0) + (usage.get("completion_tokens") or 0),
                "confidence": policies.confidence(policies.token_logprobs(choice), "mean"),
                "latency_ms": latency_ms}

    return {"prompt": item["prompt"], "reference": item["reference"],
            "route_score": policies.route_score(item["prompt"], {}).score,
            "small": member(*small), "big": member(*big)}


def _choose(points: list[dict]) -> tuple[dict, str]:
    """The point calibration suggests; where none keeps 95% of big-only quality, the best quality (least big
    share among equals), and say so."""
    chosen = calibration.suggested(points, TARGET_QUALITY)
    if chosen is not None:
        return chosen, "least big-model tokens at >= 95% of big-only quality"
    best = max(points, key=lambda p: (p["relative_quality"] or 0, -p["big_share_tokens"]))
    return best, "no point reaches 95% of big-only quality; best quality chosen"


def _serve(outcomes: list[dict], to_big) -> dict:
    """What the group serves on `outcomes` when `to_big(outcome)` says which go to the big member; cascade
    latency adds the small member's time to an escalated request."""
    big = [to_big(o) for o in outcomes]
    quality = statistics.fmean(o["big"]["quality"] if b else o["small"]["quality"] for o, b in zip(outcomes, big))
    return {"quality": quality, "big_requests": sum(big) / len(outcomes),
            "big_tokens": sum(o["big"]["tokens"] for o, b in zip(outcomes, big) if b)
            / sum(o["big"]["tokens"] for o in outcomes)}


def _latency(outcomes: list[dict], to_big, cascade: bool) -> float:
    values = []
    for outcome in outcomes:
        latency = outcome["big"]["latency_ms"] if to_big(outcome) else outcome["small"]["latency_ms"]
        if cascade and to_big(outcome):
            latency += outcome["small"]["latency_ms"]
        values.append(latency)
    return percentile(values, 50)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompts", type=int, default=120)
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--temperature", type=float, default=0.2)
    parser.add_argument("--seed", type=int, default=19)
    args = parser.parse_args()
    # A stopped bench (`timeout`, Ctrl-C's cousin SIGTERM) still stops the engines it started.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))

    rows = [json.loads(line) for line in PROMPTS.read_text().splitlines() if line.strip()]
    items = calibration.checked_items(rows)
    random.Random(args.seed).shuffle(items)
    items = items[:args.prompts]
    half = len(items) // 2
    print_header("Big/small model groups: route and cascade at the calibrated threshold, on held-out prompts",
                 f"{len(items)} prompts from {PROMPTS.relative_to(REPO_ROOT)} (seed {args.seed}): {half} to "
                 f"calibrate, {len(items) - half} held out; max_tokens {args.max_tokens}, temperature "
                 f"{args.temperature}; one request at a time, {args.threads} threads per engine; quality = token-F1")
    small_model = Model(name=SMOLLM2, path=str(_smollm2_path()), context_length=8192)
    big_model = Model(name=GEMMA3, path=str(_gemma3_path()), context_length=32768,
                      chat_template=GEMMA3_CHAT_TEMPLATE)
    with tempfile.TemporaryDirectory(prefix="bench-bigsmall-") as workdir:
        started = [_start(model, args.threads, Path(workdir)) for model in (small_model, big_model)]
        try:
            (_, small_url, small_key), (_, big_url, big_key) = started
            outcomes = []
            with httpx.Client(timeout=300, trust_env=False) as client:
                for number, item in enumerate(items, start=1):
                    small = _ask(client, small_url, small_key, item["prompt"], args, logprobs=True)
                    big = _ask(client, big_url, big_key, item["prompt"], args, logprobs=False)
                    outcomes.append(_outcome(item, small, big))
                    if number % 20 == 0:
                        print(f"  {number}/{len(items)} prompts answered by both members", flush=True)
        finally:
            for pid, _, _ in started:
                process.terminate(pid)
    calibrating, held_out = outcomes[:half], outcomes[half:]
    curves = calibration.curves(calibrating)
    print("\nCalibration curve (calibration half; quality relative to big-only):")
    print(f"{'policy':<8} {'threshold':>9} {'big req':>8} {'big tok':>8} {'quality':>8} {'vs big':>7}")
    for policy, points in curves.items():
        shown = points[:: max(1, len(points) // 12)]
        for p in shown + ([points[-1]] if shown[-1] is not points[-1] else []):
            relative = "—" if p["relative_quality"] is None else f"{p['relative_quality']:.3f}"
            print(f"{policy:<8} {p['threshold']:>9.4f} {p['big_share_requests']:>8.2f} {p['big_share_tokens']:>8.2f} "
                  f"{p['quality']:>8.3f} {relative:>7}")
    big_only = statistics.fmean(o["big"]["quality"] for o in held_out)
    small_only = statistics.fmean(o["small"]["quality"] for o in held_out)
    print(f"\nHeld out ({len(held_out)} prompts): big-only quality {big_only:.3f}, small-only {small_only:.3f} "
          f"(token-F1)")
    print(f"{'policy':<11} {'threshold':>9} {'quality':>8} {'vs big':>7} {'vs small':>8} {'big req':>8} "
          f"{'big tok':>8} {'compute saved':>13} {'p50 ms':>8}  choice")
    lines = [("big-only", None, lambda o: True, False, ""), ("small-only", None, lambda o: False, False, "")]
    for policy, decide, cascade in (("route", calibration.route_would_send_big, False),
                                    ("cascade", calibration.cascade_would_escalate, True)):
        point, why = _choose(curves[policy])
        lines.append((policy, point["threshold"], lambda o, d=decide, t=point["threshold"]: d(o, t), cascade, why))
    verdicts = []
    for label, threshold, to_big, cascade, why in lines:
        served = _serve(held_out, to_big)
        relative = served["quality"] / big_only if big_only else float("nan")
        versus_small = served["quality"] / small_only if small_only else float("nan")
        saved = 1 - served["big_tokens"]
        shown = "—" if threshold is None else f"{threshold:.4f}"
        print(f"{label:<11} {shown:>9} {served['quality']:>8.3f} {relative:>7.3f} {versus_small:>8.3f} "
              f"{served['big_requests']:>8.2f} {served['big_tokens']:>8.2f} {saved:>12.0%} "
              f"{_latency(held_out, to_big, cascade):>8.0f}  {why}")
        if threshold is not None:
            verdicts.append(f"{label}: {saved:.0%} less big-model compute at {relative:.0%} of big-only quality "
                            f"({'meets' if saved >= TARGET_COMPUTE_SAVED and relative >= TARGET_QUALITY else 'misses'}"
                            f" the target of >= {TARGET_COMPUTE_SAVED:.0%} at >= {TARGET_QUALITY:.0%})")
    print("\n" + "\n".join(verdicts))


if __name__ == "__main__":
    main()
