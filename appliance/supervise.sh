#!/bin/sh
# The services command where systemd is not PID 1 (install.sh and `ai-factory upgrade --services` use it):
#   supervise.sh start|stop|status
# runs appliance/supervise.py of the current release over the installed units, in the background, its PID in
# <prefix>/supervise.pid. The prefix is the one this release is installed in, or FACTORY_PREFIX.
set -eu
prefix=${FACTORY_PREFIX:-$(cd "$(dirname "$0")/../../.." && pwd)}
units=${FACTORY_UNITS_DIR:-/etc/systemd/system}
pidfile="$prefix/supervise.pid"

running() { [ -f "$pidfile" ] && kill -0 "$(cat "$pidfile")" 2>/dev/null; }

case "${1:-}" in
  start)
    running && exit 0
    mkdir -p "$prefix/logs"
    setsid "$prefix/current/.venv/bin/python" "$prefix/current/appliance/supervise.py" --units "$units" \
      --logs "$prefix/logs" >>"$prefix/logs/supervise.log" 2>&1 </dev/null &
    echo $! >"$pidfile" ;;
  stop)
    running || exit 0
    pid=$(cat "$pidfile")
    kill -TERM "$pid"
    for _ in $(seq 240); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
    kill -0 "$pid" 2>/dev/null && { echo "the supervisor (pid $pid) did not stop" >&2; exit 1; }
    rm -f "$pidfile" ;;
  status)
    if running; then echo "supervising (pid $(cat "$pidfile")); logs in $prefix/logs"; else echo "stopped"; exit 3; fi ;;
  *)
    echo "usage: $0 start|stop|status" >&2; exit 2 ;;
esac
