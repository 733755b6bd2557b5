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
  [ -n "$pid" ] && [[ "$(command_line "$pid")" == *"$(proc_pattern "$1")"* ]]
}

# A process's command line, '' once it is gone (read whole: a pipe into `grep -q` can die of SIGPIPE under pipefail).
command_line() {
  tr '\0' ' ' 2>/dev/null <"/proc/$1/cmdline" || true
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
    if [ -f ".run/$name.pid" ]; then echo "==> $name was already gone"; else echo "==> $name was not running"; fi
    rm -f ".run/$name.pid"
    return
  fi
  pid=$(cat ".run/$name.pid")
  echo "==> stopping $name (pid $pid)"
  kill -TERM "$pid" 2>/dev/null || true
  wait_gone "$pid" 100
  if [ "$name" = redis ] && kill -0 "$pid" 2>/dev/null; then
    # Redis refuses SIGTERM when its final save fails (its data dir removed, the disk full): nothing left to keep.
    echo "    redis could not save on the way out (see logs/redis.log); SHUTDOWN NOSAVE"
    redis-cli -p "$(redis_port "$pid")" shutdown nosave >/dev/null 2>&1 || true
    wait_gone "$pid" 50
  fi
  if kill -0 "$pid" 2>/dev/null; then
    echo "    $name did not stop within 20 s; killed"
    kill -KILL "$pid" 2>/dev/null || true
  fi
  rm -f ".run/$name.pid"
}

wait_gone() {
  local pid=$1 tries=$2
  for _ in $(seq "$tries"); do
    kill -0 "$pid" 2>/dev/null || return 0
    sleep 0.2
  done
  return 1
}

# The port a redis-server listens on, from its command line ("redis-server 127.0.0.1:6379").
redis_port() {
  command_line "$1" | sed -n 's/.*:\([0-9][0-9]*\).*/\1/p'
}

# When Django cannot start at all: the engines launched from this data dir, by the PIDs recorded at launch, each only
# while it still runs an engine program (a reused PID is left alone).
stop_launched_engines() {
  local record pid
  for record in "$1"/engines/launched/[0-9]*; do
    [ -f "$record" ] || continue
    pid=$(basename "$record")
    if [[ "$(command_line "$pid")" =~ llama-server|embedding_server|vllm ]]; then
      echo "==> stopping engine (pid $pid)"
      kill -TERM -- "-$pid" 2>/dev/null || true
      wait_gone "$pid" 50 || kill -KILL -- "-$pid" 2>/dev/null || true
    fi
    rm -f "$record"
  done
}
