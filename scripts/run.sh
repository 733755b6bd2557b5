#!/usr/bin/env bash
# make run: install, migrate, bootstrap, then start redis, the Celery workers (node, ingestion, interactive), beat
# and the web server.
# Each process's PID goes to .run/<name>.pid; a process already running is left alone, so re-running is safe.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/procs.lib.sh

scripts/install.sh
scripts/system-deps.sh redis bwrap gettext opencv
mkdir -p .run logs
export FACTORY_DATA_DIR=${FACTORY_DATA_DIR:-$PWD/data}
export FACTORY_HOST=${FACTORY_HOST:-127.0.0.1} FACTORY_PORT=${FACTORY_PORT:-8000}
redis_port=${FACTORY_REDIS_PORT:-6379}
export REDIS_URL=${REDIS_URL:-redis://127.0.0.1:$redis_port/0}
mkdir -p "$FACTORY_DATA_DIR/redis"
# make stop and the benchmarks read the same settings back.
export FACTORY_URL="http://$FACTORY_HOST:$FACTORY_PORT"
declare -p FACTORY_DATA_DIR REDIS_URL FACTORY_URL | sed 's/^declare -x/export/' >.run/env
[ -n "${DATABASE_URL:-}" ] && declare -p DATABASE_URL | sed 's/^declare -x/export/' >>.run/env

if proc_alive redis; then
  echo "==> redis already running (pid $(cat .run/redis.pid))"
elif redis-cli -p "$redis_port" ping >/dev/null 2>&1; then
  echo "==> a redis not started by make run answers on port $redis_port; using it"
else
  echo "==> starting redis on 127.0.0.1:$redis_port"
  redis-server --bind 127.0.0.1 --port "$redis_port" --protected-mode yes --daemonize yes \
    --pidfile "$PWD/.run/redis.pid" --dir "$FACTORY_DATA_DIR/redis" --logfile "$PWD/logs/redis.log"
  for _ in $(seq 50); do redis-cli -p "$redis_port" ping >/dev/null 2>&1 && break; sleep 0.1; done
fi

scripts/proc.sh setup

# The long-running processes, in start order; docker-compose.yml has one service for each.
PROCESSES="node worker interactive beat web"
for name in $PROCESSES; do
  start_proc "$name"
done

url=$FACTORY_URL
for _ in $(seq 120); do
  curl -fsS "$url/healthz" >/dev/null 2>&1 && break
  sleep 0.5
done
if ! curl -fsS "$url/healthz" >/dev/null 2>&1; then
  echo "error: the web server did not come up; see logs/web.log" >&2
  tail -20 logs/web.log >&2
  exit 1
fi
echo "==> waiting for the model deployments"
.venv/bin/python manage.py wait_deployments --timeout 300
cat <<MSG

AI Factory is running at $url
  login:   ${FACTORY_ADMIN_USER:-admin} (password printed above on first run, or \$FACTORY_ADMIN_PASSWORD)
  API:     $url/api/docs/
  gateway: $url/v1 (OpenAI-compatible; create an API key on the API keys page)
  logs:    logs/web.log logs/node.log logs/worker.log logs/interactive.log logs/beat.log
  stop:    make stop
MSG
