#!/usr/bin/env bash
# Stop the single-node SLURM cluster started by start.sh: cancel jobs, then slurmd, slurmctld and (our own)
# munged, each by the pid in its pid file. Idempotent; leaves no daemon (or job step) processes behind.
# Saved controller state (job ids, finished jobs, jobcomp.log) stays in the state dir for the next start.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

if [[ ! -d "$STATE" ]]; then
    log "not running (no state dir $STATE)"
    exit 0
fi
export SLURM_CONF="$CONF"
lock_state

sweep_leftovers() {
    local d pid comm env stat mine=" $$ " p=$$
    while [[ "$p" -gt 1 ]]; do
        stat="$(cat "/proc/$p/stat" 2>/dev/null)" || break
        read -r _ p _ <<<"${stat##*) }"
        mine+="$p "
    done
    for d in /proc/[0-9]*; do
        pid="${d#/proc/}"
        [[ "$mine" == *" $pid "* ]] && continue
        env="$({ tr '\0' '\n' <"$d/environ"; } 2>/dev/null)" || continue
        grep -qxF "SLURM_CONF=$CONF" <<<"$env" || continue
        comm="$(cat "$d/comm" 2>/dev/null)" || continue
        [[ "$comm" == slurmstepd ]] || grep -q '^SLURM_JOB_ID=' <<<"$env" || continue
        pid_alive "$pid" "$comm" || continue
        log "killing leftover $comm (pid $pid)"
        kill -KILL "$pid" 2>/dev/null || true
    done
}

if ! running slurmctld "$CTLD_PID" >/dev/null && ! running slurmd "$SLURMD_PID" >/dev/null &&
    ! running munged "$MUNGED_PID" >/dev/null; then
    sweep_leftovers
    log "not running (state dir $STATE)"
    exit 0
fi

# 1. cancel every job that is still pending/running and wait for the steps to finish
if running slurmctld "$CTLD_PID" >/dev/null && scontrol ping 2>/dev/null | grep -q UP; then
    jobs="$(squeue -h -o %A 2>/dev/null | sort -u | tr '\n' ' ' || true)"
    if [[ -n "${jobs// /}" ]]; then
        log "cancelling jobs: $jobs"
        # shellcheck disable=SC2086
        scancel $jobs 2>/dev/null || true
        kill_wait="$(conf_value KillWait | grep . || echo 30)"
        for ((i = 0; i < (kill_wait + 10) * 10; i++)); do
            [[ -z "$(squeue -h -o %A 2>/dev/null || true)" ]] && break
            sleep 0.1
        done
        left="$(squeue -h -o '%A %T' 2>/dev/null | tr '\n' ' ' || true)"
        [[ -z "$left" ]] || log "jobs still not finished, stopping anyway: $left"
    fi
fi

# 2. daemons, by pid
stop_pid slurmd "$SLURMD_PID"
stop_pid slurmctld "$CTLD_PID"
stop_pid munged "$MUNGED_PID"
sock_dir="$(dirname "$(munge_socket)")"
[[ "$sock_dir" == /tmp/forge-munge-* ]] && rm -rf "$sock_dir"

# 3. steps and job processes that outlived slurmd (normally none: step 1 waited for them). They are recognised by
#    this cluster's SLURM_CONF in their environment (slurmstepd inherits it from slurmd, job processes from sbatch)
#    plus SLURM_JOB_ID for job processes; our own ancestors are spared (stop.sh run from inside a job).
sweep_leftovers
log "stopped (state kept in $STATE)"
