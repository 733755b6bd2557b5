#!/usr/bin/env bash
# make stop: stops exactly the processes make run started, by their recorded PIDs, and says what it stopped and what
# was already gone. It needs neither the database, Redis nor a readable secret: a part that fails is reported and
# the rest is still stopped.
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/procs.lib.sh
# shellcheck disable=SC1091
[ -f .run/env ] && source .run/env
status=0
# First whatever may start an engine (beat's replica checks, the node worker's start jobs), so that none starts
# after the engines are stopped.
for name in web beat node; do
  stop_proc "$name" || status=1
done
# Engine replicas run in their own sessions (they outlive worker restarts), so they are stopped by the PIDs they
# were launched with (data dir's engines/launched/), while redis and the database are still there to record it.
if [ -x .venv/bin/python ]; then
  .venv/bin/python manage.py stop_engines || { echo "warning: stop_engines failed; stopping engines by PID" >&2
    stop_launched_engines "${FACTORY_DATA_DIR:-data}"; status=1; }
fi
for name in interactive worker redis; do
  stop_proc "$name" || status=1
done
exit "$status"
