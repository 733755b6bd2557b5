#!/usr/bin/env bash
# Re-resolves pyproject.toml's dependencies in a scratch venv and pins the result in requirements/constraints.txt.
set -euo pipefail
cd "$(dirname "$0")/.."
# Resolved on Debian's own Python where there is one (3.11.2 on Debian 12): the appliance installs onto it (make
# bundle), and a set resolved on a later 3.11 can hold releases that refuse it (soupsieve 3 and later want 3.11.5).
debian_python=/usr/bin/python3.11
PYTHON=${PYTHON:-$([ -x "$debian_python" ] && echo "$debian_python" || echo python3.11)}
# llama-cpp-python's wheel from the last install (scripts/install.sh), so that resolving does not compile it again.
wheels=$(ls -d "${FACTORY_CACHE_DIR:-$HOME/.cache/aifactory}"/llama.cpp/*/wheel 2>/dev/null | tail -n 1)
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
"$PYTHON" -m venv "$scratch/venv"
"$scratch/venv/bin/pip" install --quiet ${wheels:+--find-links "$wheels"} -e ".[test]"
{
  echo "# The resolved dependency set, installed with: pip install -c requirements/constraints.txt -e .[test]"
  echo "# Regenerate after changing pyproject.toml: make lock"
  "$scratch/venv/bin/pip" freeze --exclude-editable | grep -v '^ai-factory'
} >requirements/constraints.txt
echo "Pinned $(grep -vc '^#' requirements/constraints.txt) packages in requirements/constraints.txt"
