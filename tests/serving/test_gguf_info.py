"""The GGUF header reader: what a file written by gguf's own writer says, in either byte order."""

import numpy as np
import pytest
from gguf import GGUFEndian, GGUFWriter

from serving.gguf_info import InvalidModelFile, SkippedArray, read_gguf, read_header, read_tokens

TOKENS = [f"tok{index}".encode() for index in range(5000)] + ["你好".encode()]


def _write(path, endianess: GGUFEndian) -> None:
    writer = GGUFWriter(path, "llama", endianess=endianess)
    writer.add_context_length(4096)
    writer.add_block_count(2)
    writer.add_embedding_length(64)
    writer.add_head_count([4, 8])  # per layer
    writer.add_head_count_kv(2)
    writer.add_chat_template("{{ messages }}")
    writer.add_token_list(TOKENS)
    writer.add_token_scores([0.5] * len(TOKENS))
    writer.add_add_bos_token(True)
    writer.add_tensor("token_embd.weight", np.zeros((len(TOKENS), 64), dtype=np.float32))
    writer.add_tensor("output_norm.weight", np.zeros(64, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


@pytest.mark.parametrize("endianess", [GGUFEndian.LITTLE, GGUFEndian.BIG], ids=["little-endian", "big-endian"])
def test_a_header_reads_the_same_in_either_byte_order(tmp_path, endianess):
    path = tmp_path / f"{endianess.name}.gguf"
    _write(path, endianess)

    fields = read_header(path).fields
    info = read_gguf(path)

    assert (info.family, info.context_length, info.chat_template) == ("llama", 4096, "{{ messages }}")
    assert info.parameter_count == len(TOKENS) * 64 + 64
    # Two layers of 2 KV heads, keys and values of 64 / 4 = 16 each, two bytes a number.
    assert info.kv_bytes_per_token == 2 * 2 * (16 + 16) * 2
    assert fields["llama.attention.head_count"] == [4, 8] and fields["tokenizer.ggml.add_bos_token"] is True
    assert isinstance(fields["tokenizer.ggml.scores"], SkippedArray) and len(fields["tokenizer.ggml.scores"]) == 5001
    assert read_tokens(path) == tuple(TOKENS)


def test_a_file_cut_inside_its_vocabulary_is_refused_with_the_reason(tmp_path):
    whole = tmp_path / "whole.gguf"
    _write(whole, GGUFEndian.LITTLE)
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(whole.read_bytes()[:20_000])

    with pytest.raises(InvalidModelFile, match="cut.gguf is not a readable GGUF file: .* past the end of the file"):
        read_gguf(cut)
