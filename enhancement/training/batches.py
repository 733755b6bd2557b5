"""Training examples into batches, built once before training so that a step only copies tensors.

Packing (the `packing` setting, on by default): the shipped instruction set averages 54 SmolLM2 tokens a sample,
so a batch padded to its longest sample at a cutoff of 256 was a quarter to a half padding, and a batch of 4 gave
the device about 200 tokens a step. With packing, whole samples are laid end to end in rows of at most `cutoff`
tokens (best fit, longest first: deterministic, so a resumed job sees the same rows), and a micro-batch is that many
rows: about 1,000 tokens a step at batch 4, cutoff 256. Each sample keeps its own positions (0, 1, ... from its
first token) and no attention mask is sent: transformers reads the position restarts as sequence boundaries and
masks attention within each sample alone (masking_utils.find_packed_sequence_indices; only in a forward that builds
no KV cache, so every batch says use_cache=False), and a packed row computes exactly what its samples would one by
one (tests/enhancement/test_training_steps.py compares the logits, for Llama and Gemma 3). The first token of each
sample carries no label, so nothing learns to predict one sample from the end of another.

Without packing, rows are single samples padded to the longest in the batch with an attention mask, as before.

Every batch carries COUNTS, (non-padding tokens, samples), counted here on the CPU: the trainer pops it before the
model sees the batch (run.py), so the tokens/s of a step never needs a device-to-host copy.
"""

import bisect

from enhancement.training.data import IGNORE_INDEX

COUNTS = "factory_counts"


def as_rows(examples: list[dict]) -> list[dict]:
    """One sample a row, as tensors."""
    import torch

    return [{"input_ids": torch.tensor(e["input_ids"], dtype=torch.long),
             "labels": torch.tensor(e["labels"], dtype=torch.long), "samples": 1} for e in examples]


def pack(examples: list[dict], cutoff: int) -> list[dict]:
    """Whole samples in rows of at most `cutoff` tokens: each sample, longest first, goes to the row it fills best
    (best fit decreasing); a row holds its samples in the order they were placed."""
    import torch

    order = sorted(range(len(examples)), key=lambda i: (-len(examples[i]["input_ids"]), i))
    members: list[list[int]] = []
    free: list[tuple[int, int]] = []  # (room left, row), sorted
    for index in order:
        length = len(examples[index]["input_ids"])
        at = bisect.bisect_left(free, (length, -1))
        if at < len(free):
            room, row = free.pop(at)
        else:
            room, row = cutoff, len(members)
            members.append([])
        members[row].append(index)
        if room - length > 0:
            bisect.insort(free, (room - length, row))
    rows = []
    for row in members:
        ids, labels, positions = [], [], []
        for index in row:
            example = examples[index]
            ids += example["input_ids"]
            labels += [IGNORE_INDEX] + list(example["labels"][1:])
            positions += range(len(example["input_ids"]))
        rows.append({"input_ids": torch.tensor(ids, dtype=torch.long),
                     "labels": torch.tensor(labels, dtype=torch.long),
                     "position_ids": torch.tensor(positions, dtype=torch.long), "samples": len(row)})
    return rows


class Collator:
    """Rows into one batch, padded to the longest row: with an attention mask for single samples, with positions
    for packed rows (the padding then counts from 0 again, a sequence of its own that attends only to itself and
    has no labels)."""

    def __init__(self, pad_token_id: int):
        self.pad_token_id = pad_token_id

    def __call__(self, rows: list[dict]) -> dict:
        import torch

        width = max(len(row["input_ids"]) for row in rows)
        ids = torch.full((len(rows), width), self.pad_token_id, dtype=torch.long)
        labels = torch.full((len(rows), width), IGNORE_INDEX, dtype=torch.long)
        packed = "position_ids" in rows[0]
        extra = torch.zeros((len(rows), width), dtype=torch.long)
        tokens = samples = 0
        for index, row in enumerate(rows):
            length = len(row["input_ids"])
            ids[index, :length] = row["input_ids"]
            labels[index, :length] = row["labels"]
            if packed:
                extra[index, :length] = row["position_ids"]
                extra[index, length:] = torch.arange(width - length)
            else:
                extra[index, :length] = 1
            tokens += length
            samples += row["samples"]
        # use_cache: a model that builds a KV cache in its forward (transformers' default, in training too) skips
        # the detection of packed samples, and each would attend to the ones before it in its row.
        return {"input_ids": ids, "labels": labels, "position_ids" if packed else "attention_mask": extra,
                "use_cache": False, COUNTS: (tokens, samples)}
