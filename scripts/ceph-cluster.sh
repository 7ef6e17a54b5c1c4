#!/usr/bin/env bash
# A throwaway single-node Ceph cluster with CephFS, mounted with ceph-fuse, under one directory.
#
#   scripts/ceph-cluster.sh up DIR     start it; prints KEY=VALUE lines (CEPH_CONF, CEPHFS_MOUNT)
#   scripts/ceph-cluster.sh mount DIR NAME  one more ceph-fuse client, at DIR/NAME (another "node")
#   scripts/ceph-cluster.sh down DIR   unmount, stop every daemon it started, remove DIR
#
# One mon on a free loopback port, one mgr, one OSD on memstore (RAM, nothing on disk),
# one MDS, pools of size 1, auth off. Every daemon keeps its pid, socket, log and data
# under DIR, so `down` stops exactly what `up` started and nothing outlives it. Needs
# root (ceph-fuse mounts, daemons bind-mount nothing) and Debian's ceph packages.
set -euo pipefail

usage() { echo "usage: $0 up|down DIR" >&2; exit 2; }
[ $# -ge 2 ] || usage
cmd=$1
dir=$2
conf=$dir/ceph.conf
mnt=$dir/mnt
# memstore keeps the object data in RAM: big enough for bench/pfs's GiB twice over.
store_bytes=${CEPH_MEMSTORE_BYTES:-$((3 * 1024 * 1024 * 1024))}

ceph_() { timeout 60 ceph -c "$conf" "$@"; }

wait_for() {  # wait_for SECONDS DESCRIPTION COMMAND...: poll until COMMAND succeeds
	local limit=$1 what=$2
	shift 2
	local deadline=$((SECONDS + limit))
	until "$@" >/dev/null 2>&1; do
		if [ $SECONDS -ge $deadline ]; then
			echo "ceph-cluster: $what did not happen within ${limit}s; logs in $dir/log" >&2
			return 1
		fi
		sleep 0.2
	done
}

down() {
	[ -d "$dir" ] || return 0
	for m in "$dir"/mnt*; do
		if [ -d "$m" ] && mountpoint -q "$m"; then
			fusermount -u "$m" 2>/dev/null || umount -l "$m" || true
		fi
	done
	# Every process by the pid it wrote itself: clients, then the daemons all at once (the
	# cluster is thrown away, and the OSD keeps its objects in RAM: nothing to flush).
	local pidfile pids=()
	for pidfile in "$dir"/run/client*.pid "$dir"/run/{mds.a,osd.0,mgr.x,mon.a}.pid; do
		local pid
		# A ceph-fuse just unmounted removes its own pid file as it exits.
		pid=$(cat "$pidfile" 2>/dev/null) || continue
		if kill -0 "$pid" 2>/dev/null; then
			kill "$pid" 2>/dev/null || true
			pids+=("$pid")
		fi
	done
	local deadline=$((SECONDS + 5))
	for pid in "${pids[@]}"; do
		while kill -0 "$pid" 2>/dev/null && [ $SECONDS -lt $deadline ]; do sleep 0.1; done
		kill -9 "$pid" 2>/dev/null || true
	done
	rm -rf "$dir"
}

mount_client() {  # mount_client MOUNTPOINT PIDFILE
	mkdir -p "$1"
	ceph-fuse -c "$conf" --pid-file "$2" "$1" >>"$dir/log/ceph-fuse.out" 2>&1
	wait_for 30 "the ceph-fuse mount at $1" mountpoint -q "$1"
}

up() {
	for tool in ceph-mon ceph-mgr ceph-osd ceph-mds ceph-fuse monmaptool; do
		command -v "$tool" >/dev/null || { echo "ceph-cluster: $tool is not installed" >&2; exit 3; }
	done
	[ "$(id -u)" = 0 ] || { echo "ceph-cluster: needs root (ceph-fuse mounts)" >&2; exit 3; }
	[ -e /dev/fuse ] || { echo "ceph-cluster: /dev/fuse is missing" >&2; exit 3; }
	mkdir -p "$dir"/{run,log,mon/a,osd/0,mds/a,mgr/x} "$mnt"
	dir=$(cd "$dir" && pwd)
	conf=$dir/ceph.conf
	mnt=$dir/mnt
	out=$dir/log/daemons.out
	local port fsid
	port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
	fsid=$(cat /proc/sys/kernel/random/uuid)
	cat >"$conf" <<CONF
[global]
fsid = $fsid
mon host = v2:127.0.0.1:$port
public addr = 127.0.0.1
auth cluster required = none
auth service required = none
auth client required = none
run dir = $dir/run
pid file = $dir/run/\$name.pid
admin socket = $dir/run/\$name.asok
log file = $dir/log/\$name.log
crash dir = $dir/log
mon data = $dir/mon/\$id
osd data = $dir/osd/\$id
mds data = $dir/mds/\$id
mgr data = $dir/mgr/\$id
osd objectstore = memstore
memstore device bytes = $store_bytes
osd pool default size = 1
osd pool default min size = 1
osd pool default pg autoscale mode = off
osd crush chooseleaf type = 0
mon allow pool size one = true
mon warn on pool no redundancy = false
mon osd full ratio = .98
mon osd backfillfull ratio = .97
mon osd nearfull ratio = .96
osd max object name len = 460
osd max object namespace len = 64
mgr initial modules =
ms bind ipv6 = false
[client]
client quota = true
log file = $dir/log/client.log
CONF
	monmaptool --create --clobber --fsid "$fsid" --addv a "[v2:127.0.0.1:$port]" "$dir/monmap" >/dev/null
	ceph-mon -c "$conf" --mkfs -i a --monmap "$dir/monmap" >/dev/null
	ceph-mon -c "$conf" -i a 2>>"$out"
	wait_for 30 "the mon answering" ceph_ mon stat
	ceph-mgr -c "$conf" -i x 2>>"$out"
	local osd_uuid
	osd_uuid=$(cat /proc/sys/kernel/random/uuid)
	ceph_ osd new "$osd_uuid" >>"$out"
	ceph-osd -c "$conf" -i 0 --mkfs --osd-uuid "$osd_uuid" >>"$out" 2>&1
	ceph-osd -c "$conf" -i 0 >>"$out" 2>&1
	wait_for 30 "osd.0 coming up" sh -c "ceph -c '$conf' osd stat -f json | grep -q '\"num_up_osds\":1'"
	{
		ceph_ osd pool create cephfs_metadata 8
		ceph_ osd pool create cephfs_data 8
		ceph_ osd pool set cephfs_metadata size 1 --yes-i-really-mean-it
		ceph_ osd pool set cephfs_data size 1 --yes-i-really-mean-it
		ceph_ fs new cephfs cephfs_metadata cephfs_data
	} >>"$out" 2>&1
	ceph-mds -c "$conf" -i a >>"$out" 2>&1
	wait_for 60 "the MDS becoming active" sh -c "ceph -c '$conf' mds stat | grep -q 'up:active'"
	mount_client "$mnt" "$dir/run/client.pid"
	echo "CEPH_CONF=$conf"
	echo "CEPHFS_MOUNT=$mnt"
}

case $cmd in
up)
	if ! up; then
		down
		exit 1
	fi
	;;
mount)
	[ $# -eq 3 ] || usage
	mount_client "$dir/mnt-$3" "$dir/run/client-$3.pid"
	echo "CEPHFS_MOUNT=$dir/mnt-$3"
	;;
down) down ;;
*) usage ;;
esac
