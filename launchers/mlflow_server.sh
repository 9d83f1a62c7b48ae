#!/usr/bin/env bash
# MLflow tracking server for sweeps (dev and CI), bound to 127.0.0.1.
#
#   launchers/mlflow_server.sh start  [--port N] [--backend-store-uri URI] [--artifacts-destination DIR]
#                                     [--workers N] [--state-dir DIR]
#   launchers/mlflow_server.sh status [--state-dir DIR]     # exit 0 running, 3 not running
#   launchers/mlflow_server.sh stop   [--state-dir DIR]
#
#   eval "$(launchers/mlflow_server.sh start)"     # stdout is only `export MLFLOW_TRACKING_URI=http://127.0.0.1:N`
#
# Defaults: port 5000 (a free one if 5000 is taken), the project's local store sqlite:///<repo>/mlruns/mlflow.db,
# artifacts in <repo>/mlruns/artifacts, 1 worker, state (pid file, log, uri) in <repo>/.runtime/mlflow
# (FORGE_MLFLOW_STATE_DIR). Python: FORGE_MLFLOW_PYTHON, else <repo>/.venv/bin/python, else python3.
# The backend store is created (tables migrated) by a one-off python process BEFORE the server starts, so that
# the server and early clients never race to create it. MLFLOW_SERVER_ENABLE_JOB_EXECUTION=false keeps the
# server to 2 processes (mlflow CLI + uvicorn; no huey job consumer). stop kills the whole process group.
set -euo pipefail
REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

log() { echo "[mlflow] $*" >&2; }
die() { log "ERROR: $*"; exit 1; }
usage() { sed -n '2,9p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2; exit 2; }

cmd="${1:-}"; [[ $# -gt 0 ]] && shift
port="" backend="" artifacts="" workers=1 state="${FORGE_MLFLOW_STATE_DIR:-$REPO_ROOT/.runtime/mlflow}"
while [[ $# -gt 0 ]]; do
    case "$1" in
        --port) port="$2"; shift 2 ;;
        --port=*) port="${1#*=}"; shift ;;
        --backend-store-uri) backend="$2"; shift 2 ;;
        --backend-store-uri=*) backend="${1#*=}"; shift ;;
        --artifacts-destination) artifacts="$2"; shift 2 ;;
        --artifacts-destination=*) artifacts="${1#*=}"; shift ;;
        --workers) workers="$2"; shift 2 ;;
        --workers=*) workers="${1#*=}"; shift ;;
        --state-dir) state="$2"; shift 2 ;;
        --state-dir=*) state="${1#*=}"; shift ;;
        -h | --help) usage ;;
        *) log "unknown argument: $1"; usage ;;
    esac
done
case "$state" in /*) ;; *) state="$PWD/$state" ;; esac
PID_FILE="$state/mlflow.pid"
URI_FILE="$state/uri"
LOG_FILE="$state/mlflow.log"

PY="${FORGE_MLFLOW_PYTHON:-}"
if [[ -z "$PY" ]]; then
    if [[ -x "$REPO_ROOT/.venv/bin/python" ]]; then PY="$REPO_ROOT/.venv/bin/python"; else PY="$(command -v python3 || true)"; fi
fi

# alive PID: exists, not a zombie (some sandboxes' PID 1 never reaps), and is an mlflow server we started
alive() {
    local pid="$1" stat st
    [[ "$pid" =~ ^[0-9]+$ ]] || return 1
    stat="$(cat "/proc/$pid/stat" 2>/dev/null)" || return 1
    st="${stat##*) }"; st="${st%% *}"
    [[ "$st" != Z && "$st" != X ]] || return 1
    tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -q "mlflow server"
}
server_pid() { local p; p="$(cat "$PID_FILE" 2>/dev/null || true)"; alive "$p" && echo "$p"; }

# live (non-zombie) mlflow processes in process group $1
group_members() {
    local pg="$1" d stat st pgrp out=""
    for d in /proc/[0-9]*; do
        stat="$(<"$d/stat")" 2>/dev/null || continue
        read -r st _ pgrp _ <<<"${stat##*) }"
        [[ "$st" != Z && "$st" != X && "$pgrp" == "$pg" ]] || continue
        tr '\0' ' ' <"$d/cmdline" 2>/dev/null | grep -q mlflow && out+="${d#/proc/} "
    done
    echo "$out"
}

case "$cmd" in
status)
    if pid="$(server_pid)"; then
        echo "running (pid $pid) at $(cat "$URI_FILE" 2>/dev/null)"
        exit 0
    fi
    echo "not running"
    exit 3
    ;;

stop)
    pid="$(cat "$PID_FILE" 2>/dev/null || true)"
    # the leader may already be gone (or a zombie) while its uvicorn child lives on: look at the group
    if [[ ! "$pid" =~ ^[0-9]+$ ]] || { ! alive "$pid" && [[ -z "$(group_members "$pid")" ]]; }; then
        log "not running (state dir $state)"
        rm -f "$PID_FILE"
        exit 0
    fi
    # setsid made the server its own process-group leader: signal the whole group (CLI + uvicorn)
    kill -TERM -- "-$pid" 2>/dev/null || true
    for ((i = 0; i < 100; i++)); do
        left="$(group_members "$pid")"
        [[ -z "$left" ]] && break
        sleep 0.1
    done
    if [[ -n "$left" ]]; then
        log "process group $pid still alive after 10s ($left): SIGKILL"
        kill -KILL -- "-$pid" 2>/dev/null || true
        sleep 0.2
    fi
    rm -f "$PID_FILE"
    log "stopped (pid $pid)"
    ;;

start)
    [[ -n "$PY" ]] || die "no python with mlflow (set FORGE_MLFLOW_PYTHON)"
    if pid="$(server_pid)"; then
        log "already running (pid $pid) at $(cat "$URI_FILE")"
        echo "export MLFLOW_TRACKING_URI=$(cat "$URI_FILE")"
        exit 0
    fi
    mkdir -p "$state"
    backend="${backend:-sqlite:///$REPO_ROOT/mlruns/mlflow.db}"
    artifacts="${artifacts:-$REPO_ROOT/mlruns/artifacts}"
    [[ "$artifacts" == *://* ]] || { mkdir -p "$artifacts"; artifacts="$(cd "$artifacts" && pwd)"; }

    # port: --port must be free; default 5000, else any free port
    port="$("$PY" - "${port:-}" <<'EOF'
import socket, sys
def free(p):
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        s.bind(("127.0.0.1", p)); return s.getsockname()[1]
    except OSError:
        return None
    finally:
        s.close()
want = sys.argv[1]
if want:
    p = free(int(want))
    if p is None:
        sys.exit(f"port {want} is in use")
    print(p)
else:
    print(free(5000) or free(0))
EOF
)" || die "no usable port"

    # create/migrate the backend store once, before the server and any client touch it
    if [[ "$backend" != file:* && "$backend" == *://* ]]; then
        if [[ "$backend" == sqlite:///* ]]; then mkdir -p "$(dirname "${backend#sqlite:///}")"; fi
        MLFLOW_SERVER_ENABLE_JOB_EXECUTION=false "$PY" -c '
import logging, sys
logging.disable(logging.INFO)
from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore
SqlAlchemyStore(sys.argv[1], "mlflow-artifacts:/")  # creates + migrates tables and the Default experiment
' "$backend" >>"$LOG_FILE" 2>&1 || { tail -n 20 "$LOG_FILE" >&2; die "could not create the backend store $backend"; }
    fi

    uri="http://127.0.0.1:$port"
    echo "$uri" >"$URI_FILE"
    log "starting on $uri (store $backend, artifacts $artifacts, log $LOG_FILE)"
    MLFLOW_SERVER_ENABLE_JOB_EXECUTION=false setsid "$PY" -m mlflow server --host 127.0.0.1 --port "$port" \
        --backend-store-uri "$backend" --artifacts-destination "$artifacts" --workers "$workers" \
        </dev/null >>"$LOG_FILE" 2>&1 &
    echo $! >"$PID_FILE"
    pid="$(cat "$PID_FILE")"

    # wait for /health (importing mlflow takes seconds on a busy 2-core box)
    "$PY" - "$uri" "$pid" "${FORGE_MLFLOW_TIMEOUT_S:-90}" <<'EOF' || { tail -n 30 "$LOG_FILE" >&2; "$0" stop --state-dir "$state" || true; die "server did not become healthy"; }
import os, sys, time, urllib.request
uri, pid, timeout = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
deadline = time.time() + timeout
while time.time() < deadline:
    try:
        with urllib.request.urlopen(uri + "/health", timeout=2) as r:
            if r.status == 200:
                sys.exit(0)
    except OSError:
        pass
    try:
        state = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0]
    except OSError:
        state = "gone"
    if state in ("Z", "X", "gone"):
        sys.exit(f"mlflow server (pid {pid}) exited")
    time.sleep(0.25)
sys.exit(f"no /health answer from {uri} after {timeout:.0f}s")
EOF
    log "running (pid $pid) at $uri"
    echo "export MLFLOW_TRACKING_URI=$uri"
    ;;

*) usage ;;
esac
