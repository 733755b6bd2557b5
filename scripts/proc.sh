#!/usr/bin/env bash
# The platform's long-running processes, defined once: `make run` starts them in the background and
# docker-compose.yml runs each as a service. Usage: scripts/proc.sh setup|web|node|worker|interactive|beat
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/python ] && export PATH="$PWD/.venv/bin:$PATH"
# The node name decides the node worker's queue (node.<name>); settings read the same variable.
export FACTORY_NODE_NAME=${FACTORY_NODE_NAME:-$(hostname | cut -d. -f1 | tr '[:upper:]' '[:lower:]')}

case "${1:-}" in
  setup)
    scripts/compile-messages.sh
    python manage.py migrate --noinput
    exec python manage.py bootstrap ;;
  web)
    # Python runs one thread at a time per process, so the cores are used by worker processes; each embeds its
    # queries batched on one torch thread. Their Prometheus metrics meet in a shared directory, emptied here.
    export FACTORY_TORCH_THREADS=${FACTORY_WEB_TORCH_THREADS:-1}
    export PROMETHEUS_MULTIPROC_DIR=${FACTORY_DATA_DIR:-data}/prometheus
    rm -rf "$PROMETHEUS_MULTIPROC_DIR" && mkdir -p "$PROMETHEUS_MULTIPROC_DIR"
    exec uvicorn factory.asgi:application --host "${FACTORY_HOST:-127.0.0.1}" --port "${FACTORY_PORT:-8000}" \
      --workers "${FACTORY_WEB_WORKERS:-2}" --no-access-log --lifespan off ;;
  worker)
    # Bulk ingestion (queue ingest), in the fair order of the ingestion line. A parse that takes every one of these
    # processes never delays this machine's replica jobs or heartbeats, nor anyone's evaluation: those have the
    # node and interactive workers to themselves. FACTORY_RAG_INGEST_SLOTS counts these processes in the pool.
    # Background work: it yields the cores to the engines serving chats (cluster/cpu_budget.py).
    export FACTORY_WORK_KIND=background
    exec celery -A factory worker --queues ingest \
      --hostname "worker@$FACTORY_NODE_NAME" --concurrency "${FACTORY_WORKER_CONCURRENCY:-2}" --loglevel INFO ;;
  interactive)
    # The short work a person waits for (eval runs and sets, tuning, calibration, agent evaluations): capacity of
    # its own, so it starts within seconds however much ingestion is queued. Background work too: a person waits
    # for it, but never as closely as for a chat's next token.
    export FACTORY_WORK_KIND=background
    exec celery -A factory worker --queues interactive --hostname "interactive@$FACTORY_NODE_NAME" \
      --concurrency "${FACTORY_INTERACTIVE_CONCURRENCY:-1}" --loglevel INFO ;;
  node)
    # This machine's jobs (replica starts and stops, training), its heartbeats and beat's sweeps.
    exec celery -A factory worker --queues "default,node.$FACTORY_NODE_NAME" \
      --hostname "node@$FACTORY_NODE_NAME" --concurrency "${FACTORY_NODE_CONCURRENCY:-2}" --loglevel INFO ;;
  beat)
    exec celery -A factory beat --schedule "${FACTORY_DATA_DIR:-data}/celerybeat-schedule" --loglevel INFO ;;
  *)
    echo "usage: $0 setup|web|node|worker|interactive|beat" >&2; exit 2 ;;
esac
