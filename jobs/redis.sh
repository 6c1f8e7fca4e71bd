#!/usr/bin/env bash
# A private Redis server for the storage tier (cache.storage = "redis"): on a free localhost port,
# with its own data directory, no persistence, no eviction (maxmemory 0: a run over it is
# reproducible), stopped by its pid.
#   jobs/redis.sh start [DIR]   prints "redis://127.0.0.1:PORT DIR" once the server answers
#                               (DIR: a fresh temporary directory by default)
#   jobs/redis.sh stop DIR      stops the server started in DIR (and removes DIR if start made it)
# Exit 77 when redis-server is not installed (jobs/setup.sh installs it).
set -euo pipefail
cmd=${1:-}
case "$cmd" in
  start)
    command -v redis-server >/dev/null || { echo "jobs/redis.sh: redis-server is not installed (jobs/setup.sh)" >&2; exit 77; }
    if [ -n "${2:-}" ]; then
      dir=$2
      mkdir -p "$dir"
    else
      dir=$(mktemp -d -t kvgrid-redis-XXXXXX)
      touch "$dir/made-by-start"  # stop removes it
    fi
    dir=$(cd "$dir" && pwd)  # absolute: the server changes into --dir before it opens its log
    port=$(/usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
    redis-server --port "$port" --bind 127.0.0.1 --dir "$dir" --daemonize yes --pidfile "$dir/redis.pid" \
      --logfile "$dir/redis.log" --save "" --appendonly no --maxmemory 0 >/dev/null
    echo "$port" > "$dir/port"
    for _ in $(seq 1 200); do  # until it answers (at most ~10 s)
      if redis-cli -p "$port" ping 2>/dev/null | grep -q PONG; then
        echo "redis://127.0.0.1:$port $dir"
        exit 0
      fi
      sleep 0.05
    done
    echo "jobs/redis.sh: the server on port $port did not answer (log: $dir/redis.log)" >&2
    exit 1
    ;;
  stop)
    dir=${2:?usage: jobs/redis.sh stop DIR}
    [ -f "$dir/redis.pid" ] || { echo "jobs/redis.sh: no server in $dir" >&2; exit 2; }
    pid=$(cat "$dir/redis.pid")
    # SHUTDOWN NOSAVE: the server stops answering at once (its process exits a moment later)
    if ! redis-cli -p "$(cat "$dir/port" 2>/dev/null || echo 0)" shutdown nosave >/dev/null 2>&1; then
      kill "$pid" 2>/dev/null || true
      for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.05; done
      kill -9 "$pid" 2>/dev/null || true
    fi
    if [ -f "$dir/made-by-start" ]; then rm -rf "$dir"; fi
    ;;
  *)
    echo "usage: jobs/redis.sh start [DIR] | stop DIR" >&2
    exit 2
    ;;
esac
