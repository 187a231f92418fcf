#!/usr/bin/env bash
# Remove the emulated hosts of cluster/hosts-up.sh: their namespaces (and so their
# veth pairs and netem qdiscs), the bridge, the /etc/hosts block and the state
# directory. Safe to run when nothing, or only part, is up.
set -euo pipefail

STATE=${RINGMPI_HOSTS_STATE:-/run/ringmpi-hosts}
BRIDGE=rmbr0
MARK="# ringmpi-hosts"

if [ "$(id -u)" -ne 0 ]; then
    echo "$0: needs root" >&2
    exit 1
fi

# Processes still running on a host (a job that did not end) would keep its
# namespaces alive after the names are gone: end them first.
for host in $(ip netns list | awk '{print $1}' | grep '^ringmpi-h[0-9]*$' || true); do
    pids=$(ip netns pids "$host" || true)
    if [ -n "$pids" ]; then
        echo "ending processes left on $host: $pids" >&2
        # shellcheck disable=SC2086 # one pid per word
        kill $pids 2>/dev/null || true
        sleep 1
        # shellcheck disable=SC2086
        kill -9 $pids 2>/dev/null || true
    fi
    ip netns del "$host"
done
if [ -d "$STATE" ]; then
    for file in "$STATE"/ringmpi-h*.uts "$STATE"/ringmpi-h*.ipc; do
        [ -e "$file" ] || continue
        if mountpoint -q "$file"; then umount "$file"; fi
        rm -f "$file"
    done
    rm -f "$STATE/hostfile" "$STATE/fabric"
    rmdir "$STATE" 2>/dev/null || true
fi
if ip link show "$BRIDGE" >/dev/null 2>&1; then ip link del "$BRIDGE"; fi
for peer in $(ip -o link show | awk -F': ' '{print $2}' | sed 's/@.*//' | grep '^rmh[0-9]*$' || true); do
    ip link del "$peer"
done
if grep -q "$MARK\$" /etc/hosts; then
    kept=$(grep -v "$MARK\$" /etc/hosts || true)
    printf '%s\n' "$kept" >/etc/hosts
fi
echo "hosts down"
