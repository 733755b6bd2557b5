"""Loading a job's base model. A GGUF base is de-quantized into a Hugging Face directory (weights, config and
tokenizer) once per file version, under the node's `converted_bases_dir` (the spec names it): transformers takes
15-20 s to read a GGUF (it de-quantizes every tensor in Python and rebuilds the tokenizer from the vocabulary), which
a job would otherwise pay when it trains, again when it resumes and again when it merges; the directory loads in
about a second."""

import hashlib
import os
import shutil
from pathlib import Path


def plain_copy(model, dtype):
    """A model read from a GGUF keeps the file's quantization settings in its config (and transformers then
    refuses to train or save it), though its weights are plain tensors: the same weights in a model built from a
    clean config."""
    from transformers import AutoModelForCausalLM

    config = model.config
    if getattr(config, "quantization_config", None) is None:
        return model
    del config.quantization_config
    plain = AutoModelForCausalLM.from_config(config, dtype=dtype)
    plain.load_state_dict(model.state_dict(), strict=False)
    plain.tie_weights()
    return plain


def _read_gguf(path: Path, dtype):
    from transformers import AutoModelForCausalLM

    return plain_copy(AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=dtype), dtype)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _key(gguf: Path) -> str:
    stat = gguf.stat()
    return hashlib.sha256(f"{gguf.resolve()}\0{stat.st_size}\0{stat.st_mtime_ns}".encode()).hexdigest()[:32]


def _published(target: Path, write) -> Path:
    """`target`, written by `write(scratch)` into a scratch directory and renamed into place unless it is there
    already: a process killed meanwhile leaves nothing a later one would trust (its scratch is removed by the next
    one), and two processes writing the same target at once both succeed, one copy staying."""
    if target.is_dir():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    for stale in target.parent.glob(f".{target.name}-*"):
        if not _alive(int(stale.name.rsplit("-", 1)[1])):
            shutil.rmtree(stale, ignore_errors=True)
    scratch = target.parent / f".{target.name}-{os.getpid()}"
    shutil.rmtree(scratch, ignore_errors=True)
    write(scratch)
    try:
        scratch.rename(target)
    except OSError:  # written by another process meanwhile
        shutil.rmtree(scratch, ignore_errors=True)
    return target


def _gguf_tokenizer(gguf: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)


def converted(gguf: Path, bases_dir: Path) -> Path:
    """The GGUF base as a Hugging Face directory (weights and tokenizer), converted now if no job on this node
    did it before."""
    import torch

    def write(scratch: Path) -> None:
        _read_gguf(gguf, torch.float32).save_pretrained(scratch)
        if not (scratch / "config.json").exists():
            # transformers saves a model only on rank 0 of a torch.distributed group; a directory without it
            # would be taken for the converted base by every later job.
            raise RuntimeError(f"{gguf.name} could not be converted in this process (a data-parallel rank other "
                               f"than 0); the job's own process converts it before its workers start.")
        _gguf_tokenizer(gguf).save_pretrained(scratch)

    return _published(bases_dir / _key(gguf), write)


def tokenizer_location(path: Path, bases_dir: Path) -> Path:
    """Where the tokenizer of the model at `path` loads in a fraction of a second: a Hugging Face directory as it
    is; for a GGUF (3-10 s to rebuild its tokenizer from the vocabulary), its converted base, or else its tokenizer
    alone, converted once."""
    if not path.is_file():
        return path
    key = _key(path)
    if (bases_dir / key).is_dir():
        return bases_dir / key
    return _published(bases_dir / f"{key}-tokenizer", lambda scratch: _gguf_tokenizer(path).save_pretrained(scratch))


def base_location(spec: dict, key: str = "base_path") -> Path:
    """Where the model at `spec[key]` loads from: a GGUF in its converted form when the spec names where those go."""
    path = Path(spec[key])
    if path.is_file() and spec.get("converted_bases_dir"):
        return converted(path, Path(spec["converted_bases_dir"]))
    return path


def tokenizer_source(spec: dict, key: str = "tokenizer_path") -> Path:
    """Where the tokenizer of the model at `spec[key]` loads from, converting no weights for it."""
    path = Path(spec[key])
    if spec.get("converted_bases_dir"):
        return tokenizer_location(path, Path(spec["converted_bases_dir"]))
    return path


def load_base(spec: dict, dtype=None, key: str = "base_path"):
    import torch
    from transformers import AutoModelForCausalLM

    dtype = dtype or (torch.bfloat16 if torch.cuda.is_available() else torch.float32)
    path = base_location(spec, key)
    if path.is_file():
        return _read_gguf(path, dtype)
    return AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype)
