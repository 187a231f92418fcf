#!/usr/bin/env bash
# Make N emulated hosts on this machine, for running MPI jobs across "nodes".
#
#   cluster/hosts-up.sh N [--delay 50us] [--rate 10gbit]
#
# Host i is ringmpi-h<i>: its own network namespace (ip netns), UTS namespace
# (its hostname is ringmpi-h<i>) and IPC namespace, kept alive by bind mounts in
# the state directory, so no process has to stay running. Its interface rmnet0
# (one end of a veth pair; the other end is in the bridge rmbr0 of the root
# namespace) has 10.77.0.<i>/24; the bridge has 10.77.0.254/24, so mpirun in the
# root namespace reaches every host and the hosts reach each other over a real
# TCP/IP stack. The names are added to /etc/hosts (a marked block) so that the
# launcher and MPI resolve them, and listed one per line in STATE/hostfile.
#
# --delay and --rate shape every host's rmnet0 (its egress), so that a message
# from one host to another is delayed once and limited to the rate of the
# sender's link, as a fabric of that latency and bandwidth would: a netem qdisc
# with --delay (the kernel needs sch_netem), a tbf qdisc with --rate alone. The
# qdisc is tried on a scratch veth pair first, so a kernel without it fails
# before anything is made. Without them the links keep the kernel's default.
#
# Idempotent: it creates what is missing, fixes what is set differently, and
# removes hosts numbered above N. cluster/hosts-down.sh removes everything.
# cluster/host-agent.sh HOST CMD... runs a command on a host (mpirun's launcher).
#
# Environment: RINGMPI_HOSTS_STATE (default /run/ringmpi-hosts) and
# RINGMPI_HOSTS_NET (the /24's first three octets, default 10.77.0).
set -euo pipefail

STATE=${RINGMPI_HOSTS_STATE:-/run/ringmpi-hosts}
NET=${RINGMPI_HOSTS_NET:-10.77.0}
BRIDGE=rmbr0
IFACE=rmnet0
MARK="# ringmpi-hosts"
MAX=32

usage() {
    echo "usage: $0 N [--delay TIME] [--rate RATE]   (1 <= N <= $MAX; e.g. --delay 50us --rate 10gbit)" >&2
    exit 2
}

[ $# -ge 1 ] || usage
count=$1
shift
if ! [[ $count =~ ^[0-9]+$ ]] || [ "$count" -lt 1 ] || [ "$count" -gt $MAX ]; then usage; fi
delay=""
rate=""
while [ $# -gt 0 ]; do
    case $1 in
    --delay) [ $# -ge 2 ] || usage; delay=$2; shift 2 ;;
    --rate) [ $# -ge 2 ] || usage; rate=$2; shift 2 ;;
    *) usage ;;
    esac
done

if [ "$(id -u)" -ne 0 ]; then
    echo "$0: needs root (CAP_NET_ADMIN and CAP_SYS_ADMIN) for namespaces" >&2
    exit 1
fi
for tool in ip nsenter unshare tc mountpoint; do
    command -v "$tool" >/dev/null || { echo "$0: $tool not found (iproute2, util-linux)" >&2; exit 1; }
done

# The subnet must be ours alone: no address or route of another interface in it.
others=$(ip -o -4 addr show | awk -v net="$NET." -v br="$BRIDGE" '$2 != br && index($4, net) == 1')
routes=$(ip -4 route show | awk -v net="$NET." -v br="$BRIDGE" 'index($1, net) == 1 && $0 !~ ("dev " br " ")')
if [ -n "$others$routes" ]; then
    echo "$0: $NET.0/24 is already used here; choose another with RINGMPI_HOSTS_NET:" >&2
    printf '%s\n' "$others" "$routes" >&2
    exit 1
fi

# The fabric's qdisc (arguments to `tc qdisc replace dev IF root`), tried before anything is made.
shape=()
if [ -n "$delay" ]; then
    shape=(netem limit 100000 delay "$delay" ${rate:+rate "$rate"})
elif [ -n "$rate" ]; then
    # A bucket of 256 KiB holds a few of the 64 KiB segments a veth passes whole.
    shape=(tbf rate "$rate" burst 256kb latency 50ms)
fi
if [ ${#shape[@]} -gt 0 ]; then
    ip link del rmtry0 2>/dev/null || true
    ip link add rmtry0 type veth peer name rmtry1
    if ! err=$(tc qdisc replace dev rmtry0 root "${shape[@]}" 2>&1); then
        ip link del rmtry0
        echo "$0: this kernel cannot shape the links with '${shape[*]}': $err" >&2
        [ -n "$delay" ] && echo "$0: --delay needs the sch_netem module; --rate alone uses tbf" >&2
        exit 1
    fi
    ip link del rmtry0
fi

mkdir -p "$STATE"

# The bridge, in the root namespace, with the address mpirun's proxies connect back to.
ip link show "$BRIDGE" >/dev/null 2>&1 || ip link add "$BRIDGE" type bridge
ip addr replace "$NET.254/24" dev "$BRIDGE"
ip link set "$BRIDGE" up

# A persistent namespace of type $2 ("uts" or "ipc") bound to file $1.
persistent() {
    mountpoint -q "$1" && return 0
    touch "$1"
    unshare "--$2=$1" true
}

up_host() {
    local i=$1 host="ringmpi-h$1" peer="rmh$1"
    ip netns list | grep -qx "$host\( .*\)\?" || ip netns add "$host"
    ip -n "$host" link set lo up
    if ! ip -n "$host" link show "$IFACE" >/dev/null 2>&1; then
        ip link del "$peer" 2>/dev/null || true
        ip link add "$peer" type veth peer name "$IFACE" netns "$host"
    fi
    ip link set "$peer" master "$BRIDGE" up
    ip -n "$host" addr replace "$NET.$i/24" dev "$IFACE"
    ip -n "$host" link set "$IFACE" up
    # The fabric: one netem on the host's egress, or none.
    if [ ${#shape[@]} -gt 0 ]; then
        tc -n "$host" qdisc replace dev "$IFACE" root "${shape[@]}"
    else
        tc -n "$host" qdisc del dev "$IFACE" root 2>/dev/null || true
    fi
    persistent "$STATE/$host.uts" uts
    persistent "$STATE/$host.ipc" ipc
    nsenter --uts="$STATE/$host.uts" hostname "$host"
}

down_host() {
    local host=$1
    for kind in uts ipc; do
        if mountpoint -q "$STATE/$host.$kind"; then umount "$STATE/$host.$kind"; fi
        rm -f "$STATE/$host.$kind"
    done
    ip netns del "$host" 2>/dev/null || true # takes its veth pair with it
}

for ((i = 1; i <= count; i++)); do
    up_host "$i"
done
# Hosts numbered above N, from an earlier, larger call.
for file in "$STATE"/ringmpi-h*.uts; do
    [ -e "$file" ] || continue
    host=$(basename "$file" .uts)
    [ "${host#ringmpi-h}" -gt "$count" ] && down_host "$host"
done
for host in $(ip netns list | awk '{print $1}' | grep '^ringmpi-h[0-9]*$' || true); do
    [ "${host#ringmpi-h}" -gt "$count" ] && down_host "$host"
done

# Names: STATE/hostfile for the launcher, and /etc/hosts for every resolver. /etc/hosts
# is rewritten in place (not renamed over): a container often bind-mounts it.
hosts=$(grep -v "$MARK\$" /etc/hosts || true)
{
    printf '%s\n' "$hosts"
    echo "$NET.254 ringmpi-root $MARK"
    for ((i = 1; i <= count; i++)); do echo "$NET.$i ringmpi-h$i $MARK"; done
} >"$STATE/etc-hosts.new"
cat "$STATE/etc-hosts.new" >/etc/hosts
rm -f "$STATE/etc-hosts.new"
for ((i = 1; i <= count; i++)); do echo "ringmpi-h$i"; done >"$STATE/hostfile"
echo "$delay $rate" >"$STATE/fabric"

# Check: every host has its name.
for ((i = 1; i <= count; i++)); do
    host="ringmpi-h$i"
    got=$(nsenter --uts="$STATE/$host.uts" hostname)
    [ "$got" = "$host" ] || { echo "$0: $host calls itself $got" >&2; exit 1; }
done
echo "hosts up: $(paste -sd ' ' "$STATE/hostfile") (${delay:-no delay}, ${rate:-no rate limit}; state in $STATE)"
