"""From stored conversations to training examples: each conversation rendered with the chat template the served
model uses (so the tuned model answers in serving as it did in training), tokenized once, with labels only on the
assistant's tokens. No Django here: the training process and the web process both use it."""

import json
from functools import lru_cache
from pathlib import Path

IGNORE_INDEX = -100


class TemplateMismatch(ValueError):
    pass


def read_conversations(path: Path) -> list[list[dict]]:
    with path.open(encoding="utf-8") as lines:
        return [json.loads(line)["messages"] for line in lines if line.strip()]


def split(conversations: list, validation_count: int) -> tuple[list, list]:
    """The stored file is already shuffled: the last `validation_count` samples are the validation split."""
    cut = len(conversations) - validation_count
    return conversations[:cut], conversations[cut:]


@lru_cache(maxsize=4)
def _tokenizer(location: str, gguf_file: str, modified_ns: int):
    from transformers import AutoTokenizer

    if gguf_file:
        return AutoTokenizer.from_pretrained(location, gguf_file=gguf_file)
    return AutoTokenizer.from_pretrained(location)


def load_tokenizer(model_path: str):
    """The tokenizer of a GGUF file or a Hugging Face directory (read once per file version)."""
    path = Path(model_path)
    if path.is_file():
        return _tokenizer(str(path.parent), path.name, path.stat().st_mtime_ns)
    return _tokenizer(str(path), "", path.stat().st_mtime_ns)


def render(tokenizer, messages: list[dict], chat_template: str, *, add_generation_prompt: bool = False) -> str:
    return tokenizer.apply_chat_template(messages, chat_template=chat_template or None, tokenize=False,
                                         add_generation_prompt=add_generation_prompt)


def assistant_spans(tokenizer, messages: list[dict], chat_template: str) -> tuple[str, list[tuple[int, int]]]:
    """The rendered conversation and the character spans of the assistant's turns (each from after the generation
    prompt to the end of the turn, so the model learns to close its turn)."""
    text = render(tokenizer, messages, chat_template)
    spans = []
    for index, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        before = render(tokenizer, messages[:index], chat_template, add_generation_prompt=True)
        through = render(tokenizer, messages[:index + 1], chat_template)
        if not text.startswith(before) or not text.startswith(through):
            raise TemplateMismatch("The chat template renders a conversation differently from its beginning, so "
                                   "the answers cannot be told from the prompts.")
        spans.append((len(before), len(through)))
    return text, spans


def encode(tokenizer, messages: list[dict], chat_template: str, cutoff: int) -> dict:
    """input_ids and labels (IGNORE_INDEX outside the assistant's spans), cut to `cutoff` tokens."""
    text, spans = assistant_spans(tokenizer, messages, chat_template)
    encoded = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    ids, offsets = encoded["input_ids"], encoded["offset_mapping"]
    labels = [token if any(start <= begin < end for start, end in spans) else IGNORE_INDEX
              for token, (begin, _) in zip(ids, offsets)]
    return {"input_ids": ids[:cutoff], "labels": labels[:cutoff], "length": len(ids)}


def token_lengths(tokenizer, conversations: list[list[dict]], chat_template: str) -> list[int]:
    return [len(tokenizer(render(tokenizer, c, chat_template), add_special_tokens=False)["input_ids"])
            for c in conversations]


def histogram(lengths: list[int], cutoff: int, bins: int = 12) -> dict:
    """Token lengths in equal-width bins up to the longest sample, and the share over the cutoff."""
    if not lengths:
        return {"bins": [], "over_cutoff": 0, "over_cutoff_share": 0.0, "max": 0, "mean": 0.0}
    top = max(lengths)
    width = max(1, -(-top // bins))
    counts = [0] * bins
    for length in lengths:
        counts[min(bins - 1, length // width)] += 1
    over = sum(1 for length in lengths if length > cutoff)
    return {"bins": [{"from": i * width, "to": (i + 1) * width, "count": c} for i, c in enumerate(counts)],
            "over_cutoff": over, "over_cutoff_share": over / len(lengths), "max": top,
            "mean": sum(lengths) / len(lengths)}
