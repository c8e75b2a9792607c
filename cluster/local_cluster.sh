#!/usr/bin/env bash
# A two-node Ray cluster on one machine: a head node and one worker node (separate raylets,
# separate temp folders), every listener bound to 127.0.0.1, for trying the distributed
# count and `posstats submit`, and for tests.
#
#   cluster/local_cluster.sh start     # start head + worker node, wait until both are up
#   cluster/local_cluster.sh status    # `ray status` of this cluster
#   cluster/local_cluster.sh address   # print the GCS address (for --address / RAY_ADDRESS)
#   cluster/local_cluster.sh env       # print the client settings: eval "$(cluster/local_cluster.sh env)"
#   cluster/local_cluster.sh stop      # stop the processes this script started, and only those
#
# Then, for example:
#   posstats submit --address "http://127.0.0.1:$((RAY_LOCAL_PORT + 2))" --config pipeline.toml --wait
#   RAY_AUTH_MODE=disabled ray job submit --address "http://127.0.0.1:$((RAY_LOCAL_PORT + 2))" \
#       -- python -m posstats.jobs.count --input /abs/path/... --out /abs/path/...
#   eval "$(cluster/local_cluster.sh env)"; python -m posstats.jobs.count --address "$RAY_ADDRESS" --input ... --out ...
#
# Loopback only. Ray 2.60 turns `--node-ip-address 127.0.0.1` into the machine's external
# address, and its servers then listen on every interface. Every process of this cluster
# runs with RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 (Ray's single-machine mode): the node
# address stays 127.0.0.1, and the GCS, raylets, object managers, core workers, dashboard,
# dashboard agents, runtime-env agents, metrics endpoints and the Ray Client server all
# listen on 127.0.0.1. The worker node is started through cluster/loopback_node.py, which
# lifts `ray start`'s "no multi-node cluster in that mode" check (see that file). A client
# that joins through the GCS address (ray.init, jobs.count --address, ray status) needs
# RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 as well (`env` prints it), else Ray rewrites
# 127.0.0.1 to the external address, where nothing listens; clients of the job server
# (`posstats submit`, `ray job submit`, HTTP on PORT+2) need nothing.
# Loopback is still reachable by every local user and container sharing this network
# namespace: on a shared machine use RAY_AUTH_MODE=token (below).
#
# Settings (environment):
#   RAY_LOCAL_PORT         GCS port of the head; the cluster uses ports PORT..PORT+299 (default 26379)
#   RAY_LOCAL_DIR          state folder (created 0700): pids, logs, the nodes' Ray temp dirs t/ (head) and
#                          w/ (worker) (default /tmp/prc-PORT; keep it short, Ray's socket paths live in it)
#   RAY_LOCAL_HEAD_CPUS    CPUs the head node offers (default 1)
#   RAY_LOCAL_WORKER_CPUS  CPUs the worker node offers (default 1)
#   RAY_LOCAL_DASHBOARD    1 (default): start the dashboard + job server on PORT+2 (needed by
#                          `ray job submit` / `posstats submit`); 0: no dashboard (faster start)
#   RAY_AUTH_MODE          "disabled" (default: every listener is on loopback) or "token": head,
#                          worker and every client need the same token: RAY_AUTH_TOKEN, or
#                          RAY_AUTH_TOKEN_PATH, else the script generates DIR/auth_token (mode 0600)
#                          and `env` points clients at it. `start` records the mode in DIR/auth.env
#                          for the other commands.
#
# Each node has its own Ray temp folder (--temp-dir): with one shared folder both nodes
# would share one runtime_resources/ folder, and one node's runtime-env agent deletes a
# job's working_dir while the other node's workers run in it.
#
# Each node is a `ray start --block` process started in its own session (setsid); `stop`
# sends SIGTERM to that process (Ray then shuts its node down), waits for its session to
# empty, then SIGKILLs whatever is left of that session (Ray's workers run in process groups
# of their own, inside the node's session). It never runs `ray stop`, which would kill
# every Ray process on the machine.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
PORT="${RAY_LOCAL_PORT:-26379}"
DIR="${RAY_LOCAL_DIR:-/tmp/prc-$PORT}"
HEAD_CPUS="${RAY_LOCAL_HEAD_CPUS:-1}"
WORKER_CPUS="${RAY_LOCAL_WORKER_CPUS:-1}"
DASHBOARD="${RAY_LOCAL_DASHBOARD:-1}"
PYTHON="${RAY_LOCAL_PYTHON:-$(command -v python || command -v python3)}"
export RAY_AUTH_MODE="${RAY_AUTH_MODE:-disabled}"
export RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0
export RAY_USAGE_STATS_ENABLED=0
# On SIGTERM a node would first drain for up to 30 s (meant for Serve on Kubernetes); this
# throwaway cluster shuts down at once.
export RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S="${RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S:-0}"
ADDRESS="127.0.0.1:$PORT"

die() { echo "local_cluster: $*" >&2; exit 1; }

# `start` records the cluster's authentication settings (never a token) so that `env` and
# `status` describe the running cluster, whatever this shell's RAY_AUTH_MODE says
AUTH_STATE="$DIR/auth.env"
if [[ "${1:-}" != start && -f "$AUTH_STATE" ]]; then
    while IFS='=' read -r key value; do
        case "$key" in RAY_AUTH_MODE|RAY_AUTH_TOKEN_PATH) export "$key=$value" ;; esac
    done <"$AUTH_STATE"
fi

case "$RAY_AUTH_MODE" in
    disabled) ;;
    token)
        if [[ -z "${RAY_AUTH_TOKEN:-}" && -z "${RAY_AUTH_TOKEN_PATH:-}" ]]; then
            export RAY_AUTH_TOKEN_PATH="$DIR/auth_token"
        fi ;;
    *) die "RAY_AUTH_MODE must be disabled or token, got '$RAY_AUTH_MODE'" ;;
esac

alive() { [[ -f "$1" ]] && kill -0 "$(cat "$1")" 2>/dev/null; }

nodes_up() {
    # number of alive nodes registered with this cluster's GCS
    "$PYTHON" - "$ADDRESS" <<'PY' 2>/dev/null || echo 0
import sys
from ray._raylet import GcsClient
client = GcsClient(address=sys.argv[1])
print(sum(1 for n in client.get_all_node_info(timeout=5).values() if n.state == 0))
PY
}

start_node() {  # name, then the command (`ray start ...` or the loopback launcher)
    local name="$1"; shift
    setsid "$@" >"$DIR/$name.log" 2>&1 </dev/null &
    echo $! >"$DIR/$name.pid"
}

start() {
    alive "$DIR/head.pid" && die "already running (pid $(cat "$DIR/head.pid")); stop it first"
    # private: Ray makes its temp folders world-writable (0777), and they hold every job's
    # working_dir and code (runtime_resources/), logs and sockets. An existing folder is left
    # as it is (it may be a shared one).
    if [[ ! -d "$DIR" ]]; then
        (umask 077 && mkdir -p "$DIR")
    fi
    {
        echo "RAY_AUTH_MODE=$RAY_AUTH_MODE"
        [[ -n "${RAY_AUTH_TOKEN_PATH:-}" ]] && echo "RAY_AUTH_TOKEN_PATH=$RAY_AUTH_TOKEN_PATH"
    } >"$AUTH_STATE"
    if [[ "$RAY_AUTH_MODE" == token && "${RAY_AUTH_TOKEN_PATH:-}" == "$DIR/auth_token" && ! -s "$DIR/auth_token" ]]; then
        (umask 077 && "$PYTHON" -c 'import secrets; print(secrets.token_hex(32))' >"$DIR/auth_token")
    fi
    local dash=(--include-dashboard=false)
    if [[ "$DASHBOARD" == 1 ]]; then
        dash=(--include-dashboard=true --dashboard-host 127.0.0.1 --dashboard-port $((PORT + 2)))
    fi
    start_node head ray start --block --disable-usage-stats --node-ip-address 127.0.0.1 \
        --head --port "$PORT" --num-cpus "$HEAD_CPUS" --temp-dir "$DIR/t" \
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
    start_node worker "$PYTHON" "$HERE/loopback_node.py" start --block --disable-usage-stats \
        --node-ip-address 127.0.0.1 --address "$ADDRESS" --num-cpus "$WORKER_CPUS" --temp-dir "$DIR/w" \
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
    echo "local_cluster: 2 nodes up at $ADDRESS, listening on 127.0.0.1 only (auth $RAY_AUTH_MODE; state in $DIR)"
    [[ "$DASHBOARD" == 1 ]] && echo "local_cluster: dashboard / job server at http://127.0.0.1:$((PORT + 2))"
    return 0
}

session_pids() {  # pids of the processes in session $1
    ps -e -o pid=,sid= | awk -v s="$1" '$2 == s { print $1 }'
}

stop_node() {  # pid file: SIGTERM the `ray start --block` process (it stops its node), wait
               # up to 30 s for its session to empty, then SIGKILL whatever is left in it
    local file="$1" pid left
    [[ -f "$file" ]] || return 0
    pid="$(cat "$file")"
    # only our session leader (a reused pid belongs to another session)
    [[ "$(ps -o sid= -p "$pid" 2>/dev/null | tr -d ' ')" == "$pid" ]] && kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 60); do
        [[ -z "$(session_pids "$pid")" ]] && break
        sleep 0.5
    done
    left="$(session_pids "$pid")"
    [[ -n "$left" ]] && kill -KILL $left 2>/dev/null || true
    rm -f "$file"
}

stop() {
    stop_node "$DIR/worker.pid"
    stop_node "$DIR/head.pid"
    echo "local_cluster: stopped ($ADDRESS)"
}

client_env() {
    echo "export RAY_ADDRESS=$ADDRESS"
    [[ "$DASHBOARD" == 1 ]] && echo "export RAY_API_SERVER_ADDRESS=http://127.0.0.1:$((PORT + 2))"
    echo "export RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0"
    echo "export RAY_AUTH_MODE=$RAY_AUTH_MODE"
    [[ -n "${RAY_AUTH_TOKEN_PATH:-}" ]] && echo "export RAY_AUTH_TOKEN_PATH=$RAY_AUTH_TOKEN_PATH"
    [[ "$RAY_AUTH_MODE" == token && -z "${RAY_AUTH_TOKEN_PATH:-}" ]] && echo "# and RAY_AUTH_TOKEN as given to start"
    return 0
}

case "${1:-}" in
    start) start ;;
    stop) stop ;;
    status) ray status --address "$ADDRESS" ;;
    address) echo "$ADDRESS" ;;
    env) client_env ;;
    *) die "usage: $0 start|stop|status|address|env" ;;
esac
