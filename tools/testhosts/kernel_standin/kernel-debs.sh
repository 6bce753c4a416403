#!/bin/sh
# TEST DOUBLE (mift kernel stand-in) of a Debian kernel release in an apt repository: builds, inside a test host,
#   linux-image-RELEASE    /boot/vmlinuz-RELEASE and the in-box amdgpu of RELEASE; postinst runs /etc/kernel/postinst.d
#   linux-headers-RELEASE  /lib/modules/RELEASE/build/include; postinst runs /etc/kernel/header_postinst.d
#   linux-image-FLAVOUR, linux-headers-FLAVOUR  the flavour's metapackages at VERSION, each depending on RELEASE's
#                          package (= VERSION), as Debian's linux-signed-amd64 builds them
# into /var/lib/mift-standin/repo (a flat file: repository, apt source written by install.sh) and rewrites its index.
# Usage: kernel-debs.sh RELEASE VERSION, e.g. 6.1.0-57-amd64 6.1.192-3 (Debian 12's real pair). Every package says
# TEST DOUBLE in its description and carries the version VERSION+mift.standin. Idempotent.
set -eu
release=$1 version=$2+mift.standin
flavour=${release#*.*.*-*-}
repo=/var/lib/mift-standin/repo
mkdir -p "$repo"

deb() {  # deb NAME DEPENDS POSTINST-HOOK-DIR FILE... (FILE: path=content)
  name=$1 depends=$2 hooks=$3; shift 3
  out="$repo/${name}_${version}_amd64.deb"
  [ -e "$out" ] && return 0
  tmp=$(mktemp -d)
  mkdir -p "$tmp/DEBIAN"
  {
    printf 'Package: %s\nVersion: %s\nArchitecture: amd64\nMaintainer: mift test rig <testdouble@mift.invalid>\n' \
      "$name" "$version"
    [ -z "$depends" ] || printf 'Depends: %s\n' "$depends"
    printf 'Description: TEST DOUBLE of %s (mift kernel stand-in)\n' "$name"
  } > "$tmp/DEBIAN/control"
  for f in "$@"; do
    p=${f%%=*}
    mkdir -p "$tmp$(dirname "$p")"
    printf '%s\n' "${f#*=}" > "$tmp$p"
  done
  if [ -n "$hooks" ]; then
    # as Debian's kernel packages run them: the release, then the image path (header hooks: the release only)
    # shellcheck disable=SC2016  # $1 is the postinst's own argument
    printf '#!/bin/sh\nset -e\n[ "$1" = configure ] || exit 0\nrun-parts --report --exit-on-error --arg=%s %s %s\n' \
      "$release" "$([ "$hooks" = /etc/kernel/postinst.d ] && echo "--arg=/boot/vmlinuz-$release")" "$hooks" \
      > "$tmp/DEBIAN/postinst"
    chmod 0755 "$tmp/DEBIAN/postinst"
  fi
  dpkg-deb --root-owner-group -b "$tmp" "$out" >/dev/null
  rm -rf "$tmp"
}

deb "linux-image-$release" "" /etc/kernel/postinst.d \
  "/boot/vmlinuz-$release=TEST DOUBLE kernel image $release (mift kernel stand-in)" \
  "/lib/modules/$release/kernel/drivers/gpu/drm/amd/amdgpu/amdgpu.ko=TEST DOUBLE in-box module (mift kernel stand-in)
name=amdgpu"
deb "linux-headers-$release" "" /etc/kernel/header_postinst.d \
  "/lib/modules/$release/build/include/TEST-DOUBLE.txt=TEST DOUBLE headers of kernel $release (mift kernel stand-in)"
deb "linux-image-$flavour" "linux-image-$release (= $version)" ""
deb "linux-headers-$flavour" "linux-headers-$release (= $version)" ""

# the index apt reads (Packages of a flat repository)
: > "$repo/Packages.new"
for f in "$repo"/*.deb; do
  {
    dpkg-deb -f "$f"
    printf 'Filename: ./%s\nSize: %s\nSHA256: %s\n\n' "${f##*/}" "$(wc -c < "$f" | tr -d ' ')" \
      "$(sha256sum "$f" | cut -d' ' -f1)"
  } >> "$repo/Packages.new"
done
mv "$repo/Packages.new" "$repo/Packages"
echo "kernel stand-in $release ($version) published in $repo"
