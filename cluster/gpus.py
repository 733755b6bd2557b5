"""NVIDIA GPUs as the install sees them: what `nvidia-smi` lists, which CUDA the driver runs, and what to build and
install for them. Standard library only: scripts/install.sh runs it with the system Python, before the venv exists.

    python3 -m cluster.gpus shell     shell assignments for scripts/gpu.sh (no GPU, or no nvidia-smi: gpu_count=0)

On a node with NVIDIA GPUs the install puts a CUDA build of torch in the venv (the wheel index of the newest CUDA
variant the driver runs, TORCH_CUDA_VARIANTS) and builds llama.cpp for the GPUs' architectures (their compute
capabilities, 9.0 -> 90). Anything else is the CPU install, unchanged. FACTORY_GPU=off installs the CPU path on
any machine; FACTORY_TORCH_CUDA names the torch variant (cu128, ...) instead of choosing one.
"""

import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass

QUERY = ["--query-gpu=index,name,memory.total,uuid,compute_cap", "--format=csv,noheader,nounits"]
# The CUDA variants of the pinned torch on download.pytorch.org, newest first: a driver runs a variant whose CUDA
# version is no newer than its own (nvidia-smi's "CUDA Version").
TORCH_CUDA_VARIANTS = ("cu130", "cu129", "cu128", "cu126")
TORCH_INDEX = "https://download.pytorch.org/whl/{variant}"


@dataclass(frozen=True)
class Gpu:
    index: int
    name: str
    memory_mib: int
    uuid: str
    compute_capability: str  # "9.0"; "" when the driver does not report it


def parse_query(csv_text: str) -> list[Gpu]:
    """`nvidia-smi --query-gpu=index,name,memory.total,uuid,compute_cap --format=csv,noheader,nounits`, one GPU a
    line. Names may hold commas; a field the driver cannot read is "[N/A]"."""
    gpus = []
    for line in csv_text.strip().splitlines():
        parts = [part.strip() for part in line.split(",")]
        if len(parts) < 5:
            continue
        index, name, memory, uuid, capability = parts[0], ", ".join(parts[1:-3]), *parts[-3:]
        gpus.append(Gpu(index=int(index), name=name, memory_mib=int(float(memory)) if memory[:1].isdigit() else 0,
                        uuid=uuid, compute_capability=capability if re.fullmatch(r"\d+\.\d+", capability) else ""))
    return gpus


def driver_cuda_version(banner: str) -> str:
    """The CUDA version the driver runs, from `nvidia-smi`'s banner ("CUDA Version: 13.0") or from
    `nvidia-smi --version` ("CUDA Version : 13.0"); "" when absent."""
    found = re.search(r"CUDA Version\s*:\s*(\d+\.\d+)", banner)
    return found.group(1) if found else ""


def architectures(gpus: list[Gpu]) -> str:
    """CMAKE_CUDA_ARCHITECTURES for these GPUs: each compute capability once, as CMake spells it (9.0 -> 90,
    8.6 -> 86), in ascending order, ';'-separated."""
    found = {int(gpu.compute_capability.replace(".", "")) for gpu in gpus if gpu.compute_capability}
    return ";".join(str(arch) for arch in sorted(found))


def _cuda_tuple(version: str) -> tuple[int, int]:
    major, minor = (version.split(".") + ["0"])[:2]
    return int(major), int(minor)


def torch_variant(driver_cuda: str, variants: tuple[str, ...] = TORCH_CUDA_VARIANTS) -> str:
    """The newest torch CUDA variant the driver runs ("cu130" for CUDA 13.0, "cu128" for 12.8 and 12.9 when there
    is no cu129); "" when the driver is older than every variant."""
    if not driver_cuda:
        return ""
    driver = _cuda_tuple(driver_cuda)
    for variant in variants:
        digits = variant.removeprefix("cu")
        if (int(digits[:-1]), int(digits[-1])) <= driver:
            return variant
    return ""


@dataclass(frozen=True)
class Plan:
    gpus: list[Gpu]
    driver_cuda: str
    torch_variant: str
    archs: str
    problem: str = ""

    def shell(self) -> str:
        values = {
            "gpu_count": str(len(self.gpus)),
            "gpu_names": "; ".join(gpu.name for gpu in self.gpus),
            "gpu_driver_cuda": self.driver_cuda,
            "gpu_archs": self.archs,
            "torch_cuda": self.torch_variant,
            "torch_index": TORCH_INDEX.format(variant=self.torch_variant) if self.torch_variant else "",
            "gpu_problem": self.problem,
        }
        return "".join(f"{name}={shlex.quote(value)}\n" for name, value in values.items())


def _run(binary: str, *args: str) -> str:
    done = subprocess.run([binary, *args], capture_output=True, text=True, timeout=60)
    if done.returncode != 0:
        raise OSError((done.stderr or done.stdout).strip() or f"exit status {done.returncode}")
    return done.stdout


def plan(environ=os.environ) -> Plan:
    """What this machine's install should be: no GPUs (the CPU install) unless nvidia-smi lists some."""
    binary = shutil.which("nvidia-smi")
    if environ.get("FACTORY_GPU", "auto") == "off" or binary is None:
        return Plan(gpus=[], driver_cuda="", torch_variant="", archs="")
    try:
        gpus = parse_query(_run(binary, *QUERY))
        driver = driver_cuda_version(_run(binary)) if gpus else ""
    except (OSError, subprocess.TimeoutExpired) as exc:
        # A driver that does not answer: the node installs and serves on its CPUs, and says why.
        return Plan(gpus=[], driver_cuda="", torch_variant="", archs="", problem=f"nvidia-smi failed: {exc}")
    if not gpus:
        return Plan(gpus=[], driver_cuda="", torch_variant="", archs="")
    variant = environ.get("FACTORY_TORCH_CUDA") or torch_variant(driver)
    problem = "" if variant else (f"the driver's CUDA {driver or '(unknown)'} is older than every CUDA build of "
                                  f"torch this install knows ({', '.join(TORCH_CUDA_VARIANTS)}); update the driver "
                                  f"or set FACTORY_TORCH_CUDA")
    return Plan(gpus=gpus, driver_cuda=driver, torch_variant=variant, archs=architectures(gpus), problem=problem)


def main(argv: list[str]) -> int:
    if argv[1:] != ["shell"]:
        print("usage: python3 -m cluster.gpus shell", file=sys.stderr)
        return 2
    sys.stdout.write(plan().shell())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
