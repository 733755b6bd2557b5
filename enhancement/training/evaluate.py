"""The before/after report: the base model and every output measured on this node with the same held-out
conversations and the same prompts, through the runtime that serves it (llama.cpp for a GGUF, transformers for int8
Hugging Face weights): file size, prefill and decode tokens/s, perplexity of the held-out answers given their prompts,
and token-F1 of greedy answers against the expected ones.

Perplexity counts the answer tokens only, as the training's validation loss does: over whole rendered
conversations, an instruction-tuned model scored worse than its base (the prompts' tokens, on which it was never
trained, dominated) while its answers went from echoing the question to correct, so that figure said the opposite
of what changed."""

import json
import math
import os
import re
import time
import unicodedata
from collections import Counter
from pathlib import Path

import numpy as np

from accounts.atomic_files import write_json_atomic
from enhancement.training import data
from enhancement.training.bases import tokenizer_source
from enhancement.training.export import size_on_disk

# Enough to compare models on this node in seconds, not minutes.
HELDOUT_TOKENS = 512
WINDOW = 256
MAX_PROMPTS = 4
MAX_ANSWER_TOKENS = 48


def normalise_tokens(text: str) -> list[str]:
    """SQuAD-style answer normalisation (lower case, no punctuation or articles), with CJK characters as tokens,
    so that Chinese answers are scored too. Written here because rag_studio's metrics sit on the same floor."""
    text = unicodedata.normalize("NFKC", text.lower())
    text = "".join(" " if unicodedata.category(c).startswith("P") else c for c in text)
    text = re.sub(r"([\u3400-\u9fff])", r" \1 ", text)
    return [t for t in text.split() if t not in ("a", "an", "the")]


def token_f1(prediction: str, reference: str) -> float:
    predicted, expected = normalise_tokens(prediction), normalise_tokens(reference)
    if not predicted or not expected:
        return float(predicted == expected)
    common = sum((Counter(predicted) & Counter(expected)).values())
    if common == 0:
        return 0.0
    precision, recall = common / len(predicted), common / len(expected)
    return 2 * precision * recall / (precision + recall)


def eval_material(spec: dict, max_prompts: int = MAX_PROMPTS) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """The held-out conversations (each rendered with the served chat template up to its last answer, and whole)
    and prompt/answer pairs (the first `max_prompts` of them: the prompt rendered, the expected answer)."""
    tokenizer = data.load_tokenizer(str(tokenizer_source(spec)))
    conversations = data.read_conversations(Path(spec["eval_dataset_path"]))
    _, validation = data.split(conversations, spec.get("eval_validation_count", 0))
    validation = validation or conversations[-max_prompts:]
    template = spec.get("chat_template", "")
    heldout, prompts = [], []
    for messages in validation:
        prompt = data.render(tokenizer, messages[:-1], template, add_generation_prompt=True)
        heldout.append((prompt, data.render(tokenizer, messages, template)))
        if len(prompts) < max_prompts:
            prompts.append((prompt, messages[-1]["content"]))
    return heldout, prompts


def measure(path: str, heldout: list[tuple[str, str]], prompts: list[tuple[str, str]], *,
            heldout_tokens: int = HELDOUT_TOKENS) -> dict:
    import llama_cpp

    llm = llama_cpp.Llama(model_path=path, n_ctx=max(WINDOW, 1024), n_batch=WINDOW, logits_all=True,
                          n_threads=os.cpu_count() or 1, verbose=False)
    nll, count, prefill_tokens, prefill_s = 0.0, 0, 0, 0.0
    for prompt, whole in heldout:
        if count >= heldout_tokens:
            break
        tokens = llm.tokenize(whole.encode(), add_bos=False, special=True)[:WINDOW]
        start = len(llm.tokenize(prompt.encode(), add_bos=False, special=True))
        if not 0 < start < len(tokens):
            continue
        llm.reset()
        began = time.perf_counter()
        llm.eval(tokens)
        prefill_s += time.perf_counter() - began
        prefill_tokens += len(tokens)
        # The logits at position i predict token i + 1: the answer's tokens are predicted from start - 1 on.
        logits = np.asarray(llm.scores[start - 1:len(tokens) - 1], dtype=np.float64)
        top = logits.max(axis=1, keepdims=True)
        log_z = top[:, 0] + np.log(np.exp(logits - top).sum(axis=1))
        picked = logits[np.arange(len(logits)), tokens[start:]]
        nll += float((log_z - picked).sum())
        count += len(tokens) - start
    vocab = llm._model.vocab
    f1s, decode_tokens, decode_s, answers = [], 0, 0.0, []
    for prompt, expected in prompts:
        prompt_tokens = llm.tokenize(prompt.encode(), add_bos=False, special=True)
        produced = []
        first = time.perf_counter()
        for index, token in enumerate(llm.generate(prompt_tokens, top_k=1, temp=0.0, reset=True)):
            if index == 0:
                first = time.perf_counter()
            if llama_cpp.llama_vocab_is_eog(vocab, token) or len(produced) >= MAX_ANSWER_TOKENS:
                break
            produced.append(token)
        decode_s += time.perf_counter() - first
        decode_tokens += max(0, len(produced) - 1)
        answer = llm.detokenize(produced).decode("utf-8", errors="replace")
        answers.append(answer)
        f1s.append(token_f1(answer, expected))
    return _figures(path, nll, count, prefill_tokens, prefill_s, decode_tokens, decode_s, f1s, answers)


def measure_hf(path: str, heldout: list[tuple[str, str]], prompts: list[tuple[str, str]], *,
               heldout_tokens: int = HELDOUT_TOKENS) -> dict:
    """`measure` through transformers, for Hugging Face weights (int8 by torchao)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, LogitsProcessor, LogitsProcessorList

    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()

    def ids(text: str) -> list[int]:
        return tokenizer(text, add_special_tokens=False)["input_ids"]

    class StepClock(LogitsProcessor):
        """Called once per generated token, after the forward pass that produced its logits."""

        def __init__(self):
            self.times = []

        def __call__(self, input_ids, scores):
            self.times.append(time.perf_counter())
            return scores

    nll, count, prefill_tokens, prefill_s = 0.0, 0, 0, 0.0
    f1s, decode_tokens, decode_s, answers = [], 0, 0.0, []
    with torch.inference_mode():
        for prompt, whole in heldout:
            if count >= heldout_tokens:
                break
            tokens = ids(whole)[:WINDOW]
            start = len(ids(prompt))
            if not 0 < start < len(tokens):
                continue
            began = time.perf_counter()
            logits = model(torch.tensor([tokens])).logits[0]
            prefill_s += time.perf_counter() - began
            prefill_tokens += len(tokens)
            logprobs = torch.log_softmax(logits[start - 1:len(tokens) - 1].double(), dim=-1)
            nll -= float(logprobs[torch.arange(len(tokens) - start), torch.tensor(tokens[start:])].sum())
            count += len(tokens) - start
        for prompt, expected in prompts:
            clock = StepClock()
            prompt_ids = torch.tensor([ids(prompt)])
            produced = model.generate(prompt_ids, max_new_tokens=MAX_ANSWER_TOKENS, do_sample=False,
                                      logits_processor=LogitsProcessorList([clock]))[0][prompt_ids.shape[1]:]
            decode_s += clock.times[-1] - clock.times[0] if len(clock.times) > 1 else 0.0
            decode_tokens += max(0, len(clock.times) - 1)
            answer = tokenizer.decode(produced, skip_special_tokens=True)
            answers.append(answer)
            f1s.append(token_f1(answer, expected))
    return _figures(path, nll, count, prefill_tokens, prefill_s, decode_tokens, decode_s, f1s, answers)


def _figures(path: str, nll: float, count: int, prefill_tokens: int, prefill_s: float, decode_tokens: int,
             decode_s: float, f1s: list[float], answers: list[str]) -> dict:
    return {
        "size_bytes": size_on_disk(Path(path)),
        "perplexity": math.exp(nll / count) if count else None,
        "heldout_tokens": count,
        "prefill_tokens_per_s": prefill_tokens / prefill_s if prefill_s else None,
        "decode_tokens_per_s": decode_tokens / decode_s if decode_s else None,
        "token_f1": sum(f1s) / len(f1s) if f1s else None,
        "sample_answers": answers[:3],
    }


def evaluate(run, outputs: list[dict]) -> dict:
    target = run.dir / "report.json"
    if target.exists():
        return json.loads(target.read_text())
    run.status("evaluate", "Measuring the base and the outputs on the held-out answers and prompts")
    heldout, prompts = eval_material(run.spec)
    rows = []
    base_gguf = run.spec.get("base_gguf")
    if base_gguf:
        rows.append({"model": "base", "quantization": run.spec.get("base_quantization", ""),
                     **measure(base_gguf, heldout, prompts)})
    for output in outputs:
        measured = measure_hf if Path(output["path"]).is_dir() else measure
        rows.append({"model": "output", "quantization": output["quantization"],
                     **measured(output["path"], heldout, prompts)})
    base = rows[0] if rows and rows[0]["model"] == "base" else None
    for row in rows:
        if base and row is not base and base["perplexity"] and row["perplexity"]:
            row["perplexity_ratio"] = row["perplexity"] / base["perplexity"]
    report = {"rows": rows, "prompts": len(prompts),
              "heldout": f"{rows[0]['heldout_tokens'] if rows else 0} answer tokens of the validation split"}
    write_json_atomic(target, report)
    return report
