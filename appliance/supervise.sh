#!/bin/sh
# The services command where systemd is not PID 1 (install.sh and `ai-factory upgrade --services` use it):
#   supervise.sh start|stop|status
# runs appliance/supervise.py of the current release over the installed units, in the background, its PID in
# <prefix>/supervise.pid. The prefix is FACTORY_PREFIX, else the one this script is installed in: it lies at
# <prefix>/releases/<version>/appliance/supervise.sh, whichever way it is called (through <prefix>/current, a
# relative path, from any directory), so its real path is resolved before the prefix is read off it.
# stop with no supervisor running says so and succeeds, as `systemctl stop` does: what was asked for holds, and an
# upgrade of a prefix whose services were already stopped goes on.
set -eu
script=$(readlink -f "$0")
release=$(dirname "$(dirname "$script")")
if [ -n "${FACTORY_PREFIX:-}" ]; then
  prefix=$FACTORY_PREFIX
elif [ "$(basename "$(dirname "$release")")" = releases ]; then
  prefix=$(dirname "$(dirname "$release")")
else
  echo "error: $script is not in <prefix>/releases/<version>/appliance/; set FACTORY_PREFIX" >&2
  exit 2
fi
units=${FACTORY_UNITS_DIR:-/etc/systemd/system}
pidfile="$prefix/supervise.pid"

# The PID file names a live supervisor (not another process that was given its PID since).
running() {
  [ -f "$pidfile" ] || return 1
  case "$(tr '\0' ' ' <"/proc/$(cat "$pidfile")/cmdline" 2>/dev/null)" in
    *appliance/supervise.py*) return 0 ;;
    *) return 1 ;;
  esac
}

case "${1:-}" in
  start)
    running && exit 0
    mkdir -p "$prefix/logs"
    setsid "$prefix/current/.venv/bin/python" "$prefix/current/appliance/supervise.py" --units "$units" \
      --logs "$prefix/logs" >>"$prefix/logs/supervise.log" 2>&1 </dev/null &
    echo $! >"$pidfile" ;;
  stop)
    if ! running; then
      echo "nothing to stop: no supervisor runs for $prefix (no live PID in $pidfile)"
      rm -f "$pidfile"
      exit 0
    fi
    pid=$(cat "$pidfile")
    kill -TERM "$pid"
    for _ in $(seq 240); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
    kill -0 "$pid" 2>/dev/null && { echo "the supervisor (pid $pid) did not stop" >&2; exit 1; }
    echo "stopped the supervisor (pid $pid) of $prefix"
    rm -f "$pidfile" ;;
  status)
    if running; then echo "supervising (pid $(cat "$pidfile")); logs in $prefix/logs"
    else echo "stopped: no supervisor runs for $prefix"; exit 3; fi ;;
  *)
    echo "usage: $0 start|stop|status" >&2; exit 2 ;;
esac
