#!/usr/bin/env bash
# make stop: stops exactly the processes make run started, by their recorded PIDs.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/procs.lib.sh
# Engine replicas run in their own sessions (they outlive worker restarts), so they are stopped by their
# recorded PIDs before the worker and redis go.
# shellcheck disable=SC1091
[ -f .run/env ] && source .run/env
[ -x .venv/bin/python ] && .venv/bin/python manage.py stop_engines
for name in web beat interactive worker node redis; do
  stop_proc "$name"
done
