#!/usr/bin/env bash
# A real one-node Slurm on this machine, for testing jobs/ with sbatch: `make slurm-up`.
#
# Installs Debian's slurm-wlm daemons and munge with apt-get when they are missing,
# then runs, as root and without systemd or cgroups:
#   munged     its key, socket, pid and log under the cluster directory
#   slurmctld  SlurmctldHost=localhost, state under the cluster directory
#   slurmd     this machine as the only node, spool under the cluster directory
# and waits until `sinfo` shows the node idle. Nothing listens beyond this machine's
# own ports (SlurmctldPort, SlurmdPort); no host outside it is named.
#
# Idempotent: when the cluster answers already, it only prints how to reach it.
# cluster/slurm-down.sh stops the daemons and removes the directory.
#
# Variables:
#   RINGMPI_SLURM_DIR    the cluster directory (default ${TMPDIR:-/tmp}/ringmpi-slurm);
#                        its slurm.conf is what SLURM_CONF must name for sinfo/sbatch/srun
#   RINGMPI_SLURM_CPUS   CPUs the node declares (default 8, at least the real count): more
#                        than the machine has, so that a 4- or 8-rank job runs on 2 cores
#                        (SlurmdParameters=config_overrides lets slurmd believe it)
#   RINGMPI_SLURM_PORT   slurmctld's port; slurmd takes the next one (default 6817)
#   RINGMPI_SLURM_WAIT   seconds to wait for the node to come up (default 60)
set -euo pipefail

dir=${RINGMPI_SLURM_DIR:-${TMPDIR:-/tmp}/ringmpi-slurm}
port=${RINGMPI_SLURM_PORT:-6817}
wait_s=${RINGMPI_SLURM_WAIT:-60}
node=$(hostname -s)
real_cpus=$(nproc --all)
cpus=${RINGMPI_SLURM_CPUS:-8}
if ((cpus < real_cpus)); then
  cpus=$real_cpus
fi
conf=$dir/slurm.conf
export SLURM_CONF=$conf

say() { printf 'slurm-up: %s\n' "$*"; }
die() {
  printf 'slurm-up: error: %s\n' "$*" >&2
  exit 1
}

answers() { timeout 10 sinfo --noheader -o '%t' 2>/dev/null | grep -q .; }

if [[ -f $conf ]] && command -v sinfo >/dev/null && answers; then
  say "already up: export SLURM_CONF=$conf"
  exit 0
fi

# --- packages ----------------------------------------------------------------------
missing=()
for pair in slurmctld:slurmctld slurmd:slurmd sinfo:slurm-client munged:munge; do
  command -v "${pair%%:*}" >/dev/null || missing+=("${pair#*:}")
done
if ((${#missing[@]})); then
  [[ $(id -u) == 0 ]] || die "needs root to install ${missing[*]} (or install them first)"
  say "installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  # Another apt-get may hold the lock for a while: wait for it instead of failing.
  apt_get=(apt-get -q -o DPkg::Lock::Timeout=600)
  "${apt_get[@]}" install -y --no-install-recommends "${missing[@]}" >/dev/null \
    || { "${apt_get[@]}" update >/dev/null \
      && "${apt_get[@]}" install -y --no-install-recommends "${missing[@]}" >/dev/null; }
fi
[[ $(id -u) == 0 ]] || die "runs the daemons as root (SlurmUser=root): run it as root"

# --- a fresh directory (a half-started earlier try is stopped first) ---------------
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
RINGMPI_SLURM_DIR=$dir "$here/slurm-down.sh" >/dev/null 2>&1 || true
mkdir -p "$dir"/{munge,state,log,run} "$dir/spool/$node"
chmod 700 "$dir/munge"

# --- munge: its own key and socket, so that it touches nothing of a system munged ---
socket=$dir/munge/munge.socket
dd if=/dev/urandom of="$dir/munge/munge.key" bs=1024 count=1 status=none
chmod 400 "$dir/munge/munge.key"
# --force: munged refuses root and a key directory under /tmp otherwise.
munged --force \
  --key-file="$dir/munge/munge.key" \
  --socket="$socket" \
  --pid-file="$dir/run/munged.pid" \
  --log-file="$dir/log/munged.log" \
  --seed-file="$dir/munge/munge.seed"
munge --socket="$socket" -n </dev/null | unmunge --socket="$socket" >/dev/null \
  || die "munge does not answer on $socket (see $dir/log/munged.log)"

# --- job ids that never repeat on this machine ---------------------------------------
# MPICH names its node's start-up segment (/dev/shm/mpich_shm_*) after the PMI job
# identity, which under srun --mpi=pmi2 comes from the Slurm job id. A step that is
# killed or aborts (MPI_Abort) can leave that segment behind, and a later step under
# the same job id - a restarted cluster counts from 1 again - opens the stale segment
# instead of a new one: its ranks spin in MPI_Init for ever (seen here: after a
# restart job ids 5-11 hung every time until their stale segments were removed). A
# site's job ids do not repeat; here each start takes a fresh block of 100,000 ids,
# counted in a file that lives as long as such segments do: in /dev/shm.
ids=/dev/shm/ringmpi-slurm-next-job-id
first_job_id=$(cat "$ids" 2>/dev/null || echo 1)
[[ $first_job_id =~ ^[0-9]+$ ]] && ((first_job_id < 60000000)) || first_job_id=1
echo $((first_job_id + 100000)) >"$ids"

# --- slurm.conf ---------------------------------------------------------------------
cat >"$conf" <<EOF
# Written by cluster/slurm-up.sh: one node, this machine; removed by slurm-down.sh.
ClusterName=ringmpi
SlurmctldHost=localhost
SlurmctldPort=$port
SlurmdPort=$((port + 1))
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$socket
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool/%n
SlurmctldPidFile=$dir/run/slurmctld.pid
SlurmdPidFile=$dir/run/slurmd-%n.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd-%n.log
# No systemd, no cgroups: processes tracked by their parent, no task binding.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
# The node declares RINGMPI_SLURM_CPUS CPUs whatever the hardware has (oversubscribed).
SlurmdParameters=config_overrides
MpiDefault=none
ReturnToService=2
SlurmdTimeout=60
InactiveLimit=0
KillWait=5
MinJobAge=600
FirstJobId=$first_job_id
NodeName=$node NodeHostname=$node NodeAddr=127.0.0.1 CPUs=$cpus State=UNKNOWN
PartitionName=debug Nodes=$node Default=YES MaxTime=60 State=UP OverSubscribe=NO
EOF
# srun/sbatch look for cgroup.conf and plugstack.conf next to slurm.conf.
: >"$dir/plugstack.conf"

# --- the daemons ------------------------------------------------------------------
slurmctld -f "$conf" -i
slurmd -f "$conf" -N "$node"

for ((i = 0; i < wait_s; i++)); do
  state=$(timeout 10 sinfo --noheader -n "$node" -o '%t' 2>/dev/null || true)
  if [[ $state == idle* ]]; then
    say "node $node idle ($cpus CPUs declared, $real_cpus real) after ${i} s"
    say "export SLURM_CONF=$conf"
    exit 0
  fi
  sleep 1
done
tail -n 20 "$dir/log/slurmctld.log" "$dir/log/slurmd-$node.log" >&2 || true
die "node $node not idle after $wait_s s (state: ${state:-no answer})"
