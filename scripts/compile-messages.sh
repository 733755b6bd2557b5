#!/usr/bin/env bash
# Compiles the GUI's translation catalogues (locale/*/LC_MESSAGES/*.po) into the .mo files Django reads; called by
# `scripts/proc.sh setup` and `make test`. The venv is skipped: its packages ship their catalogues compiled.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/python ] && export PATH="$PWD/.venv/bin:$PATH"
DJANGO_SETTINGS_MODULE=factory.settings python -m django compilemessages \
  --ignore '.venv' --ignore 'data' --ignore 'node_modules' --ignore '.git' --verbosity 0
