#!/usr/bin/env bash
# A one-node Slurm cluster on this machine, for tests/test_slurm.py and for trying the Slurm launcher
# by hand (docs/slurm.md). The README's test command runs it first:
#
#   slurm/start_test_cluster.sh     # idempotent: installs what is missing, leaves a cluster that answers alone
#
# A cluster that answers (this one, or a real one's login node) needs nothing more. Otherwise it needs
# root: run as another user, it runs itself again under sudo; on a machine without Slurm it installs
# Debian's packages (slurm-wlm, munge; procps for pgrep) with apt-get.
# The node is this machine (`hostname`) with its CPUs, in one partition `debug`; no GPUs, no
# accounting daemon (status comes from squeue and the run directories, never sacct).
set -euo pipefail

answers() {
    command -v scontrol >/dev/null && scontrol ping 2>/dev/null | grep -q UP &&
        sinfo -h -o %t 2>/dev/null | grep -qE '^(idle|mix|alloc|comp)'
}
if answers; then
    echo "a Slurm cluster already answers: $(sinfo -h -o '%P %D node(s) %c CPUs %t')"
    exit 0
fi
if [ "$(id -u)" != 0 ]; then
    command -v sudo >/dev/null || { echo "error: $0 needs root (apt-get, the daemons): run it as root, or install sudo" >&2; exit 1; }
    exec sudo bash "$0" "$@"
fi
missing=()
for tool in munged slurmctld slurmd sbatch pgrep; do
    command -v "$tool" >/dev/null || missing+=("$tool")
done
if [ ${#missing[@]} -gt 0 ]; then
    command -v apt-get >/dev/null || { echo "error: no ${missing[*]} and no apt-get: install Slurm and munge with this system's package manager" >&2; exit 1; }
    echo "no ${missing[*]}: installing slurm-wlm munge procps with apt-get"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq slurm-wlm munge procps >/dev/null
fi
if answers; then  # daemons the packages started
    echo "a Slurm cluster already answers: $(sinfo -h -o '%P %D node(s) %c CPUs %t')"
    exit 0
fi

node=$(hostname)
# nproc alone obeys OMP_NUM_THREADS (CI sets it to 1): the node would offer one CPU, one run at a time.
cpus=$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc)
mkdir -p /etc/slurm /var/spool/slurmctld /var/spool/slurmd /var/log/slurm /run/munge
cat > /etc/slurm/slurm.conf <<EOF
ClusterName=test
SlurmctldHost=$node
SlurmUser=root
AuthType=auth/munge
# A requeued job may start again after cred_expire + 1 s (default 120 s): Slurm's shortest, for the tests
AuthInfo=cred_expire=5
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
StateSaveLocation=/var/spool/slurmctld
SlurmdSpoolDir=/var/spool/slurmd
SlurmctldPidFile=/run/slurmctld.pid
SlurmdPidFile=/run/slurmd.pid
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd.log
ReturnToService=2
JobRequeue=1
MinJobAge=60
KillWait=30
# the main scheduler looks at pending (requeued) jobs every second, not every 60 s
SchedulerParameters=sched_interval=1
NodeName=$node CPUs=$cpus State=UNKNOWN
PartitionName=debug Nodes=$node Default=YES MaxTime=INFINITE State=UP
EOF

# munged refuses to run as root: run it as its own user, with its socket directory.
chown munge:munge /run/munge
pgrep -x munged >/dev/null || runuser -u munge -- munged
pgrep -x slurmctld >/dev/null || slurmctld
pgrep -x slurmd >/dev/null || slurmd
for _ in $(seq 30); do
    if sinfo -h -o %t 2>/dev/null | grep -qE '^(idle|mix|alloc|comp)'; then
        echo "Slurm cluster up: $(sinfo -h -o '%P %D node(s) %c CPUs %t')"
        exit 0
    fi
    scontrol update nodename="$node" state=resume 2>/dev/null || true
    sleep 1
done
echo "the cluster did not come up: see /var/log/slurm/slurmctld.log and slurmd.log" >&2
exit 1
