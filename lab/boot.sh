#!/bin/sh
# PID 1 of a lab node: runs inside the node's fresh mount, UTS, IPC and PID
# namespaces (and its network namespace), builds the node's root filesystem and
# becomes tini -> sshd. Arguments: ROOT UPPER WORK HIDE
#   ROOT   where the node's root is assembled
#   UPPER  the node's private layer (its changes persist across restarts of the node)
#   WORK   overlayfs work dir
#   HIDE   the lab's state dir: other nodes' layers and the operator key live there
set -eu
root=$1 upper=$2 work=$3 hide=$4

mount --make-rprivate /
# The host's / is the read-only lower layer; everything the node writes lands in UPPER.
mount -t overlay overlay -o "lowerdir=/,upperdir=$upper,workdir=$work" "$root"

mount -t proc proc "$root/proc"
# /proc/sys is host-global except net.*: nodes must not change the host's kernel.
mount --bind "$root/proc/sys" "$root/proc/sys"
mount -o remount,bind,ro "$root/proc/sys"
# A sysfs mounted in the node's network namespace shows the node's own interfaces.
mount -t sysfs -o ro sysfs "$root/sys"

mount --bind /dev "$root/dev"
mount -t devpts -o newinstance,ptmxmode=0666,mode=620 devpts "$root/dev/pts"
mount --bind "$root/dev/pts/ptmx" "$root/dev/ptmx"
mount -t tmpfs -o mode=1777 tmpfs "$root/dev/shm"

mount -t tmpfs -o mode=1777 tmpfs "$root/tmp"
mount -t tmpfs -o mode=755 tmpfs "$root/run"
mkdir -m 755 "$root/run/sshd"
# Every boot of a real machine has its own boot_id; nodes share the host's kernel, so each
# boot of a node gets its own, laid over the kernel's.
cat /proc/sys/kernel/random/uuid > "$root/run/boot_id"
mount --bind -o ro "$root/run/boot_id" "$root/proc/sys/kernel/random/boot_id"
mount -t tmpfs -o mode=700 tmpfs "$root$hide"

hostname "$(cat "$root/etc/hostname")"
exec chroot "$root" /usr/bin/tini -- /usr/sbin/sshd -D -e
