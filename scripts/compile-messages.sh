#!/usr/bin/env bash
# Compiles the GUI's translation catalogues (locale/*/LC_MESSAGES/*.po) into the .mo files Django reads; called by
# `scripts/proc.sh setup` and `make test`. The venv is skipped: its packages ship their catalogues compiled.
set -euo pipefail
cd "$(dirname "$0")/.."
# Nothing to do when every .mo is newer than its .po: a release installed from a bundle (README "Appliance") has them
# compiled, and neither msgfmt nor a writable tree.
stale=$(find locale -name '*.po' | while read -r po; do [ "${po%.po}.mo" -nt "$po" ] || echo "$po"; done)
[ -n "$stale" ] || exit 0
[ -x .venv/bin/python ] && export PATH="$PWD/.venv/bin:$PATH"
DJANGO_SETTINGS_MODULE=factory.settings python -m django compilemessages \
  --ignore '.venv' --ignore 'data' --ignore 'node_modules' --ignore '.git' --verbosity 0
