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
# the daemons, by the pids they recorded: SIGTERM to all three, SIGKILL to those alive 10 s later
pids=()
for file in "$DIR/slurmd.pid" "$DIR/slurmctld.pid" "$DIR/munge/munged.pid"; do
    pid=$(cat "$file" 2>/dev/null) || continue
    kill "$pid" 2>/dev/null && pids+=("$pid")
done
for _ in $(seq 1 100); do
    alive=0
    for pid in "${pids[@]}"; do kill -0 "$pid" 2>/dev/null && alive=1; done
    [ $alive = 0 ] && break
    sleep 0.1
done
for pid in "${pids[@]}"; do kill -9 "$pid" 2>/dev/null || true; done
# slurmstepd processes of jobs still running (their slurmd is gone): found by the spool folder they use
for proc in /proc/[0-9]*; do
    if tr '\0' ' ' <"$proc/cmdline" 2>/dev/null | grep -q "^slurmstepd"; then
        if grep -qz "SLURM_CONF=$DIR/slurm.conf" "$proc/environ" 2>/dev/null; then
            kill -9 "${proc#/proc/}" 2>/dev/null || true
        fi
    fi
done
rm -rf "$DIR"
