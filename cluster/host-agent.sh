#!/usr/bin/env bash
# Run a command on an emulated host of cluster/hosts-up.sh, the way ssh runs it on
# a real one: the MPI launcher's agent.
#
#   cluster/host-agent.sh [ssh options] HOST COMMAND...
#
# MPICH's mpirun (hydra) calls it through `-launcher ssh -launcher-exec
# cluster/host-agent.sh` as `AGENT -x HOST '"/path/hydra_pmi_proxy"' --control-port
# ...`; Open MPI's plm_rsh_agent calls it the same way. Options before HOST
# (ssh's -x, -q, -o X, -p N, ...) are ignored. Like ssh, the command words are
# joined with spaces and run by a shell (hydra quotes the proxy's path for that
# shell), here inside HOST's network, UTS and IPC namespaces.
set -euo pipefail

STATE=${RINGMPI_HOSTS_STATE:-/run/ringmpi-hosts}

while [ $# -gt 0 ]; do
    case $1 in
    -[bcDEeFIiJLlmOopQRSWw]) shift 2 ;; # ssh options that take a value
    -*) shift ;;
    *) break ;;
    esac
done
if [ $# -lt 2 ]; then
    echo "usage: $0 [ssh options] HOST COMMAND..." >&2
    exit 255
fi
host=${1%%.*}
shift
if [ ! -e "/run/netns/$host" ] || [ ! -e "$STATE/$host.uts" ]; then
    echo "$0: no emulated host $host (cluster/hosts-up.sh N makes ringmpi-h1..N)" >&2
    exit 255 # what ssh returns when it cannot connect
fi
# `ip netns exec` rather than nsenter --net: it also remounts /sys for the namespace,
# where UCX looks for network interfaces (with the root namespace's /sys it finds
# only lo, and no transport reaches the other hosts).
exec ip netns exec "$host" nsenter --uts="$STATE/$host.uts" --ipc="$STATE/$host.ipc" \
    -- sh -c "$*"
