"""Reads what a GGUF file says about its model (architecture, size, quantization, context, chat template)."""

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from gguf import GGUFReader, LlamaFileType

GGUF_MAGIC = b"GGUF"


class InvalidModelFile(ValueError):
    pass


@dataclass
class GgufInfo:
    family: str
    parameter_count: int
    quantization: str
    context_length: int | None
    chat_template: str
    size_bytes: int
    # An f16 KV cache's bytes for one token of context, over every layer: what each slot costs per token.
    kv_bytes_per_token: int


def _field(reader: GGUFReader, key: str):
    field = reader.fields.get(key)
    return field.contents() if field is not None else None


def read_gguf(path: Path) -> GgufInfo:
    if not path.exists():
        raise InvalidModelFile(f"No file at {path}.")
    if not path.is_file():
        raise InvalidModelFile(f"{path} is a directory, not a GGUF file.")
    with path.open("rb") as handle:
        if handle.read(4) != GGUF_MAGIC:
            raise InvalidModelFile(f"{path.name} is not a GGUF file (its header does not start with 'GGUF').")
    stat = path.stat()
    return _read_checked(str(path.resolve()), stat.st_size, stat.st_mtime_ns)


# Parsing a large vocabulary takes seconds in Python; a file is only re-read when it changes.
@lru_cache(maxsize=32)
def _read_checked(location: str, size: int, modified_ns: int) -> GgufInfo:
    path = Path(location)
    try:
        reader = GGUFReader(path)
    except Exception as exc:  # the reader raises many kinds of errors on truncated or corrupt files
        raise InvalidModelFile(f"{path.name} is not a readable GGUF file: {exc}") from exc
    family = _field(reader, "general.architecture") or ""
    file_type = _field(reader, "general.file_type")
    try:
        quantization = LlamaFileType(file_type).name.removeprefix("MOSTLY_") if file_type is not None else ""
    except ValueError:
        quantization = f"type-{file_type}"
    return GgufInfo(
        family=family,
        parameter_count=sum(int(tensor.n_elements) for tensor in reader.tensors),
        quantization=quantization,
        context_length=_field(reader, f"{family}.context_length"),
        chat_template=_field(reader, "tokenizer.chat_template") or "",
        size_bytes=size,
        kv_bytes_per_token=_kv_bytes_per_token(reader, family),
    )


def _kv_bytes_per_token(reader: GGUFReader, family: str) -> int:
    layers = _field(reader, f"{family}.block_count") or 0
    heads = _field(reader, f"{family}.attention.head_count") or 1
    width = _field(reader, f"{family}.embedding_length") or 0
    # Per-layer lists where layers differ (some hybrids); one number for all layers otherwise.
    heads = heads if isinstance(heads, list) else [heads] * layers
    kv_heads = _field(reader, f"{family}.attention.head_count_kv") or heads
    kv_heads = kv_heads if isinstance(kv_heads, list) else [kv_heads] * layers
    key_length = _field(reader, f"{family}.attention.key_length") or (width // max(heads[0], 1) if heads else 0)
    value_length = _field(reader, f"{family}.attention.value_length") or key_length
    return sum(kv_heads) * (key_length + value_length) * 2
