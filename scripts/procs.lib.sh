# Shared by run.sh and stop.sh: processes are known only by the PIDs this checkout recorded in .run/.

# A PID file is trusted only while its process still runs the expected program, so a reused PID is never killed.
proc_pattern() {
  case "$1" in
    redis) echo "redis-server" ;;
    web) echo "uvicorn" ;;
    node|worker|interactive|beat) echo "celery" ;;
  esac
}

proc_alive() {
  local pidfile=".run/$1.pid" pid
  [ -f "$pidfile" ] || return 1
  pid=$(cat "$pidfile")
  [ -n "$pid" ] && [ -r "/proc/$pid/cmdline" ] && tr '\0' ' ' <"/proc/$pid/cmdline" | grep -q "$(proc_pattern "$1")"
}

start_proc() {
  local name=$1
  if proc_alive "$name"; then
    echo "==> $name already running (pid $(cat ".run/$name.pid"))"
    return
  fi
  echo "==> starting $name (log: logs/$name.log)"
  setsid scripts/proc.sh "$name" >>"logs/$name.log" 2>&1 </dev/null &
  echo $! >".run/$name.pid"
}

stop_proc() {
  local name=$1 pid
  if ! proc_alive "$name"; then
    rm -f ".run/$name.pid"
    return
  fi
  pid=$(cat ".run/$name.pid")
  echo "==> stopping $name (pid $pid)"
  kill -TERM "$pid" 2>/dev/null || true
  for _ in $(seq 100); do
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.2
  done
  kill -0 "$pid" 2>/dev/null && kill -KILL "$pid" 2>/dev/null || true
  rm -f ".run/$name.pid"
}
