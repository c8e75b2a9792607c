#!/usr/bin/env bash
# A two-node Ray cluster on one machine: a head node and one worker node (separate raylets),
# bound to 127.0.0.1, for trying the distributed count and for tests.
#
#   cluster/local_cluster.sh start     # start head + worker node, wait until both are up
#   cluster/local_cluster.sh status    # `ray status` of this cluster
#   cluster/local_cluster.sh address   # print the GCS address (for --address / RAY_ADDRESS)
#   cluster/local_cluster.sh stop      # stop the processes this script started, and only those
#
# Then, for example:
#   python -m jobs.count --address "$(cluster/local_cluster.sh address)" --input ... --out ...
#   RAY_AUTH_MODE=disabled ray job submit --address "http://127.0.0.1:$((RAY_LOCAL_PORT + 2))" \
#       -- python -m jobs.count --input /abs/path/... --out /abs/path/...
#
# Settings (environment):
#   RAY_LOCAL_PORT         GCS port of the head; the cluster uses ports PORT..PORT+299 (default 26379)
#   RAY_LOCAL_DIR          state folder: pids, logs, Ray temp dir (default /tmp/prc-PORT; keep it
#                          short, Ray's socket paths live inside it)
#   RAY_LOCAL_HEAD_CPUS    CPUs the head node offers (default 1)
#   RAY_LOCAL_WORKER_CPUS  CPUs the worker node offers (default 1)
#   RAY_LOCAL_DASHBOARD    1 (default): start the dashboard + job server on PORT+2 (needed by
#                          `ray job submit`); 0: no dashboard (faster start)
#   RAY_AUTH_MODE          default "disabled" (ports bound to 127.0.0.1 only). Ray 2.60 turns token
#                          authentication on by default; with "token", head, worker and every
#                          client need the same token (~/.ray/auth_token or RAY_AUTH_TOKEN).
#
# Each node is a `ray start --block` process started in its own process group; `stop` sends
# SIGTERM to that process (Ray then shuts its node down), then SIGKILL to what is left of
# the group after a grace period. It never runs `ray stop`, which would kill every Ray process on the machine.
set -euo pipefail

PORT="${RAY_LOCAL_PORT:-26379}"
DIR="${RAY_LOCAL_DIR:-/tmp/prc-$PORT}"
HEAD_CPUS="${RAY_LOCAL_HEAD_CPUS:-1}"
WORKER_CPUS="${RAY_LOCAL_WORKER_CPUS:-1}"
DASHBOARD="${RAY_LOCAL_DASHBOARD:-1}"
export RAY_AUTH_MODE="${RAY_AUTH_MODE:-disabled}"
export RAY_USAGE_STATS_ENABLED=0
# On SIGTERM a node would first drain for up to 30 s (meant for Serve on Kubernetes); this
# throwaway cluster shuts down at once.
export RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S="${RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S:-0}"
ADDRESS="127.0.0.1:$PORT"

die() { echo "local_cluster: $*" >&2; exit 1; }

alive() { [[ -f "$1" ]] && kill -0 "$(cat "$1")" 2>/dev/null; }

nodes_up() {
    # number of alive nodes registered with this cluster's GCS
    python - "$ADDRESS" <<'EOF' 2>/dev/null || echo 0
import sys
from ray._raylet import GcsClient
client = GcsClient(address=sys.argv[1])
print(sum(1 for n in client.get_all_node_info(timeout=5).values() if n.state == 0))
EOF
}

start_node() {  # name, then `ray start` arguments
    local name="$1"; shift
    setsid ray start --block --disable-usage-stats --node-ip-address 127.0.0.1 "$@" \
        >"$DIR/$name.log" 2>&1 </dev/null &
    echo $! >"$DIR/$name.pid"
}

start() {
    alive "$DIR/head.pid" && die "already running (pid $(cat "$DIR/head.pid")); stop it first"
    mkdir -p "$DIR"
    local dash=(--include-dashboard=false)
    if [[ "$DASHBOARD" == 1 ]]; then
        dash=(--include-dashboard=true --dashboard-host 127.0.0.1 --dashboard-port $((PORT + 2)))
    fi
    start_node head --head --port "$PORT" --num-cpus "$HEAD_CPUS" --temp-dir "$DIR/t" \
        --ray-client-server-port $((PORT + 1)) "${dash[@]}" \
        --dashboard-agent-listen-port $((PORT + 3)) --dashboard-agent-grpc-port $((PORT + 4)) \
        --metrics-export-port $((PORT + 5)) --runtime-env-agent-port $((PORT + 6)) \
        --node-manager-port $((PORT + 7)) --object-manager-port $((PORT + 8)) \
        --min-worker-port $((PORT + 100)) --max-worker-port $((PORT + 199))
    local t=0
    until [[ "$(nodes_up)" -ge 1 ]]; do
        alive "$DIR/head.pid" || { tail -20 "$DIR/head.log" >&2; die "the head node failed to start"; }
        ((t++ < 120)) || die "the head node did not come up in 120 s (see $DIR/head.log)"
        sleep 1
    done
    start_node worker --address "$ADDRESS" --num-cpus "$WORKER_CPUS" \
        --dashboard-agent-listen-port $((PORT + 13)) --dashboard-agent-grpc-port $((PORT + 14)) \
        --metrics-export-port $((PORT + 15)) --runtime-env-agent-port $((PORT + 16)) \
        --node-manager-port $((PORT + 17)) --object-manager-port $((PORT + 18)) \
        --min-worker-port $((PORT + 200)) --max-worker-port $((PORT + 299))
    t=0
    until [[ "$(nodes_up)" -ge 2 ]]; do
        alive "$DIR/worker.pid" || { tail -20 "$DIR/worker.log" >&2; die "the worker node failed to start"; }
        ((t++ < 120)) || die "the worker node did not come up in 120 s (see $DIR/worker.log)"
        sleep 1
    done
    echo "local_cluster: 2 nodes up at $ADDRESS (state in $DIR)"
    [[ "$DASHBOARD" == 1 ]] && echo "local_cluster: dashboard / job server at http://127.0.0.1:$((PORT + 2))"
    return 0
}

stop_group() {  # pid file: SIGTERM the `ray start --block` process (it stops its node),
                # then SIGKILL whatever is left of its process group after 30 s
    local file="$1" pid
    [[ -f "$file" ]] || return 0
    pid="$(cat "$file")"
    if kill -0 "$pid" 2>/dev/null; then
        kill -TERM "$pid" 2>/dev/null || true
        for _ in $(seq 60); do
            kill -0 -- "-$pid" 2>/dev/null || break
            sleep 0.5
        done
        kill -KILL -- "-$pid" 2>/dev/null || true
    fi
    rm -f "$file"
}

stop() {
    stop_group "$DIR/worker.pid"
    stop_group "$DIR/head.pid"
    echo "local_cluster: stopped ($ADDRESS)"
}

case "${1:-}" in
    start) start ;;
    stop) stop ;;
    status) ray status --address "$ADDRESS" ;;
    address) echo "$ADDRESS" ;;
    *) die "usage: $0 start|stop|status|address" ;;
esac
