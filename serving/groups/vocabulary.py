"""Whether a draft model can speculate for a big one in llama-server: the same checks llama.cpp makes when it
loads a draft (common/speculative.cpp, common_speculative_are_compatible), read from the GGUF headers before
anything starts. llama-server itself only logs an incompatible draft and serves without it, so the platform refuses
the pair up front, with the reason, instead of starting a deployment that silently does not speculate."""

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from gguf import GGUFReader

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


def _field(reader: GGUFReader, key: str):
    field = reader.fields.get(key)
    return field.contents() if field is not None else None


def _tokens(reader: GGUFReader) -> tuple[bytes, ...]:
    # As raw bytes: decoding a 262k-token vocabulary into str (the reader's contents()) takes seconds.
    field = reader.fields.get("tokenizer.ggml.tokens")
    return tuple(bytes(field.parts[index]) for index in field.data) if field is not None else ()


# Opening a GGUF parses every field (seconds for a large vocabulary); a file is read again only when it changes.
@lru_cache(maxsize=4)
def _read(location: str, size: int, modified_ns: int) -> Vocabulary:
    reader = GGUFReader(location)
    return Vocabulary(kind=_field(reader, "tokenizer.ggml.model") or "", tokens=_tokens(reader),
                      bos=_field(reader, "tokenizer.ggml.bos_token_id"),
                      eos=_field(reader, "tokenizer.ggml.eos_token_id"),
                      add_bos=bool(_field(reader, "tokenizer.ggml.add_bos_token")),
                      add_eos=bool(_field(reader, "tokenizer.ggml.add_eos_token")))


def read_vocabulary(path: str) -> Vocabulary:
    stat = Path(path).stat()
    return _read(str(Path(path).resolve()), stat.st_size, stat.st_mtime_ns)


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
