#!/usr/bin/env bash
# A one-node Slurm cluster on this machine, for the tests marked `slurm` and for trying longctx on
# Slurm without a cluster: Debian's slurm-wlm and munge, configured for the node "localhost" (2 CPUs,
# one partition "debug"), no cgroups, no accounting. Every file (config, munge key and socket, state,
# spool, logs, pid files) lives under one folder, LONGCTX_SLURM_DIR (default /tmp/longctx-slurm);
# nothing under /etc is changed. Idempotent: when the cluster already answers, it is left as it is.
# Needs root (slurmd runs jobs as their submitter). tests/cluster/slurm_down.sh stops it and removes
# the folder.
#
#   tests/cluster/slurm_up.sh            # prints the line to use it: export SLURM_CONF=...
#   export SLURM_CONF=/tmp/longctx-slurm/slurm.conf; sinfo; sbatch ...
set -euo pipefail

DIR=${LONGCTX_SLURM_DIR:-/tmp/longctx-slurm}
CPUS=${LONGCTX_SLURM_CPUS:-2}
CONF=$DIR/slurm.conf
export SLURM_CONF=$CONF

for cmd in munged slurmctld slurmd sbatch sinfo scontrol; do
    command -v "$cmd" >/dev/null || {
        echo "slurm_up.sh: $cmd not found; install Debian's slurm-wlm and munge (apt-get install slurm-wlm munge)" >&2
        exit 2
    }
done
if [ "$(id -u)" != 0 ]; then
    echo "slurm_up.sh: must run as root (slurmd starts jobs as the user who submitted them)" >&2
    exit 2
fi

if [ -f "$CONF" ] && timeout 5 sinfo -h -n localhost -o %T 2>/dev/null | grep -qE '^(idle|mixed|allocated)'; then
    echo "export SLURM_CONF=$CONF"
    exit 0
fi

mkdir -p "$DIR"/{munge,ctld,spool,log}
chmod 0755 "$DIR"
chmod 0700 "$DIR/munge"
if [ ! -s "$DIR/munge/munge.key" ]; then
    dd if=/dev/urandom of="$DIR/munge/munge.key" bs=1024 count=1 status=none
    chmod 0400 "$DIR/munge/munge.key"
fi
# memory Slurm may hand out: half of this machine's, in MB
MEM=$(awk '/MemTotal/ {print int($2 / 2048)}' /proc/meminfo)
free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
if [ ! -f "$CONF" ]; then
    cat >"$CONF.tmp" <<CONF
# written by tests/cluster/slurm_up.sh: one node, localhost
ClusterName=longctx
SlurmctldHost=localhost
SlurmctldPort=$(free_port)
SlurmdPort=$(free_port)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$DIR/munge/munge.socket
StateSaveLocation=$DIR/ctld
SlurmdSpoolDir=$DIR/spool
SlurmctldPidFile=$DIR/slurmctld.pid
SlurmdPidFile=$DIR/slurmd.pid
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdLogFile=$DIR/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SlurmdParameters=config_overrides
ReturnToService=2
MinJobAge=60
KillWait=5
InactiveLimit=0
NodeName=localhost NodeAddr=127.0.0.1 CPUs=$CPUS RealMemory=$MEM State=UNKNOWN
PartitionName=debug Nodes=localhost Default=YES MaxTime=INFINITE State=UP
CONF
    mv "$CONF.tmp" "$CONF"
fi

pid_alive() { [ -f "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }
pid_alive "$DIR/munge/munged.pid" || munged --force \
    --socket="$DIR/munge/munge.socket" --key-file="$DIR/munge/munge.key" \
    --pid-file="$DIR/munge/munged.pid" --log-file="$DIR/log/munged.log" --seed-file="$DIR/munge/munged.seed"
pid_alive "$DIR/slurmctld.pid" || slurmctld -f "$CONF"
pid_alive "$DIR/slurmd.pid" || slurmd -f "$CONF" -N localhost

# wait for the node to be ready (it registers with the controller within seconds)
for _ in $(seq 1 60); do
    if sinfo -h -n localhost -o %T 2>/dev/null | grep -qE '^(idle|mixed|allocated)'; then
        echo "export SLURM_CONF=$CONF"
        exit 0
    fi
    sleep 0.5
done
echo "slurm_up.sh: the node did not come up; see $DIR/log/" >&2
tail -n 5 "$DIR"/log/*.log >&2 || true
exit 1
