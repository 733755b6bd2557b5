"""Reads what a GGUF file says about its model (architecture, size, quantization, context, chat template)."""

import mmap
import struct
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from gguf import GGUFValueType, LlamaFileType

GGUF_MAGIC = b"GGUF"
SUPPORTED_VERSIONS = (2, 3)
# struct formats of GGUF's fixed-size value types.
_FORMATS = {
    GGUFValueType.UINT8: "B", GGUFValueType.INT8: "b", GGUFValueType.UINT16: "H", GGUFValueType.INT16: "h",
    GGUFValueType.UINT32: "I", GGUFValueType.INT32: "i", GGUFValueType.FLOAT32: "f", GGUFValueType.BOOL: "?",
    GGUFValueType.UINT64: "Q", GGUFValueType.INT64: "q", GGUFValueType.FLOAT64: "d",
}
# Numeric arrays up to this length are read (per-layer head counts); longer ones (a vocabulary's scores) are not.
SMALL_ARRAY = 4096


class InvalidModelFile(ValueError):
    pass


@dataclass(frozen=True)
class SkippedArray:
    """An array of the header that was stepped over, not read (a vocabulary): its length and where it starts."""

    item_type: GGUFValueType
    count: int
    offset: int

    def __len__(self) -> int:
        return self.count


@dataclass(frozen=True)
class GgufHeader:
    """A GGUF file's key-value metadata (string arrays and long arrays as `SkippedArray`) and its tensors' total
    number of elements."""

    fields: dict
    parameter_count: int
    byte_order: str


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


class _Cursor:
    """Reads GGUF's little- or big-endian values one after another.

    Written here rather than using gguf's GGUFReader, which builds a numpy view of every item of every array:
    8.8 s for Gemma 3's 262k-token vocabulary, paid by every process that opens the file. Stepping over the
    arrays takes a fraction of a second."""

    def __init__(self, data, order: str, offset: int):
        self.data, self.order, self.offset = data, order, offset

    def number(self, kind: GGUFValueType):
        fmt = self.order + _FORMATS[kind]
        (value,) = struct.unpack_from(fmt, self.data, self.offset)
        self.offset += struct.calcsize(fmt)
        return value

    def raw_string(self) -> bytes:
        length = self.number(GGUFValueType.UINT64)
        start, self.offset = self.offset, self.offset + length
        if self.offset > len(self.data):
            raise ValueError(f"a string of {length} bytes runs past the end of the file")
        return self.data[start:self.offset]

    def value(self, kind: int):
        kind = GGUFValueType(kind)
        if kind == GGUFValueType.STRING:
            return self.raw_string().decode("utf-8", errors="replace")
        if kind != GGUFValueType.ARRAY:
            return self.number(kind)
        item_type = GGUFValueType(self.number(GGUFValueType.UINT32))
        count = self.number(GGUFValueType.UINT64)
        start = self.offset
        if item_type in _FORMATS and count <= SMALL_ARRAY:
            fmt = f"{self.order}{count}{_FORMATS[item_type]}"
            self.offset += struct.calcsize(fmt)
            return list(struct.unpack_from(fmt, self.data, start))
        if item_type in _FORMATS:
            self.offset += count * struct.calcsize(_FORMATS[item_type])
        else:
            for _ in range(count):
                self.value(item_type)
        if self.offset > len(self.data):
            raise ValueError(f"an array of {count} items runs past the end of the file")
        return SkippedArray(item_type, count, start)


def _open(location: str) -> mmap.mmap:
    with open(location, "rb") as handle:
        return mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ)


def _header_cursor(data) -> tuple[_Cursor, int, int]:
    if data[:4] != GGUF_MAGIC:
        raise ValueError("its header does not start with 'GGUF'")
    (version,) = struct.unpack_from("<I", data, 4)
    # A file written on a big-endian machine reads as a version whose low half is zero.
    order = ">" if version & 0xFFFF == 0 else "<"
    cursor = _Cursor(data, order, 4)
    version = cursor.number(GGUFValueType.UINT32)
    if version not in SUPPORTED_VERSIONS:
        raise ValueError(f"GGUF version {version} is not supported")
    return cursor, cursor.number(GGUFValueType.UINT64), cursor.number(GGUFValueType.UINT64)


# A file is only re-read when it changes.
@lru_cache(maxsize=32)
def _header(location: str, size: int, modified_ns: int) -> GgufHeader:
    path = Path(location)
    try:
        with _open(location) as data:
            cursor, tensor_count, field_count = _header_cursor(data)
            fields = {}
            for _ in range(field_count):
                key = cursor.raw_string().decode("utf-8", errors="replace")
                fields[key] = cursor.value(cursor.number(GGUFValueType.UINT32))
            parameters = 0
            for _ in range(tensor_count):
                cursor.raw_string()
                dimensions = [cursor.number(GGUFValueType.UINT64)
                              for _ in range(cursor.number(GGUFValueType.UINT32))]
                cursor.number(GGUFValueType.UINT32)  # the tensor's type
                cursor.number(GGUFValueType.UINT64)  # where its data starts
                elements = 1
                for dimension in dimensions:
                    elements *= dimension
                parameters += elements
    except (OSError, ValueError, struct.error) as exc:  # ValueError covers an empty file and an unknown type
        raise InvalidModelFile(f"{path.name} is not a readable GGUF file: {exc}") from exc
    return GgufHeader(fields=fields, parameter_count=parameters, byte_order=cursor.order)


def _checked_location(path: Path) -> tuple[str, int, int]:
    if not path.exists():
        raise InvalidModelFile(f"No file at {path}.")
    if not path.is_file():
        raise InvalidModelFile(f"{path} is a directory, not a GGUF file.")
    with path.open("rb") as handle:
        if handle.read(4) != GGUF_MAGIC:
            raise InvalidModelFile(f"{path.name} is not a GGUF file (its header does not start with 'GGUF').")
    stat = path.stat()
    return str(path.resolve()), stat.st_size, stat.st_mtime_ns


def read_header(path: Path) -> GgufHeader:
    return _header(*_checked_location(Path(path)))


@lru_cache(maxsize=8)
def _tokens(location: str, size: int, modified_ns: int) -> tuple[bytes, ...]:
    header = _header(location, size, modified_ns)
    tokens = header.fields.get("tokenizer.ggml.tokens")
    if not isinstance(tokens, SkippedArray):
        return ()
    with _open(location) as data:
        cursor = _Cursor(data, header.byte_order, tokens.offset)
        return tuple(cursor.raw_string() for _ in range(tokens.count))


def read_tokens(path: Path) -> tuple[bytes, ...]:
    """The vocabulary in id order, as raw bytes (decoding 262k tokens into str costs time few callers need)."""
    return _tokens(*_checked_location(Path(path)))


def read_gguf(path: Path) -> GgufInfo:
    header = read_header(path)
    fields = header.fields
    family = fields.get("general.architecture") or ""
    file_type = fields.get("general.file_type")
    try:
        quantization = LlamaFileType(file_type).name.removeprefix("MOSTLY_") if file_type is not None else ""
    except ValueError:
        quantization = f"type-{file_type}"
    return GgufInfo(
        family=family,
        parameter_count=header.parameter_count,
        quantization=quantization,
        context_length=fields.get(f"{family}.context_length"),
        chat_template=fields.get("tokenizer.chat_template") or "",
        size_bytes=Path(path).stat().st_size,
        kv_bytes_per_token=_kv_bytes_per_token(fields, family),
    )


def _kv_bytes_per_token(fields: dict, family: str) -> int:
    layers = fields.get(f"{family}.block_count") or 0
    heads = fields.get(f"{family}.attention.head_count") or 1
    width = fields.get(f"{family}.embedding_length") or 0
    # Per-layer lists where layers differ (some hybrids); one number for all layers otherwise.
    heads = heads if isinstance(heads, list) else [heads] * layers
    kv_heads = fields.get(f"{family}.attention.head_count_kv") or heads
    kv_heads = kv_heads if isinstance(kv_heads, list) else [kv_heads] * layers
    key_length = fields.get(f"{family}.attention.key_length") or (width // max(heads[0], 1) if heads else 0)
    value_length = fields.get(f"{family}.attention.value_length") or key_length
    return sum(kv_heads) * (key_length + value_length) * 2
