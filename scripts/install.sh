#!/usr/bin/env bash
# Creates .venv and installs the pinned dependency set. A re-run does nothing unless pyproject.toml or the
# constraints changed. llama-cpp-python compiles from source once; its wheel is kept outside the clone
# (FACTORY_WHEEL_CACHE) so that every later venv and CI run on this machine reuses it.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3.11}
WHEEL_CACHE=${FACTORY_WHEEL_CACHE:-$HOME/.cache/aifactory/wheels}
CONSTRAINTS=requirements/constraints.txt
stamp=".venv/.installed-$(cat pyproject.toml "$CONSTRAINTS" | sha256sum | cut -c1-16)"

if [ -f "$stamp" ]; then
  exit 0
fi
command -v "$PYTHON" >/dev/null || { echo "error: $PYTHON not found; AI Factory needs Python 3.11." >&2; exit 1; }
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv

llama_version=$(grep -iE '^llama[-_]cpp[-_]python==' "$CONSTRAINTS" | cut -d= -f3)
mkdir -p "$WHEEL_CACHE"
if ! ls "$WHEEL_CACHE"/llama_cpp_python-"$llama_version"-*.whl >/dev/null 2>&1; then
  echo "==> Compiling llama-cpp-python $llama_version once (about 10-20 minutes on 2 cores); cached in $WHEEL_CACHE"
  # The multimodal library is not used; skipping it saves build time.
  CMAKE_ARGS="${CMAKE_ARGS:--DLLAVA_BUILD=OFF}" CMAKE_BUILD_PARALLEL_LEVEL=$(nproc) \
    .venv/bin/pip wheel --no-deps "llama-cpp-python==$llama_version" -w "$WHEEL_CACHE"
fi

echo "==> Installing Python dependencies into .venv"
.venv/bin/pip install --quiet --disable-pip-version-check --find-links "$WHEEL_CACHE" \
  -c "$CONSTRAINTS" -e ".[test]"
rm -f .venv/.installed-*
touch "$stamp"
