#!/usr/bin/env bash
# Stops the one-node Slurm cluster of tests/cluster/slurm_up.sh (its slurmd, slurmctld and munged,
# by the pids they recorded, and the job steps slurmd started) and removes its folder.
set -uo pipefail

DIR=${LONGCTX_SLURM_DIR:-/tmp/longctx-slurm}
[ -d "$DIR" ] || exit 0
export SLURM_CONF=$DIR/slurm.conf

# jobs first, so that no job step outlives its slurmd
if [ -f "$SLURM_CONF" ] && command -v scancel >/dev/null; then
    timeout 10 scancel --full --quiet --user "$(id -un)" 2>/dev/null || true
fi
stop() { # pid file: SIGTERM, then SIGKILL after 10 s
    [ -f "$1" ] || return 0
    local pid
    pid=$(cat "$1")
    kill "$pid" 2>/dev/null || return 0
    for _ in $(seq 1 100); do
        kill -0 "$pid" 2>/dev/null || return 0
        sleep 0.1
    done
    kill -9 "$pid" 2>/dev/null || true
}
stop "$DIR/slurmd.pid"
stop "$DIR/slurmctld.pid"
stop "$DIR/munge/munged.pid"
# slurmstepd processes of jobs still running (their slurmd is gone): found by the spool folder they use
for proc in /proc/[0-9]*; do
    if tr '\0' ' ' <"$proc/cmdline" 2>/dev/null | grep -q "^slurmstepd"; then
        if grep -qz "SLURM_CONF=$DIR/slurm.conf" "$proc/environ" 2>/dev/null; then
            kill -9 "${proc#/proc/}" 2>/dev/null || true
        fi
    fi
done
rm -rf "$DIR"
