"""A node's install on NVIDIA GPUs, tested without one: the machine is described by what nvidia-smi and nvcc print
(recorded in their real formats) and by fake stand-ins for them, and for cmake, on PATH. No GPU exists where these
tests run, and nothing here downloads or compiles: the fakes stand in for the hardware and the toolchain, and the
tests check what the install decides (which torch, which llama.cpp build, cached where) and that a machine
without GPUs installs exactly as before."""

import hashlib
import os
import shutil
import stat
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from cluster import gpus, inventory
from tests.conftest import ROOT

# `nvidia-smi --query-gpu=index,name,memory.total,uuid,compute_cap --format=csv,noheader,nounits`, as the driver
# prints it on one H200, and on a mixed box.
H200_QUERY = "0, NVIDIA H200, 143771, GPU-3b1f3f1c-6a0e-8d2c-47c5-0f0e9d3c2b1a, 9.0\n"
MIXED_QUERY = """\
0, NVIDIA A100-SXM4-80GB, 81920, GPU-6d1e7b0a-2f4c-11ee-9c3d-0242ac120002, 8.0
1, NVIDIA A100-SXM4-80GB, 81920, GPU-6d1e7b0a-2f4c-11ee-9c3d-0242ac120003, 8.0
2, NVIDIA L4, 23034, GPU-9a8b7c6d-5e4f-3a2b-1c0d-e9f8a7b6c5d4, 8.9
"""
# The banner of a plain `nvidia-smi` (driver 580), and `nvidia-smi --version`.
BANNER = """\
Thu Nov 27 08:10:11 2026
+-----------------------------------------------------------------------------------------+
| NVIDIA-SMI 580.95.05              Driver Version: 580.95.05      CUDA Version: 13.0     |
+-----------------------------------------+------------------------+----------------------+
| GPU  Name                 Persistence-M | Bus-Id          Disp.A | Volatile Uncorr. ECC |
| Fan  Temp   Perf          Pwr:Usage/Cap |           Memory-Usage | GPU-Util  Compute M. |
|                                         |                        |               MIG M. |
|=========================================+========================+======================|
|   0  NVIDIA H200                    On  |   00000000:19:00.0 Off |                    0 |
| N/A   31C    P0             75W /  700W |       0MiB / 143771MiB |      0%      Default |
|                                         |                        |             Disabled |
+-----------------------------------------+------------------------+----------------------+
"""
VERSION = """\
NVIDIA-SMI version  : 580.95.05
NVML version        : 580.95
DRIVER version      : 580.95.05
CUDA Version        : 13.0
"""
# `nvcc --version` of the CUDA 13.0 toolkit.
NVCC_VERSION = """\
nvcc: NVIDIA (R) Cuda compiler driver
Copyright (c) 2005-2025 NVIDIA Corporation
Built on Wed_Aug_20_01:58:59_PM_PDT_2025
Cuda compilation tools, release 13.0, V13.0.88
Build cuda_13.0.r13.0/compiler.36424714_0
"""
LLAMA_VERSION = next(line.split("==")[1].strip() for line in (ROOT / "requirements/constraints.txt").read_text()
                     .splitlines() if line.lower().startswith("llama_cpp_python==")
                     or line.lower().startswith("llama-cpp-python=="))
# scripts/build-llama.sh's CMake options on a CPU, as they were before GPU nodes: a CPU build must stay this one.
CPU_CMAKE_OPTIONS = [
    "-DCMAKE_BUILD_TYPE=Release", "-DBUILD_SHARED_LIBS=ON",
    "-DCMAKE_C_FLAGS=-mno-amx-tile -mno-amx-int8 -mno-amx-bf16",
    "-DCMAKE_CXX_FLAGS=-mno-amx-tile -mno-amx-int8 -mno-amx-bf16",
    "-DCMAKE_BUILD_WITH_INSTALL_RPATH=ON", "-DCMAKE_INSTALL_RPATH=$ORIGIN/../lib",
    "-DLLAMA_CURL=OFF", "-DLLAMA_OPENSSL=OFF", "-DLLAMA_BUILD_UI=OFF", "-DLLAMA_USE_PREBUILT_UI=OFF",
    "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_BUILD_TOOLS=ON", "-DLLAMA_BUILD_SERVER=ON",
    "-DLLAMA_BUILD_APP=OFF"]


def test_gpus_their_architectures_and_the_drivers_cuda_are_read_from_nvidia_smi():
    [h200] = gpus.parse_query(H200_QUERY)
    assert (h200.index, h200.name, h200.memory_mib, h200.compute_capability) == (0, "NVIDIA H200", 143771, "9.0")
    mixed = gpus.parse_query(MIXED_QUERY)
    assert [g.name for g in mixed] == ["NVIDIA A100-SXM4-80GB"] * 2 + ["NVIDIA L4"]
    assert gpus.architectures(mixed) == "80;89" and gpus.architectures([h200]) == "90"
    # A name with a comma, and a driver too old to report the compute capability.
    [odd] = gpus.parse_query("3, Tesla V100, SXM2, 32510, GPU-1, [N/A]\n")
    assert (odd.name, odd.memory_mib, odd.compute_capability) == ("Tesla V100, SXM2", 32510, "")
    assert gpus.driver_cuda_version(BANNER) == gpus.driver_cuda_version(VERSION) == "13.0"
    assert gpus.driver_cuda_version("NVIDIA-SMI has failed") == ""


@pytest.mark.parametrize("driver, variant", [("13.0", "cu130"), ("13.2", "cu130"), ("12.9", "cu129"),
                                             ("12.8", "cu128"), ("12.7", "cu126"), ("12.4", ""), ("", "")])
def test_torch_is_the_newest_cuda_build_the_driver_runs(driver, variant):
    assert gpus.torch_variant(driver) == variant


def executable(path: Path, text: str) -> Path:
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path


def fake_nvidia_smi(directory: Path, query: str = H200_QUERY, banner: str = BANNER) -> None:
    """A stand-in for nvidia-smi that prints what the real one printed on a GPU machine."""
    (directory / "query.txt").write_text(query)
    (directory / "banner.txt").write_text(banner)
    executable(directory / "nvidia-smi", f"""#!/bin/sh
case "$1" in --query-gpu=*) cat "{directory}/query.txt" ;; *) cat "{directory}/banner.txt" ;; esac
""")


def fake_nvcc(directory: Path) -> Path:
    (directory / "nvcc.txt").write_text(NVCC_VERSION)
    return executable(directory / "nvcc", f"#!/bin/sh\ncat '{directory}/nvcc.txt'\n")


def gpu_plan(tmp_path: Path, *, fakes: list[str], env: dict | None = None) -> dict:
    """scripts/gpu.sh's decisions on a machine whose PATH holds only `fakes` and a few tools (no real nvidia-smi,
    nvcc or CUDA can leak in)."""
    tools, fake = tmp_path / "tools", tmp_path / "fake"
    for directory in (tools, fake):
        directory.mkdir(exist_ok=True)
    for tool in ("sed", "cat", "sha256sum", "cut"):
        if not (tools / tool).exists():
            (tools / tool).symlink_to(subprocess.run(["sh", "-c", f"command -v {tool}"], capture_output=True,
                                                     text=True, check=True).stdout.strip())
    if "nvidia-smi" in fakes:
        fake_nvidia_smi(fake)
    if "nvcc" in fakes:
        fake_nvcc(fake)
    script = """
source scripts/gpu.sh
gpu_detect
constraints=$(gpu_constraints requirements/constraints.txt "$OUT/constraints.txt")
key=$( { cat pyproject.toml requirements/constraints.txt scripts/build-llama.sh; gpu_install_key; } | sha256sum)
for name in gpu_count gpu_names gpu_archs gpu_driver_cuda torch_cuda torch_index llama_cuda_archs nvcc constraints \\
    key; do
  printf '%s=%s\\n' "$name" "${!name}"
done
"""
    done = subprocess.run([shutil.which("bash"), "-c", script], cwd=ROOT, capture_output=True, text=True,
                          timeout=60, env={"PATH": f"{fake}:{tools}", "PYTHON": sys.executable, "OUT": str(tmp_path),
                                           "HOME": str(tmp_path), "CUDA_HOME": str(tmp_path / "no-cuda-here"),
                                           **(env or {})})
    assert done.returncode == 0, done.stderr
    values = dict(line.split("=", 1) for line in done.stdout.splitlines())
    values["warnings"] = done.stderr
    return values


def old_stamp() -> str:
    """install.sh's stamp as it was before GPU nodes."""
    digest = hashlib.sha256()
    for name in ("pyproject.toml", "requirements/constraints.txt", "scripts/build-llama.sh"):
        digest.update((ROOT / name).read_bytes())
    return f"{digest.hexdigest()}  -"


def test_a_machine_without_gpus_installs_exactly_as_before(tmp_path):
    plan = gpu_plan(tmp_path, fakes=["nvcc"])
    assert (plan["gpu_count"], plan["torch_cuda"], plan["llama_cuda_archs"]) == ("0", "", "")
    # The pinned set itself (torch's CPU build), and the stamp a CPU install always had: nothing reinstalls.
    assert plan["constraints"] == "requirements/constraints.txt"
    assert plan["key"] == old_stamp()
    assert plan["warnings"] == ""


def test_a_gpu_node_installs_cuda_torch_for_its_driver_and_builds_llama_cpp_for_its_gpus(tmp_path):
    plan = gpu_plan(tmp_path, fakes=["nvidia-smi", "nvcc"])
    assert (plan["gpu_count"], plan["gpu_names"], plan["gpu_driver_cuda"]) == ("1", "NVIDIA H200", "13.0")
    assert (plan["torch_cuda"], plan["torch_index"]) == ("cu130", "https://download.pytorch.org/whl/cu130")
    assert (plan["llama_cuda_archs"], plan["nvcc"]) == ("90", str(tmp_path / "fake" / "nvcc"))
    pinned = (ROOT / "requirements/constraints.txt").read_text().splitlines()
    installed = Path(plan["constraints"]).read_text().splitlines()
    torch_pin = next(line for line in pinned if line.startswith("torch=="))
    assert torch_pin.endswith("+cpu")
    # Only torch's build changes: the same release, for CUDA 13.0.
    assert [line for line in installed if line not in pinned] == [torch_pin.replace("+cpu", "+cu130")]
    assert len(installed) == len(pinned)
    assert plan["key"] != old_stamp() and plan["warnings"] == ""


def test_a_gpu_node_without_the_cuda_toolkit_trains_on_cuda_and_says_llama_cpp_stays_on_the_cpu(tmp_path):
    plan = gpu_plan(tmp_path, fakes=["nvidia-smi"])
    assert (plan["torch_cuda"], plan["llama_cuda_archs"]) == ("cu130", "")
    assert "no CUDA toolkit (nvcc)" in plan["warnings"]


def test_an_old_driver_or_gpu_off_installs_for_the_cpu(tmp_path):
    fake = tmp_path / "fake"
    fake.mkdir()
    fake_nvidia_smi(fake, banner=BANNER.replace("CUDA Version: 13.0", "CUDA Version: 11.8"))
    old = gpu_plan(tmp_path, fakes=["nvcc"])
    assert (old["gpu_count"], old["torch_cuda"], old["llama_cuda_archs"]) == ("1", "", "")
    assert old["constraints"] == "requirements/constraints.txt"
    assert "older than every CUDA build of torch" in old["warnings"]

    fake_nvidia_smi(fake)
    off = gpu_plan(tmp_path, fakes=["nvcc"], env={"FACTORY_GPU": "off"})
    assert (off["gpu_count"], off["constraints"], off["key"]) == ("0", "requirements/constraints.txt", old_stamp())


class FakeToolchain:
    """cmake, c++ and nvcc stand-ins on PATH: cmake records its configure arguments and 'builds' the two tools and
    the shared libraries a real build leaves (libggml-cuda.so when CUDA is on), in an instant."""

    def __init__(self, directory: Path):
        self.bin = directory / "bin"
        self.bin.mkdir(parents=True)
        self.configured = directory / "configured.txt"
        executable(self.bin / "c++", "#!/bin/sh\nexit 0\n")
        self.nvcc = fake_nvcc(self.bin)
        executable(self.bin / "cmake", f"""#!/usr/bin/env bash
if [ "$1" = "--build" ]; then
  mkdir -p "$2/bin"
  for tool in llama-server llama-quantize; do printf '#!/bin/sh\\n' >"$2/bin/$tool"; chmod +x "$2/bin/$tool"; done
  touch "$2/bin/libllama.so" "$2/bin/libggml-base.so"
  grep -q '^-DGGML_CUDA=ON$' "$2/args" && touch "$2/bin/libggml-cuda.so"
  exit 0
fi
build="" options=()
while [ $# -gt 0 ]; do
  case "$1" in -S|-G) shift ;; -B) build=$2; shift ;; *) options+=("$1") ;; esac
  shift
done
mkdir -p "$build"
printf '%s\\n' "${{options[@]}}" | tee "$build/args" >>"{self.configured}"
echo "--" >>"{self.configured}"
""")

    def configure_runs(self) -> list[list[str]]:
        text = self.configured.read_text() if self.configured.exists() else ""
        return [chunk.strip().splitlines() for chunk in text.split("--\n") if chunk.strip()]


@pytest.fixture
def llama_cache(tmp_path) -> Path:
    """A cache holding the pinned llama-cpp-python sdist (a stand-in with the vendored llama.cpp directory), so
    that nothing is downloaded."""
    cache = tmp_path / "cache"
    sdist = cache / "llama.cpp" / "sdist"
    sdist.mkdir(parents=True)
    source = tmp_path / f"llama_cpp_python-{LLAMA_VERSION}" / "vendor" / "llama.cpp"
    source.mkdir(parents=True)
    (source / "CMakeLists.txt").write_text("# stand-in\n")
    with tarfile.open(sdist / f"llama_cpp_python-{LLAMA_VERSION}.tar.gz", "w:gz") as archive:
        archive.add(tmp_path / f"llama_cpp_python-{LLAMA_VERSION}", arcname=f"llama_cpp_python-{LLAMA_VERSION}")
    return cache


def build_llama(cache: Path, toolchain: FakeToolchain, **env) -> Path:
    done = subprocess.run(["scripts/build-llama.sh", sys.executable], cwd=ROOT, capture_output=True, text=True,
                          timeout=120, env={**os.environ, "PATH": f"{toolchain.bin}:{os.environ['PATH']}",
                                            "FACTORY_CACHE_DIR": str(cache), **env})
    assert done.returncode == 0, done.stderr
    return Path(done.stdout.strip().splitlines()[-1])


def test_llama_cpp_is_built_for_the_gpus_beside_the_cpu_build_and_each_is_cached(tmp_path, llama_cache):
    toolchain = FakeToolchain(tmp_path / "toolchain")
    env = {key: value for key, value in os.environ.items() if key in ("FACTORY_LLAMA_CUDA_ARCHS", "CUDACXX")}
    assert not env, "the test's own environment must not ask for a CUDA build"

    cpu = build_llama(llama_cache, toolchain)
    assert cpu == llama_cache / "llama.cpp" / LLAMA_VERSION
    assert toolchain.configure_runs()[-1] == CPU_CMAKE_OPTIONS
    assert not inventory.llama_server_has_cuda(cpu / "bin" / "llama-server")

    gpu = build_llama(llama_cache, toolchain, FACTORY_LLAMA_CUDA_ARCHS="90", CUDACXX=str(toolchain.nvcc))
    assert gpu == llama_cache / "llama.cpp" / f"{LLAMA_VERSION}-cuda13.0-sm90"
    assert toolchain.configure_runs()[-1] == CPU_CMAKE_OPTIONS + [
        "-DGGML_CUDA=ON", "-DCMAKE_CUDA_ARCHITECTURES=90", f"-DCMAKE_CUDA_COMPILER={toolchain.nvcc}"]
    assert inventory.llama_server_has_cuda(gpu / "bin" / "llama-server")

    # Both stay cached: running either again builds nothing.
    assert build_llama(llama_cache, toolchain) == cpu
    assert build_llama(llama_cache, toolchain, FACTORY_LLAMA_CUDA_ARCHS="90", CUDACXX=str(toolchain.nvcc)) == gpu
    assert len(toolchain.configure_runs()) == 2
    # Two GPU generations in one node: both architectures, in a cache entry of their own.
    both = build_llama(llama_cache, toolchain, FACTORY_LLAMA_CUDA_ARCHS="80;89", CUDACXX=str(toolchain.nvcc))
    assert both.name == f"{LLAMA_VERSION}-cuda13.0-sm80-89"
    assert "-DCMAKE_CUDA_ARCHITECTURES=80;89" in toolchain.configure_runs()[-1]


def test_the_node_reports_whether_its_llama_server_runs_on_its_gpus(tmp_path):
    prefix = tmp_path / "prefix"
    (prefix / "bin").mkdir(parents=True)
    (prefix / "lib").mkdir()
    server = executable(prefix / "bin" / "llama-server", "#!/bin/sh\n")
    venv_link = tmp_path / "llama-server"
    venv_link.symlink_to(server)  # install.sh links the tools into the venv
    assert not inventory.llama_server_has_cuda(venv_link)
    (prefix / "lib" / "libggml-cuda.so").touch()
    assert inventory.llama_server_has_cuda(venv_link)
