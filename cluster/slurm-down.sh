#!/usr/bin/env bash
# Stops what cluster/slurm-up.sh started (slurmd, slurmctld, munged, by their pid files)
# and removes the cluster directory: `make slurm-down`. Idempotent.
#
# Variables: RINGMPI_SLURM_DIR (default ${TMPDIR:-/tmp}/ringmpi-slurm), as for slurm-up.sh.
set -euo pipefail

dir=${RINGMPI_SLURM_DIR:-${TMPDIR:-/tmp}/ringmpi-slurm}
[[ -d $dir ]] || exit 0
# Refuse to remove anything that slurm-up.sh did not make.
[[ -f $dir/slurm.conf || -d $dir/munge ]] || {
  printf 'slurm-down: %s holds no cluster of slurm-up.sh; left alone\n' "$dir" >&2
  exit 1
}

stop() {  # stop PIDFILE: TERM, then KILL after 10 s
  local pid
  [[ -f $1 ]] || return 0
  pid=$(<"$1")
  [[ $pid =~ ^[0-9]+$ ]] || return 0
  kill -TERM "$pid" 2>/dev/null || return 0
  for _ in $(seq 100); do
    kill -0 "$pid" 2>/dev/null || return 0
    sleep 0.1
  done
  kill -KILL "$pid" 2>/dev/null || true
}

# Jobs first, so that no step outlives its slurmd.
if [[ -f $dir/slurm.conf ]] && command -v scancel >/dev/null; then
  SLURM_CONF=$dir/slurm.conf timeout 10 scancel --full --quiet --user="$(id -un)" \
    2>/dev/null || true
fi
for pidfile in "$dir"/run/slurmd-*.pid "$dir/run/slurmctld.pid" "$dir/run/munged.pid"; do
  stop "$pidfile"
done
rm -rf "$dir"
printf 'slurm-down: stopped and removed %s\n' "$dir"
