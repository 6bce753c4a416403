#!/bin/bash
# Plain mode: runs as PID 1 of a fresh pid+mount+uts+ipc namespace, already inside the host's netns.
# Mounts the host's overlay root, pivots into it and execs sshd as PID 1 (sshd reaps orphans).
# Usage: host-init.sh LOWER_ROOTFS HOST_DIR HOSTNAME
set -euo pipefail
LOWER=$1 H=$2 NAME=$3
R=$H/root
hostname "$NAME"
mount -t overlay overlay -o "lowerdir=$LOWER,upperdir=$H/upper,workdir=$H/work" "$R"
# /proc: new instance for this pid ns; /proc/sys read-only except net.* (per netns)
mount -t proc -o nosuid,nodev,noexec proc "$R/proc"
mount --bind "$R/proc/sys" "$R/proc/sys"
mount --bind "$R/proc/sys/net" "$R/proc/sys/net"
mount -o remount,bind,ro "$R/proc/sys"
mount --bind /dev/null "$R/proc/sysrq-trigger" 2>/dev/null || true
# /sys: read-only, shows this netns's interfaces
mount -t sysfs -o ro,nosuid,nodev,noexec sysfs "$R/sys"
# minimal /dev: none of the controller's block devices are visible
mount -t tmpfs -o mode=755,size=1m,nosuid tmpfs "$R/dev"
for d in null zero full random urandom tty; do
  touch "$R/dev/$d"
  mount --bind "/dev/$d" "$R/dev/$d"
done
mkdir -p "$R/dev/pts" "$R/dev/shm"
mount -t devpts -o newinstance,ptmxmode=0666,mode=0620,gid=5,nosuid,noexec devpts "$R/dev/pts"
ln -s pts/ptmx "$R/dev/ptmx"
ln -s /proc/self/fd "$R/dev/fd"
ln -s /proc/self/fd/0 "$R/dev/stdin"
ln -s /proc/self/fd/1 "$R/dev/stdout"
ln -s /proc/self/fd/2 "$R/dev/stderr"
mount -t tmpfs -o mode=1777,nosuid,nodev tmpfs "$R/dev/shm"
mount -t tmpfs -o mode=755,nosuid,nodev tmpfs "$R/run"
mkdir -p "$R/run/sshd" "$R/run/lock"
# switch root: the controller's filesystem is not visible inside the host afterwards
mkdir -p "$R/.oldroot"
cd "$R"
pivot_root . .oldroot
exec /usr/sbin/chroot . /bin/sh -c '
  umount -l /.oldroot && rmdir /.oldroot
  [ -f /etc/ssh/ssh_host_ed25519_key ] || ssh-keygen -q -t ed25519 -N "" -f /etc/ssh/ssh_host_ed25519_key
  exec /usr/sbin/sshd -D -e'
