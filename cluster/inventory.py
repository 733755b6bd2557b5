"""What this machine has: CPU cores, memory and NVIDIA GPUs (read from nvidia-smi when it is installed)."""

import os
import shutil
import socket
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

NVIDIA_SMI_QUERY = ["--query-gpu=index,name,memory.total,uuid", "--format=csv,noheader,nounits"]

# Dense FP16/BF16 tensor TFLOPS from the vendors' data sheets, matched by name, longest pattern first.
KNOWN_GPU_TFLOPS = {
    "H200": 989.0,
    "H100 PCIe": 756.0,
    "H100": 989.0,
    "GH200": 989.0,
    "A100": 312.0,
    "L40S": 362.0,
    "L40": 181.0,
    "L4": 121.0,
    "A10G": 125.0,
    "A10": 125.0,
    "RTX 6000 Ada": 365.0,
    "A6000": 155.0,
    "RTX 4090": 165.0,
    "RTX 3090": 71.0,
    "V100": 125.0,
    "T4": 65.0,
}


@dataclass
class GpuReading:
    index: int
    name: str
    memory_bytes: int
    uuid: str
    compute_tflops: float | None


@dataclass
class Resources:
    hostname: str
    cpu_cores: int
    memory_bytes: int
    memory_available_bytes: int
    load_average: list[float]
    gpus: list[GpuReading] = field(default_factory=list)
    gpu_error: str = ""
    # This node's llama-server was built with CUDA (scripts/build-llama.sh on a GPU node): new llama.cpp
    # deployments on it default to full offload (serving/engines/llamacpp.py).
    llama_cuda: bool = False

    def as_dict(self) -> dict:
        return asdict(self)


def gpu_tflops(name: str) -> float | None:
    for pattern in sorted(KNOWN_GPU_TFLOPS, key=len, reverse=True):
        if pattern.lower() in name.lower():
            return KNOWN_GPU_TFLOPS[pattern]
    return None


def parse_nvidia_smi(csv_text: str) -> list[GpuReading]:
    gpus = []
    for line in csv_text.strip().splitlines():
        index, name, memory_mib, uuid = (part.strip() for part in line.split(",", 3))
        gpus.append(GpuReading(index=int(index), name=name, memory_bytes=int(float(memory_mib)) * 1024 * 1024,
                               uuid=uuid, compute_tflops=gpu_tflops(name)))
    return gpus


def _meminfo() -> dict[str, int]:
    values = {}
    with open("/proc/meminfo") as meminfo:
        for line in meminfo:
            key, rest = line.split(":", 1)
            values[key] = int(rest.split()[0]) * 1024
    return values


def _read_gpus() -> tuple[list[GpuReading], str]:
    binary = shutil.which("nvidia-smi")
    if binary is None:
        return [], ""
    try:
        done = subprocess.run([binary, *NVIDIA_SMI_QUERY], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return [], f"nvidia-smi did not answer: {exc}"
    if done.returncode != 0:
        return [], f"nvidia-smi failed: {done.stderr.strip() or done.stdout.strip()}"
    return parse_nvidia_smi(done.stdout), ""


def llama_server_has_cuda(binary: Path | None = None) -> bool:
    """Whether the llama-server beside this interpreter (else on PATH) was built with CUDA: its build keeps
    ggml's CUDA backend, libggml-cuda.so, in the lib/ beside its bin/."""
    if binary is None:
        beside = Path(sys.executable).parent / "llama-server"
        found = shutil.which("llama-server")
        binary = beside if beside.exists() else Path(found) if found else None
    if binary is None:
        return False
    return any((binary.resolve().parent.parent / "lib").glob("libggml-cuda.so*"))


def probe() -> Resources:
    meminfo = _meminfo()
    gpus, gpu_error = _read_gpus()
    return Resources(
        hostname=socket.gethostname(),
        cpu_cores=os.cpu_count() or 1,
        memory_bytes=meminfo.get("MemTotal", 0),
        memory_available_bytes=meminfo.get("MemAvailable", 0),
        load_average=[round(x, 2) for x in os.getloadavg()],
        gpus=gpus,
        gpu_error=gpu_error,
        llama_cuda=bool(gpus) and llama_server_has_cuda(),
    )
