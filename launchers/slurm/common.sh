# Shared by start.sh and stop.sh (sourced, not executed).
# State dir: FORGE_SLURM_STATE_DIR, default <repo>/.runtime/slurm (git-ignored).

SLURM_HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO_ROOT="$(cd "$SLURM_HERE/../.." && pwd)"
STATE="${FORGE_SLURM_STATE_DIR:-$REPO_ROOT/.runtime/slurm}"
case "$STATE" in /*) ;; *) STATE="$PWD/$STATE" ;; esac
CONF="$STATE/slurm.conf"
ENV_FILE="$STATE/env.sh"
BIN="$STATE/bin"
RUN="$STATE/run"
LOGS="$STATE/log"
MUNGE_DIR="$STATE/munge"
CTLD_PID="$RUN/slurmctld.pid"
SLURMD_PID="$RUN/slurmd.pid"
MUNGED_PID="$MUNGE_DIR/munged.pid"

log() { echo "[slurm] $*" >&2; }

# serialize start.sh/stop.sh on one state dir (fd 9 stays open until the script exits)
lock_state() { # daemons started while it is held must get 9>&- (else they keep the lock)
    exec 9>"$STATE/.lock"
    flock -w 120 9 || { log "ERROR: another start.sh/stop.sh holds $STATE/.lock"; exit 1; }
}

# pid_live PID: the process exists and is not a zombie.
# (Zombies matter: in some sandboxes PID 1 never reaps orphans, so a dead daemon stays a <defunct> entry.)
pid_live() {
    local pid="$1" stat st
    [[ "$pid" =~ ^[0-9]+$ ]] || return 1
    stat="$(cat "/proc/$pid/stat" 2>/dev/null)" || return 1
    st="${stat##*) }"; st="${st%% *}"
    [[ "$st" != Z && "$st" != X ]]
}

# pid_alive PID NAME: pid_live, and its comm is NAME (a pid file's pid may since belong to another process).
pid_alive() { pid_live "$1" && [[ "$(cat "/proc/$1/comm" 2>/dev/null)" == "$2" ]]; }

read_pid() { [[ -s "$1" ]] && tr -dc '0-9' <"$1" || true; }

# running NAME PIDFILE -> prints the pid and succeeds when that daemon is alive
running() {
    local pid
    pid="$(read_pid "$2")"
    pid_alive "$pid" "$1" && echo "$pid"
}

# stop_pid NAME PIDFILE [TIMEOUT_S]: SIGTERM, wait, SIGKILL; only the pid from our pid file, only if comm matches
stop_pid() {
    local name="$1" pidfile="$2" timeout="${3:-10}" pid i
    pid="$(running "$name" "$pidfile")" || { rm -f "$pidfile"; return 0; }
    kill -TERM "$pid" 2>/dev/null || true
    for ((i = 0; i < timeout * 10; i++)); do
        pid_alive "$pid" "$name" || { log "stopped $name (pid $pid)"; rm -f "$pidfile"; return 0; }
        sleep 0.1
    done
    log "$name (pid $pid) ignored SIGTERM for ${timeout}s: SIGKILL"
    kill -KILL "$pid" 2>/dev/null || true
    for ((i = 0; i < 50; i++)); do pid_alive "$pid" "$name" || break; sleep 0.1; done
    rm -f "$pidfile"
}

conf_value() { [[ -f "$CONF" ]] && sed -n "s/^$1=//p" "$CONF" | head -n1 || true; }

# The munge socket the cluster uses; own munged iff that socket is inside the state dir.
munge_socket() { local v; v="$(conf_value AuthInfo)"; echo "${v#socket=}"; }
