#!/bin/sh
# Installs the kernel stand-ins (TEST DOUBLES) on a test host: run as root inside the host from the directory that
# holds them. Idempotent; ends with a first stand-in boot that is not counted as a reboot.
#   install.sh                           the stand-ins for the real running kernel (the controller's)
#   install.sh --kernel RELEASE VERSION  stand-in kernel packages as well (kernel-debs.sh), in an apt repository of
#                                        the host, with the flavour's linux-image metapackage installed, and the
#                                        uname stand-in (mift-uname.so, built from uname.c next to this script) in the
#                                        host's /etc/ld.so.preload: the host boots RELEASE and later kernel updates
#                                        come from that repository (kernel-debs.sh NEWER VERSION, then apt)
set -eu
here=$(cd "$(dirname "$0")" && pwd)
standin_kernel='' standin_version=''
if [ "${1:-}" = --kernel ]; then
  standin_kernel=$2 standin_version=$3
  [ -f "$here/mift-uname.so" ] || { echo "install.sh: $here/mift-uname.so missing (build it from uname.c)" >&2; exit 1; }
fi
k=$(uname -r)
install -d /usr/local/lib/mift-standin /var/lib/mift-standin
# /usr/sbin, where the real tools live: apt runs maintainer scripts with DPkg::Path (/usr/sbin:/usr/bin:/sbin:/bin),
# so amdgpu-dkms's postinst finds dkms only there. A real tool is never replaced.
for t in dkms modinfo modprobe mokutil shutdown update-grub; do
  if [ -e "/usr/sbin/$t" ] && ! grep -q 'TEST DOUBLE' "/usr/sbin/$t"; then
    echo "install.sh: /usr/sbin/$t is a real tool, not replacing it (this is for test hosts only)" >&2
    exit 1
  fi
  install -m 0755 "$here/$t" "/usr/sbin/$t"
done
install -m 0755 "$here/boot" /usr/local/lib/mift-standin/boot
if [ -n "$standin_kernel" ]; then
  install -m 0755 "$here/kernel-debs.sh" /usr/local/lib/mift-standin/kernel-debs.sh
  install -d /etc/kernel/postinst.d /etc/kernel/header_postinst.d
  install -m 0755 "$here/dkms-kernel-hook" /etc/kernel/postinst.d/dkms
  install -m 0755 "$here/dkms-kernel-hook" /etc/kernel/header_postinst.d/dkms
  install -m 0755 "$here/zz-update-grub" /etc/kernel/postinst.d/zz-update-grub
  install -m 0644 "$here/mift-uname.so" /usr/local/lib/mift-standin/mift-uname.so
  grep -qx /usr/local/lib/mift-standin/mift-uname.so /etc/ld.so.preload 2>/dev/null ||
    echo /usr/local/lib/mift-standin/mift-uname.so >> /etc/ld.so.preload
  /usr/local/lib/mift-standin/kernel-debs.sh "$standin_kernel" "$standin_version"
  echo 'deb [trusted=yes] file:/var/lib/mift-standin/repo ./' > /etc/apt/sources.list.d/mift-kernel-standin.list
  apt-get -q update >/dev/null
  # the image metapackage every Debian install has; the headers metapackage is the rocm role's to install
  DEBIAN_FRONTEND=noninteractive apt-get -q -y install "linux-image-${standin_kernel#*.*.*-*-}" >/dev/null
  /usr/sbin/update-grub 2>/dev/null
  : > /var/lib/mift-standin/reboots
  /usr/local/lib/mift-standin/boot
  echo "kernel stand-ins installed, stand-in kernel $(uname -r) booted"
  exit 0
fi
# the in-box amdgpu of the kernel (no srcversion, not DKMS-signed), as linux-modules(-extra) ship it
d=/lib/modules/$k/kernel/drivers/gpu/drm/amd/amdgpu
mkdir -p "$d"
printf 'TEST DOUBLE in-box module (mift kernel stand-in)\nname=amdgpu\n' > "$d/amdgpu.ko"
# headers for the running kernel as a package, so that apt sees linux-headers-$k installed
if ! dpkg-query -W -f '${Status}' "linux-headers-$k" 2>/dev/null | grep -q 'install ok installed'; then
  tmp=$(mktemp -d)
  mkdir -p "$tmp/DEBIAN" "$tmp/lib/modules/$k/build"
  echo "TEST DOUBLE headers (mift kernel stand-in)" > "$tmp/lib/modules/$k/build/TEST-DOUBLE.txt"
  printf 'Package: linux-headers-%s\nVersion: 0-mift-standin\nArchitecture: all\nMaintainer: mift test rig <testdouble@mift.invalid>\nDescription: TEST DOUBLE of the headers of kernel %s (mift kernel stand-in)\n' \
    "$k" "$k" > "$tmp/DEBIAN/control"
  dpkg-deb --root-owner-group -b "$tmp" "$tmp.deb" >/dev/null
  dpkg -i "$tmp.deb" >/dev/null
  rm -rf "$tmp" "$tmp.deb"
fi
[ -f /boot/grub/grub.cfg ] || /usr/sbin/update-grub 2>/dev/null
: > /var/lib/mift-standin/reboots
/usr/local/lib/mift-standin/boot
echo "kernel stand-ins installed for kernel $k"
