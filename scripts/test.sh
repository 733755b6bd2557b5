#!/usr/bin/env bash
# make test: installs what the tests need, starts a private redis on a free loopback port, and runs pytest.
# Extra arguments go to pytest, e.g. `make test ARGS="-k keys"`.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/install.sh
scripts/system-deps.sh redis chromium bwrap gettext opencv cjk-font
scripts/compile-messages.sh
echo "==> ruff (configured in pyproject.toml)"
.venv/bin/ruff check .

scratch=$(mktemp -d)
port=$(.venv/bin/python -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
redis-server --bind 127.0.0.1 --port "$port" --save "" --appendonly no --daemonize yes \
  --pidfile "$scratch/redis.pid" --dir "$scratch" --logfile "$scratch/redis.log"
cleanup() {
  [ -f "$scratch/redis.pid" ] && kill "$(cat "$scratch/redis.pid")" 2>/dev/null
  # A process the tests started may still be writing its last lines there; the scratch dir must not decide the
  # run's outcome.
  rm -rf "$scratch" 2>/dev/null || { sleep 2; rm -rf "$scratch" 2>/dev/null; } || true
}
trap cleanup EXIT
for _ in $(seq 50); do redis-cli -p "$port" ping >/dev/null 2>&1 && break; sleep 0.1; done

export REDIS_URL="redis://127.0.0.1:$port/0" FACTORY_DATA_DIR="$scratch/data" FACTORY_NODE_NAME=test-web
status=0
# The 20 slowest tests close the run, so that what makes the suite slow is seen on every CI run.
.venv/bin/python -m pytest --durations=20 "$@" || status=$?
if [ "$status" -ne 0 ] && [ "$status" -ne 5 ]; then
  # The test worker's, web server's and engines' logs are removed with the scratch dir: show their ends, which say
  # why a live test's answer failed.
  for log in "$scratch"/data/worker-*.log "$scratch"/data/web-*.log "$scratch"/data/engines/*.log; do
    [ -f "$log" ] || continue
    echo "==> the last lines of $(basename "$log")"
    grep -v "^\s*$" "$log" | tail -n 80 || true
  done
fi
if [ "$status" -eq 5 ]; then
  echo "pytest collected no tests."
  exit 0
fi
exit "$status"
