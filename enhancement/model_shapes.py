"""A registered model's architecture for the planner (layers, widths, heads, vocabulary), from its GGUF header or
its Hugging Face config, and whether the platform can train it at all."""

import json
from pathlib import Path

from accounts.errors import ValidationFailed
from enhancement.planner import ModelShape
from serving.gguf_info import read_header, read_tokens
from serving.models import Model, ModelKind


def trainable_problem(model: Model) -> str:
    """Why the model cannot be trained or compressed here, or '' when it can."""
    if model.kind == ModelKind.EXTERNAL:
        return (f"'{model.name}' is an external endpoint ({model.url}): only models whose files are on this "
                f"platform (GGUF or Hugging Face) can be trained.")
    if model.is_embedding:
        return f"'{model.name}' is an embedding model; fine-tuning and compression here are for chat models."
    if not Path(model.path).exists():
        return f"The file of '{model.name}' is missing ({model.path})."
    return ""


def _gguf_shape(path: Path, parameters: int) -> ModelShape:
    fields = read_header(path).fields
    arch = fields.get("general.architecture")
    heads = fields.get(f"{arch}.attention.head_count")
    kv_heads = fields.get(f"{arch}.attention.head_count_kv") or heads
    return ModelShape(
        parameters=parameters, layers=fields.get(f"{arch}.block_count"),
        hidden_size=fields.get(f"{arch}.embedding_length"),
        attention_heads=heads if isinstance(heads, int) else max(heads),
        kv_heads=kv_heads if isinstance(kv_heads, int) else max(kv_heads),
        vocab_size=len(fields.get("tokenizer.ggml.tokens") or ()),
        intermediate_size=fields.get(f"{arch}.feed_forward_length") or 0,
        head_dim=fields.get(f"{arch}.attention.key_length") or 0)


def model_shape(model: Model) -> ModelShape:
    path = Path(model.path)
    try:
        if model.kind == ModelKind.GGUF:
            return _gguf_shape(path, model.parameter_count or 0)
        config = json.loads((path / "config.json").read_text())
        config = config.get("text_config", config)
        hidden, layers, vocab = config["hidden_size"], config["num_hidden_layers"], config["vocab_size"]
        heads = config["num_attention_heads"]
        intermediate = config.get("intermediate_size") or 4 * hidden
        # Attention (4 h²), the MLP (3 h·i for gated MLPs) and the embeddings, when no count was recorded.
        parameters = model.parameter_count or layers * (4 * hidden * hidden + 3 * hidden * intermediate) + \
            vocab * hidden
        return ModelShape(parameters=parameters, layers=layers, hidden_size=hidden, attention_heads=heads,
                          kv_heads=config.get("num_key_value_heads") or heads, vocab_size=vocab,
                          intermediate_size=intermediate, head_dim=config.get("head_dim") or 0)
    except (OSError, KeyError, ValueError, TypeError) as exc:
        raise ValidationFailed(f"Cannot read the architecture of '{model.name}': {exc}",
                               fields={"base_model": ["Unreadable architecture."]})


def model_vocabulary(model: Model) -> tuple[str, ...]:
    """The model's tokens in id order (from its GGUF, or its Hugging Face tokenizer): two models read text alike
    when these are equal."""
    path = Path(model.path)
    try:
        if model.kind == ModelKind.GGUF:
            return tuple(token.decode("utf-8", errors="replace") for token in read_tokens(path))
        from transformers import AutoTokenizer

        vocabulary = AutoTokenizer.from_pretrained(str(path)).get_vocab()
        return tuple(sorted(vocabulary, key=vocabulary.get))
    except (OSError, ValueError) as exc:
        raise ValidationFailed(f"Cannot read the tokenizer of '{model.name}': {exc}",
                               fields={"teacher": ["Unreadable tokenizer."]})
