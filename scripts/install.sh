#!/usr/bin/env bash
# Creates .venv and installs the pinned dependency set. A re-run does nothing unless pyproject.toml or the
# constraints changed, or the llama.cpp tools went missing.
# llama.cpp compiles from source once (scripts/build-llama.sh): llama-server, llama-quantize and the shared libraries,
# cached outside the clone (FACTORY_CACHE_DIR) so that every later venv and CI run on this machine reuses them.
# llama-cpp-python's wheel is then built without a llama.cpp of its own (seconds), kept beside those libraries, and
# loads them.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3.11}
CACHE=${FACTORY_CACHE_DIR:-$HOME/.cache/aifactory}
CONSTRAINTS=requirements/constraints.txt
stamp=".venv/.installed-$(cat pyproject.toml "$CONSTRAINTS" scripts/build-llama.sh | sha256sum | cut -c1-16)"

installed() { [ -f "$stamp" ] && [ -x .venv/bin/llama-server ] && [ -x .venv/bin/llama-quantize ]; }
installed && exit 0
# One install at a time: `make run` and `make test` started together must not run pip over each other.
mkdir -p .venv
exec 9>.venv/.install.lock
flock 9
installed && exit 0
command -v "$PYTHON" >/dev/null || { echo "error: $PYTHON not found; AI Factory needs Python 3.11." >&2; exit 1; }
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv

llama=$(FACTORY_CACHE_DIR="$CACHE" scripts/build-llama.sh .venv/bin/python | tail -n 1)
llama_version=$(grep -iE '^llama[-_]cpp[-_]python==' "$CONSTRAINTS" | cut -d= -f3)
wheels="$llama/wheel"
if ! ls "$wheels"/llama_cpp_python-"$llama_version"-*.whl >/dev/null 2>&1; then
  echo "==> Building the llama-cpp-python $llama_version wheel (Python only; it loads the libraries built above)"
  CMAKE_ARGS="-DLLAMA_BUILD=OFF -DLLAVA_BUILD=OFF" .venv/bin/pip wheel --quiet --disable-pip-version-check \
    --no-deps "$CACHE/llama.cpp/sdist/llama_cpp_python-$llama_version.tar.gz" -w "$wheels"
fi

echo "==> Installing Python dependencies into .venv"
.venv/bin/pip install --quiet --disable-pip-version-check --find-links "$wheels" \
  -c "$CONSTRAINTS" -e ".[test,ray]"

# The tools go beside the venv's python, where serving/engines/llamacpp.py looks for them; the libraries go where
# llama-cpp-python loads its own from.
ln -sf "$llama/bin/llama-server" "$llama/bin/llama-quantize" .venv/bin/
package_lib=$(.venv/bin/python -c 'import importlib.util, pathlib; print(pathlib.Path(importlib.util.find_spec("llama_cpp").origin).parent / "lib")')
mkdir -p "$package_lib"
cp -P "$llama/lib/"*.so* "$package_lib/"
rm -f .venv/.installed-*
touch "$stamp"
