#!/usr/bin/env bash
# Creates .venv and installs the pinned dependency set. A re-run does nothing unless pyproject.toml or the
# constraints changed, or the llama.cpp tools went missing.
# llama.cpp compiles from source once (scripts/build-llama.sh): llama-server, llama-quantize and the shared libraries,
# cached outside the clone (FACTORY_CACHE_DIR) so that every later venv and CI run on this machine reuses them.
# llama-cpp-python's wheel is then built without a llama.cpp of its own (seconds), kept beside those libraries, and
# loads them.
# On a node with NVIDIA GPUs (nvidia-smi lists them; scripts/gpu.sh) torch is the pinned release's CUDA build for the
# driver, and llama.cpp is built for the GPUs' architectures, cached apart under its CUDA version and architectures.
# Without GPUs (or with FACTORY_GPU=off) the install is the CPU one, unchanged.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3.11}
CACHE=${FACTORY_CACHE_DIR:-$HOME/.cache/aifactory}
CONSTRAINTS=requirements/constraints.txt
source scripts/gpu.sh
gpu_detect
stamp=".venv/.installed-$( { cat pyproject.toml "$CONSTRAINTS" scripts/build-llama.sh; gpu_install_key; } \
  | sha256sum | cut -c1-16)"

# The GUI's browser libraries, from package-lock.json into static/vendor/ (nothing to do when they are there).
FACTORY_CACHE_DIR="$CACHE" scripts/vendor-js.sh
installed() { [ -f "$stamp" ] && [ -x .venv/bin/llama-server ] && [ -x .venv/bin/llama-quantize ]; }
installed && exit 0
# One install at a time: `make run` and `make test` started together must not run pip over each other.
mkdir -p .venv
exec 9>.venv/.install.lock
flock 9
installed && exit 0
command -v "$PYTHON" >/dev/null || { echo "error: $PYTHON not found; AI Factory needs Python 3.11." >&2; exit 1; }
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv

# On a GPU node with the CUDA toolkit, llama.cpp is built for the GPUs' architectures (scripts/build-llama.sh); a
# toolkit that cannot build it (no cuBLAS, say) leaves the node serving on its CPUs, with the reason above.
llama=""
if [ -n "$llama_cuda_archs" ]; then
  llama=$(FACTORY_CACHE_DIR="$CACHE" FACTORY_LLAMA_CUDA_ARCHS="$llama_cuda_archs" CUDACXX="$nvcc" \
    scripts/build-llama.sh .venv/bin/python | tail -n 1) || {
    echo "warning: llama.cpp did not build with CUDA ($nvcc); it is built for the CPU, and its deployments run" \
         "there" >&2
    llama=""
  }
fi
[ -n "$llama" ] || llama=$(FACTORY_CACHE_DIR="$CACHE" scripts/build-llama.sh .venv/bin/python | tail -n 1)
llama_version=$(grep -iE '^llama[-_]cpp[-_]python==' "$CONSTRAINTS" | cut -d= -f3)
wheels="$llama/wheel"
if ! ls "$wheels"/llama_cpp_python-"$llama_version"-*.whl >/dev/null 2>&1; then
  echo "==> Building the llama-cpp-python $llama_version wheel (Python only; it loads the libraries built above)"
  CMAKE_ARGS="-DLLAMA_BUILD=OFF -DLLAVA_BUILD=OFF" .venv/bin/pip wheel --quiet --disable-pip-version-check \
    --no-deps "$CACHE/llama.cpp/sdist/llama_cpp_python-$llama_version.tar.gz" -w "$wheels"
fi

echo "==> Installing Python dependencies into .venv"
constraints=$(gpu_constraints "$CONSTRAINTS" .venv/.constraints-gpu.txt)
torch_source=()
if [ -n "$torch_cuda" ]; then
  echo "==> GPU node ($gpu_count: $gpu_names; the driver runs CUDA $gpu_driver_cuda): torch's $torch_cuda build" \
       "from $torch_index"
  torch_source=(--extra-index-url "$torch_index")
fi
.venv/bin/pip install --quiet --disable-pip-version-check --find-links "$wheels" "${torch_source[@]}" \
  -c "$constraints" -e ".[test,ray]"
if [ -n "$torch_cuda" ] && ! .venv/bin/python -c 'import torch, sys; sys.exit(not torch.cuda.is_available())'; then
  echo "warning: torch's $torch_cuda build is installed but sees no GPU; training runs on the CPU" >&2
fi

# The tools go beside the venv's python, where serving/engines/llamacpp.py looks for them; the libraries go where
# llama-cpp-python loads its own from.
ln -sf "$llama/bin/llama-server" "$llama/bin/llama-quantize" .venv/bin/
package_lib=$(.venv/bin/python -c 'import importlib.util, pathlib; print(pathlib.Path(importlib.util.find_spec("llama_cpp").origin).parent / "lib")')
mkdir -p "$package_lib"
cp -P "$llama/lib/"*.so* "$package_lib/"
rm -f .venv/.installed-*
touch "$stamp"
