#!/usr/bin/env bash
# Vendors the GUI's browser libraries (package.json, pinned by package-lock.json) into static/vendor/, which the
# web server serves: the GUI loads nothing from a CDN. `npm ci` runs in a cache outside the clone (no node_modules
# here) with install scripts off; a re-run does nothing while the lock file is unchanged. Called by
# scripts/install.sh; `make bundle` ships static/vendor/, so an appliance install needs neither npm nor a network.
set -euo pipefail
cd "$(dirname "$0")/.."

CACHE=${FACTORY_CACHE_DIR:-$HOME/.cache/aifactory}
key=$(cat package.json package-lock.json scripts/vendor-js.sh | sha256sum | cut -c1-16)
stamp="static/vendor/.vendored-$key"
[ -f "$stamp" ] && exit 0
# `make run` and `make test` started together must not replace static/vendor/ under each other.
mkdir -p "$CACHE"
exec 9>"$CACHE/vendor-js.lock"
flock 9
[ -f "$stamp" ] && exit 0
command -v npm >/dev/null || scripts/system-deps.sh npm
work="$CACHE/npm/$key"
if [ ! -f "$work/.done" ]; then
  echo "==> Vendoring the GUI's JavaScript libraries (npm ci, lock file $key)"
  rm -rf "$work" && mkdir -p "$work"
  cp package.json package-lock.json "$work/"
  (cd "$work" && npm ci --ignore-scripts --no-audit --no-fund --loglevel=error >/dev/null)
  touch "$work/.done"
fi
# Each library's distributed files and its licence, under static/vendor/<name>/.
rm -rf static/vendor && mkdir -p static/vendor/drawflow
cp "$work/node_modules/drawflow/dist/drawflow.min.js" "$work/node_modules/drawflow/dist/drawflow.min.css" \
  "$work/node_modules/drawflow/LICENSE" static/vendor/drawflow/
touch "$stamp"
