#!/usr/bin/env bash
# A one-node SLURM cluster on this machine, to try the slurm launcher on a workstation
# (docs/reproducing.md, "Trying the SLURM path on one machine"):
#
#     bash scripts/local_slurm.sh start     # prints its folder and the SLURM_CONF to export
#     bash scripts/local_slurm.sh status
#     bash scripts/local_slurm.sh stop      # cancels the cluster's jobs, stops its daemons
#
# Runs as root (slurmd starts each job as its user). `start` installs slurmctld, slurmd and munge
# with apt-get when they are missing, then starts munged, slurmctld and slurmd with everything
# under one folder, LOCAL_SLURM_DIR (default /tmp/packedss-slurm): slurm.conf, the munge key and
# socket, state and spool directories, logs and pid files. The node is this host with its own
# CPU count and memory (as `slurmd -C` reads them; LOCAL_SLURM_CPUS=N offers fewer CPUs), one
# partition `local`, no accounting (sacct answers that accounting is disabled) and no cgroups
# (proctrack/linuxproc, task/none). `stop` ends only the daemons whose pid files are in that
# folder. Clients (sbatch, squeue, submitit, run.py) find the cluster through SLURM_CONF.
#
# Exit status: 0 done; 1 the cluster did not come up (its logs are named); 2 bad usage; 3 SLURM
# cannot be had on this machine (not root, not installed and no apt-get, or the install failed).
set -euo pipefail

DIR="$(realpath -m "${LOCAL_SLURM_DIR:-/tmp/packedss-slurm}")"
CONF="$DIR/slurm.conf"
SOCKET="$DIR/munge/munge.socket"
PARTITION=local
DAEMONS=(slurmd slurmctld munged)   # the order `stop` ends them in
PACKAGES=(slurmctld slurmd slurm-client munge)
export SLURM_CONF="$CONF"
export PATH="$PATH:/usr/sbin:/sbin"  # the daemons, where a login shell leaves them out

fail() {  # status, then the message: one line on stderr
    local status=$1
    shift
    echo "error: $*" >&2
    exit "$status"
}

pid_of() {  # the pid in the daemon's pid file when that process is alive and is this folder's daemon
    local file="$DIR/run/$1.pid" pid command
    [[ -s $file ]] || return 1
    pid=$(<"$file")
    [[ $pid =~ ^[0-9]+$ && -r /proc/$pid/cmdline ]] || return 1
    command=$(tr '\0' ' ' <"/proc/$pid/cmdline")
    [[ $command == *"$1"* && $command == *"$DIR/"* ]] || return 1  # not a reused pid
    echo "$pid"
}

install_packages() {
    local missing=() tool log="$DIR/log/apt-get.log"
    for tool in slurmctld slurmd munged sbatch srun squeue scontrol; do
        command -v "$tool" >/dev/null || missing+=("$tool")
    done
    [[ ${#missing[@]} -eq 0 ]] && return 0
    [[ $(id -u) -eq 0 ]] || fail 3 "${missing[*]} not installed and not root; install ${PACKAGES[*]} (Debian/Ubuntu: sudo apt-get install ${PACKAGES[*]})"
    command -v apt-get >/dev/null || fail 3 "${missing[*]} not installed and apt-get not found; install SLURM (slurmctld, slurmd, its clients) and munge with this system's package manager"
    echo "installing ${PACKAGES[*]} with apt-get (log: $log)" >&2
    export DEBIAN_FRONTEND=noninteractive
    if ! apt-get install -y -q --no-install-recommends "${PACKAGES[@]}" >"$log" 2>&1; then
        # a fresh machine may have no package lists yet
        { apt-get update -q && apt-get install -y -q --no-install-recommends "${PACKAGES[@]}"; } >>"$log" 2>&1 ||
            fail 3 "apt-get could not install ${PACKAGES[*]} ($(grep -E '^E:' "$log" | tail -1 || true)); see $log"
    fi
}

port_in_use() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

free_port() {  # the first port from $1 on that nothing listens on
    local port=$1
    while port_in_use "$port"; do port=$((port + 1)); done
    echo "$port"
}

read_node() {  # NODE, CPUS and MEMORY (MB) of this machine, as slurmd reads them
    local detected
    NODE=$(hostname -s)
    detected=$(slurmd -C | head -1)
    CPUS=$(sed -n 's/.* CPUs=\([0-9]*\).*/\1/p' <<<"$detected")
    MEMORY=$(sed -n 's/.* RealMemory=\([0-9]*\).*/\1/p' <<<"$detected")
    if [[ -n ${LOCAL_SLURM_CPUS:-} ]]; then
        [[ $LOCAL_SLURM_CPUS =~ ^[1-9][0-9]*$ ]] && ((LOCAL_SLURM_CPUS <= CPUS)) ||
            fail 2 "LOCAL_SLURM_CPUS=$LOCAL_SLURM_CPUS is not a CPU count from 1 to this machine's $CPUS; unset it or lower it"
        CPUS=$LOCAL_SLURM_CPUS
    fi
}

write_conf() {
    local ctld_port slurmd_port
    ctld_port=$(free_port 6817)
    slurmd_port=$(free_port $((ctld_port + 1)))
    cat >"$CONF" <<EOF
# Written by scripts/local_slurm.sh: a one-node cluster, everything under $DIR.
ClusterName=packedss
SlurmctldHost=$NODE(127.0.0.1)
SlurmctldPort=$ctld_port
SlurmdPort=$slurmd_port
SlurmUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$SOCKET
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/spool
SlurmctldPidFile=$DIR/run/slurmctld.pid
SlurmdPidFile=$DIR/run/slurmd.pid
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdLogFile=$DIR/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU_Memory
SchedulerType=sched/builtin
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
MpiDefault=none
ReturnToService=2
KillWait=10
MinJobAge=600
NodeName=$NODE NodeAddr=127.0.0.1 CPUs=$CPUS RealMemory=$MEMORY State=UNKNOWN
PartitionName=$PARTITION Nodes=$NODE Default=YES MaxTime=INFINITE State=UP
EOF
}

start_munged() {
    pid_of munged >/dev/null && return 0
    if [[ ! -s $DIR/munge/munge.key ]]; then
        head -c 1024 /dev/urandom >"$DIR/munge/munge.key"
        chmod 400 "$DIR/munge/munge.key"
    fi
    munged --key-file="$DIR/munge/munge.key" --socket="$SOCKET" --pid-file="$DIR/run/munged.pid" \
        --log-file="$DIR/log/munged.log" --seed-file="$DIR/munge/munged.seed" </dev/null >>"$DIR/log/munged.out" 2>&1 ||
        fail 1 "munged did not start; see $DIR/log/munged.log and $DIR/log/munged.out"
}

wait_for_node() {  # until the node takes jobs (slurmd registered), at most 60 s
    local state=""
    for _ in $(seq 120); do
        state=$(sinfo --noheader --node="$NODE" --format=%t 2>/dev/null || true)
        [[ $state =~ ^(idle|mix|alloc) ]] && return 0
        sleep 0.5
    done
    fail 1 "the node did not come up (state: ${state:-unknown}); see $DIR/log/slurmctld.log and $DIR/log/slurmd.log, then run $0 stop"
}

start() {
    [[ $(id -u) -eq 0 ]] || fail 3 "a local SLURM cluster needs root (slurmd starts each job as its user); run this as root or with sudo"
    mkdir -p "$DIR"/{log,run,state,spool,munge}
    chmod 755 "$DIR/munge"  # munged: its socket directory must be searchable by all
    install_packages
    if pid_of slurmctld >/dev/null && pid_of slurmd >/dev/null && pid_of munged >/dev/null; then
        echo "a local SLURM cluster is already running in $DIR"
    else
        for daemon in slurmd slurmctld; do
            pid_of "$daemon" >/dev/null && fail 1 "$daemon of $DIR runs without the rest of the cluster; run $0 stop first"
        done
        read_node
        start_munged
        write_conf
        rm -rf "$DIR/state"/* "$DIR/spool"/*  # a fresh cluster: `stop` cancelled every job
        slurmctld -f "$CONF" </dev/null >>"$DIR/log/slurmctld.out" 2>&1 ||
            fail 1 "slurmctld did not start; see $DIR/log/slurmctld.log and $DIR/log/slurmctld.out, then run $0 stop"
        slurmd -f "$CONF" -N "$NODE" </dev/null >>"$DIR/log/slurmd.out" 2>&1 ||
            fail 1 "slurmd did not start; see $DIR/log/slurmd.log and $DIR/log/slurmd.out, then run $0 stop"
        wait_for_node
        echo "a local SLURM cluster runs in $DIR (node $NODE with $CPUS CPUs and $MEMORY MB, partition $PARTITION)"
    fi
    echo "export SLURM_CONF=$CONF"
}

stop() {
    local daemon pid jobs
    if pid_of slurmctld >/dev/null; then
        jobs=$(squeue --noheader --format=%A 2>/dev/null || true)
        if [[ -n $jobs ]]; then
            # shellcheck disable=SC2086  # one job id a word
            scancel $jobs 2>/dev/null || true
            for _ in $(seq 40); do
                [[ -z $(squeue --noheader --format=%A 2>/dev/null || true) ]] && break
                sleep 0.5
            done
        fi
    fi
    for daemon in "${DAEMONS[@]}"; do
        pid=$(pid_of "$daemon") || continue
        kill "$pid"
        for _ in $(seq 40); do
            kill -0 "$pid" 2>/dev/null || break
            sleep 0.25
        done
        kill -0 "$pid" 2>/dev/null && kill -KILL "$pid"
        rm -f "$DIR/run/$daemon.pid"
        echo "stopped $daemon (pid $pid)"
    done
}

status() {
    local daemon pid running=0
    for daemon in munged slurmctld slurmd; do
        if pid=$(pid_of "$daemon"); then
            echo "$daemon: running (pid $pid)"
            running=$((running + 1))
        else
            echo "$daemon: not running"
        fi
    done
    [[ $running -eq 3 ]] || return 1
    echo "export SLURM_CONF=$CONF"
    sinfo
    squeue
}

case "${1:-}" in
start) start ;;
stop) stop ;;
status) status ;;
*) fail 2 "unknown command '${1:-}'; use $0 start, status or stop" ;;
esac
