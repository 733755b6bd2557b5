"""Whether a draft model can speculate for a big one in llama-server: the same checks llama.cpp makes when it
loads a draft (common/speculative.cpp, common_speculative_are_compatible), read from the GGUF headers before
anything starts. llama-server itself only logs an incompatible draft and serves without it, so the platform refuses
the pair up front, with the reason, instead of starting a deployment that silently does not speculate."""

from dataclasses import dataclass
from pathlib import Path

from serving.gguf_info import read_header, read_tokens

# llama.cpp's own tolerances: vocabulary sizes may differ by this many tokens, and the first few ids (special
# tokens) are not compared.
MAX_SIZE_DIFFERENCE = 128
CHECK_FROM_TOKEN = 5


@dataclass(frozen=True)
class Vocabulary:
    kind: str
    tokens: tuple[bytes, ...]
    bos: int | None
    eos: int | None
    add_bos: bool
    add_eos: bool


def read_vocabulary(path: str) -> Vocabulary:
    fields = read_header(Path(path)).fields
    return Vocabulary(kind=fields.get("tokenizer.ggml.model") or "", tokens=read_tokens(Path(path)),
                      bos=fields.get("tokenizer.ggml.bos_token_id"), eos=fields.get("tokenizer.ggml.eos_token_id"),
                      add_bos=bool(fields.get("tokenizer.ggml.add_bos_token")),
                      add_eos=bool(fields.get("tokenizer.ggml.add_eos_token")))


def draft_incompatibility(big_path: str, draft_path: str) -> str:
    """Why the draft cannot speculate for the big model, in words; '' when it can."""
    big, draft = read_vocabulary(big_path), read_vocabulary(draft_path)
    if big.kind != draft.kind:
        return f"their tokenizers differ ({big.kind or 'unknown'} against {draft.kind or 'unknown'})"
    if (big.add_bos, big.bos if big.add_bos else None) != (draft.add_bos, draft.bos if draft.add_bos else None):
        return f"their beginning-of-text tokens differ (id {big.bos} against {draft.bos})"
    if (big.add_eos, big.eos if big.add_eos else None) != (draft.add_eos, draft.eos if draft.add_eos else None):
        return f"their end-of-text tokens differ (id {big.eos} against {draft.eos})"
    if abs(len(big.tokens) - len(draft.tokens)) > MAX_SIZE_DIFFERENCE:
        return f"their vocabularies differ in size ({len(big.tokens)} against {len(draft.tokens)} tokens)"
    for token_id in range(CHECK_FROM_TOKEN, min(len(big.tokens), len(draft.tokens))):
        if big.tokens[token_id] != draft.tokens[token_id]:
            return (f"their vocabularies differ (token {token_id} is {big.tokens[token_id].decode(errors='replace')!r} "
                    f"in the big model and {draft.tokens[token_id].decode(errors='replace')!r} in the draft)")
    return ""
