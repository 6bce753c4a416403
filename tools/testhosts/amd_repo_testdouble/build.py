#!/usr/bin/env python3
"""Build the AMD repository TEST DOUBLE: a signed apt tree laid out like repo.radeon.com.

NOT AMD SOFTWARE. Every package says "TEST DOUBLE" in its Description. The packages carry AMD's
names and file layout (``/opt/rocm-<ver>/bin``, ``/opt/rocm`` via update-alternatives,
``/opt/rocm-<ver>/.info/version``, ``/usr/src/amdgpu-<ver>/dkms.conf``) so that the ``rocm`` role
runs unmodified against them; the GPU tools print the real captures (tests/fixtures/gpu-tools/)
of the host's GPU profile, read from ``/etc/mift-testdouble/gpu-profile``.

Layout written under OUT (served as http://controller:8080/amd/)::

    rocm/rocm.gpg.key                                   armored public TEST key (throwaway)
    rocm/rocm.gpg.key.fingerprint                       its fingerprint (test inventories allow it)
    rocm/apt/<rocm>/dists/{jammy,noble}/...             rocm, rocm-core, rocminfo, rocm-smi-lib, ...
    graphics/<rocm>/ubuntu/dists/{jammy,noble}/...      libdrm-amdgpu1 (needed by hip-runtime-amd)
    amdgpu/<driver>/ubuntu/dists/{jammy,noble}/...      amdgpu-dkms, amdgpu-dkms-firmware

for every ROCm version in the ``rocm`` role's version map (roles/rocm/vars/main.yml). Release files
say ``Origin: repo.radeon.com`` so that the role's apt pin is exercised, and are signed
(InRelease + Release.gpg) with a throwaway ed25519 key generated on the first build and kept
outside the served tree.

Usage: build.py --out DIR --keydir DIR [--force]
Needs: python3 (stdlib), dpkg-deb, dpkg-scanpackages, gpg.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from email.utils import formatdate
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
FIXTURES = REPO / "tests" / "fixtures" / "gpu-tools"
VERSION_MAP_FILE = REPO / "roles" / "rocm" / "vars" / "main.yml"
SUITES = ("jammy", "noble")
MAINTAINER = "mift test rig <testdouble@mift.invalid>"
KEY_UID = "mift AMD repo TEST DOUBLE key - NOT AMD (throwaway) <testdouble@mift.invalid>"
PROFILE_FILE = "/etc/mift-testdouble/gpu-profile"

# profile -> {command key: (capture, part)}; part: None = whole file, 1/2 = first/second rocm-smi
# report of a capture that holds `rocm-smi && rocm-smi --showmeminfo vram`, "tail" = without line 1.
# A command a profile has no capture for exits 127, as a missing command does (the gpu_verify module then
# records the tool as not installed). Files under derived/ are real captures with one documented change
# (tests/fixtures/gpu-tools/INDEX.md section 9).
_AMD_SMI_STATIC = "amd-smi_static_--asic_--vram_--partition_--json"  # what gpu_verify runs on ROCm 7
_MI300X: dict[str, tuple[str, int | str | None]] = {
    "rocminfo": ("rocminfo/mi300x_x8_rocm_issue4021.txt", None),
    "rocm-smi": ("rocm-smi/mi300x_x8_rocm_issue4021_concise.txt", None),
    "rocm-smi_--showmeminfo_vram": ("rocm-smi/mi300x_spx_x8_issue4750_concise_and_vram.txt", 2),
    "amd-smi_list": ("amd-smi/mi300x_x8_oci-hpc-oke_version_and_list_rocm6.1.2.txt", "tail"),
    "amd-smi": ("rocm7/amd-smi/default_mi300x_x8_spx-nps1_rocm7.0.0_amdsmi-changelog.txt", None),
    _AMD_SMI_STATIC: ("derived/amd-smi/static-json_mi300x_x8_spx-nps1_rocm7.txt", None),
}
PROFILES: dict[str, dict[str, tuple[str, int | str | None]]] = {
    "mi300x": _MI300X,
    "mi300x-vf": {
        "rocminfo": ("rocm7/rocminfo/NEG_rocminfo_mi300x-vf_x2_rocm7.2.4_fleet-amd-task.txt", None),
        "amd-smi_static": ("rocm7/amd-smi/NEG_static_mi300x-vf_x2_rocm7.2.4_fleet-amd-task.txt", None),
        "amd-smi_static_--partition": (
            "rocm7/amd-smi/NEG_static-partition_mi300x-vf_x2_rocm7.2.4_fleet-amd-task.txt",
            None,
        ),
        "amd-smi_list": ("rocm7/amd-smi/NEG_list_mi300x-vf_x2_rocm7.2.4_fleet-amd-task.txt", None),
        _AMD_SMI_STATIC: ("derived/amd-smi/static-json_mi300x-vf_x2_rocm7.2.4.txt", None),
    },
    # ROCm programs see 4 of the 8 GPUs (as with ROCR_VISIBLE_DEVICES=0,1,2,3); rocm-smi and amd-smi see 8
    "mi300x-rocminfo4": {
        **_MI300X,
        "rocminfo": ("derived/rocminfo/mi300x_x8_visible4_from-issue4021.txt", None),
    },
    # amd-smi's JSON stops part-way (exit status 0)
    "mi300x-amdsmi-cut": {
        **_MI300X,
        _AMD_SMI_STATIC: ("derived/amd-smi/static-json_mi300x_x8_cut-short.txt", None),
    },
    "mi300x-cpx": {
        "rocminfo": ("rocminfo/mi300x_cpx_partial_2agents_rocm_issue4750.txt", None),
        "rocm-smi": ("rocm-smi/mi300x_cpx_nps1_63part_issue4750_concise_and_vram.txt", 1),
        "rocm-smi_--showmeminfo_vram": ("rocm-smi/mi300x_cpx_nps1_63part_issue4750_concise_and_vram.txt", 2),
    },
    "mi250x": {
        "rocminfo": ("rocminfo/NEG_mi250x_x8gcd_flattened_rccl_issue1490.txt", None),
    },
    "mi210": {
        "rocminfo": ("rocminfo/NEG_mi210_x8_rocmblogs_roc-profiling_sysinfo.txt", None),
        "rocm-smi": ("rocm-smi/NEG_mi210_x8_rocmblogs_affinity2_concise.txt", None),
    },
}

PRINTER = """#!/bin/sh
# TEST DOUBLE (mift test rig) - NOT AMD SOFTWARE.
# Prints the real capture of "<tool> <args>" for this host's GPU profile ({profile_file}).
tool=$1
shift
key=$tool
for arg in "$@"; do key="${{key}}_$arg"; done
profile=$(tr -d ' \\n' < {profile_file} 2>/dev/null)
[ -n "$profile" ] || profile=mi300x
dir={root}/share/mift-testdouble/$profile
if [ "$tool $*" = "amd-smi version" ]; then
  echo "AMDSMI Tool: TEST DOUBLE (mift) | ROCm version: {version}"
  exit 0
fi
if [ -f "$dir/$key.txt" ]; then
  cat "$dir/$key.txt"
  exit 0
fi
msg="TEST DOUBLE (mift): no capture of '$tool $*' for GPU profile '$profile' ($dir/$key.txt)"
echo "$msg: behaves as a missing command" >&2
exit 127
"""


@dataclass
class Pkg:
    """One binary package of the double."""

    name: str
    version: str
    description: str
    depends: list[str] = field(default_factory=list)
    files: dict[str, tuple[str, int]] = field(default_factory=dict)  # path -> (content, mode)
    postinst: str | None = None
    prerm: str | None = None


def _yaml_map(name: str) -> dict[str, str]:
    """A flat "X": "Y" map of the rocm role's vars/main.yml (read as text: no YAML library needed)."""
    text = VERSION_MAP_FILE.read_text(encoding="utf-8")
    if f"\n{name}:" not in text:
        return {}
    block = text.split(f"\n{name}:", 1)[1]
    pairs: dict[str, str] = {}
    for line in block.splitlines()[1:]:
        match = re.match(r'^\s+"([\d.]+)":\s*"([\d.]+)"', line)
        if not match:
            break
        pairs[match.group(1)] = match.group(2)
    return pairs


def version_map() -> dict[str, str]:
    """ROCm -> amdgpu driver versions, read from the rocm role so both stay one table."""
    pairs = _yaml_map("_rocm_driver_versions")
    if not pairs:
        sys.exit(f"no _rocm_driver_versions map in {VERSION_MAP_FILE}")
    return pairs


def graphics_map() -> dict[str, str]:
    """ROCm -> graphics release where AMD published them apart (7.2.2 -> 7.2.1); else the ROCm release."""
    return _yaml_map("_rocm_graphics_versions")


def full_version(ver: str) -> str:
    """7.1 -> 7.1.0 (AMD drops the .0 in repo paths, not in package versions)."""
    parts = ver.split(".")
    return ".".join(parts + ["0"] * (3 - len(parts)))


def capture_text(rel: str, part: int | str | None) -> str:
    text = (FIXTURES / rel).read_text(encoding="utf-8")
    if part == "tail":
        return text.split("\n", 1)[1]
    if isinstance(part, int):
        lines = text.splitlines(keepends=True)
        end = next(i for i, line in enumerate(lines) if "End of ROCm SMI Log" in line)
        return "".join(lines[: end + 1] if part == 1 else lines[end + 1 :])
    return text


def rocm_packages(ver: str) -> list[Pkg]:
    full = full_version(ver)
    num = "".join(f"{int(x):02d}" if i else x for i, x in enumerate(full.split(".")))  # 7.0.2 -> 70002
    pkgver = f"{full}.{num}-1~testdouble"
    root = f"/opt/rocm-{full}"
    desc = f"TEST DOUBLE of AMD ROCm {full} {{}} (mift test rig; not AMD software)"
    dep = f"rocm-core (= {pkgver})"
    core = Pkg(
        "rocm-core",
        pkgver,
        desc.format("rocm-core: version file, /opt/rocm alternative, real GPU tool captures per profile"),
        files={
            f"{root}/.info/version": (f"{full}-{num}\n", 0o644),
            f"{root}/lib/TEST-DOUBLE.txt": (
                "libraries of the real ROCm go here; this is a TEST DOUBLE\n",
                0o644,
            ),
            f"{root}/libexec/mift-testdouble/print-capture": (
                PRINTER.format(profile_file=PROFILE_FILE, root=root, version=full),
                0o755,
            ),
        },
        postinst=f"update-alternatives --install /opt/rocm rocm {root} {num}\n",
        prerm=f'[ "$1" = upgrade ] || update-alternatives --remove rocm {root}\n',
    )
    for profile, commands in PROFILES.items():
        for key, (rel, part) in commands.items():
            core.files[f"{root}/share/mift-testdouble/{profile}/{key}.txt"] = (capture_text(rel, part), 0o644)
    tools = {"rocminfo": ["rocminfo"], "rocm-smi-lib": ["rocm-smi"], "amd-smi-lib": ["amd-smi"]}
    pkgs = [core]
    for name, binaries in tools.items():
        files = {
            f"{root}/bin/{b}": (
                f'#!/bin/sh\nexec {root}/libexec/mift-testdouble/print-capture {b} "$@"\n',
                0o755,
            )
            for b in binaries
        }
        pkgs.append(
            Pkg(
                name,
                pkgver,
                desc.format(f"{name}: prints the real capture for the host's GPU profile"),
                [dep],
                files,
            )
        )
    pkgs.append(
        Pkg(
            "hip-runtime-amd",
            pkgver,
            desc.format("HIP runtime placeholder"),
            [dep, "libdrm-amdgpu1"],
            {f"{root}/share/doc/hip-runtime-amd/TEST-DOUBLE.txt": ("TEST DOUBLE\n", 0o644)},
        )
    )
    metas = {
        "rocm-language-runtime": [dep],
        "rocm-hip-runtime": [dep, "hip-runtime-amd", "rocminfo", "rocm-language-runtime"],
        "rocm-hip-libraries": [dep, "rocm-hip-runtime"],
        "rocm-opencl-runtime": [dep, "rocm-language-runtime"],
        "rocm-ml-libraries": [dep, "rocm-hip-libraries"],
        "rocm-developer-tools": [dep, "rocm-smi-lib", "amd-smi-lib", "rocminfo"],
        "rocm": [
            dep,
            "rocm-hip-runtime",
            "rocm-hip-libraries",
            "rocm-opencl-runtime",
            "rocm-ml-libraries",
            "rocm-developer-tools",
            "rocm-smi-lib",
            "amd-smi-lib",
        ],
    }
    pkgs += [Pkg(name, pkgver, desc.format(f"{name} meta package"), deps) for name, deps in metas.items()]
    return pkgs


def graphics_packages(ver: str) -> list[Pkg]:
    full = full_version(ver)
    return [
        Pkg(
            "libdrm-amdgpu1",
            f"1:2.4.125.{full}-1~testdouble",
            f"TEST DOUBLE of AMD graphics {full} libdrm-amdgpu1 (mift test rig; not AMD software)",
            files={"/opt/amdgpu/share/doc/libdrm-amdgpu1/TEST-DOUBLE.txt": ("TEST DOUBLE\n", 0o644)},
        )
    ]


def amdgpu_packages(drv: str) -> list[Pkg]:
    modver = f"{drv}-testdouble"
    pkgver = f"1:{drv}-1~testdouble"
    desc = f"TEST DOUBLE of AMD amdgpu driver {drv} {{}} (mift test rig; not AMD software)"
    dkms_conf = (
        f'PACKAGE_NAME="amdgpu"\nPACKAGE_VERSION="{modver}"\nAUTOINSTALL="yes"\n'
        "# TEST DOUBLE: the real package builds amdgpu.ko through DKMS; this one ships only this file\n"
        "# and does not depend on dkms (test hosts cannot build or load kernel modules); its postinst\n"
        "# calls a dkms if one is installed (the kernel stand-ins on test hosts).\n"
    )
    return [
        Pkg(
            "amdgpu-dkms-firmware",
            pkgver,
            desc.format("amdgpu-dkms-firmware"),
            files={"/lib/firmware/updates/amdgpu/TEST-DOUBLE.txt": ("TEST DOUBLE\n", 0o644)},
        ),
        Pkg(
            "amdgpu-dkms",
            pkgver,
            desc.format("amdgpu-dkms: writes dkms.conf only, builds nothing"),
            [f"amdgpu-dkms-firmware (= {pkgver})"],
            files={f"/usr/src/amdgpu-{modver}/dkms.conf": (dkms_conf, 0o644)},
            # like the real package's DKMS hooks; a no-op unless a dkms is installed (the kernel stand-ins of
            # tools/testhosts/kernel_standin/ provide one). A build without headers is skipped, not fatal.
            postinst=(
                "command -v dkms >/dev/null 2>&1 || exit 0\n"
                f"dkms add -m amdgpu -v {modver} >/dev/null\n"
                f'dkms install -m amdgpu -v {modver} -k "$(uname -r)" || '
                'echo "amdgpu-dkms TEST DOUBLE: build skipped (no headers?)" >&2\n'
            ),
            prerm=(
                "command -v dkms >/dev/null 2>&1 || exit 0\n"
                f"dkms remove -m amdgpu -v {modver} --all >/dev/null\n"
            ),
        ),
    ]


def build_deb(pkg: Pkg, pool: Path) -> Path:
    out = pool / pkg.name[0] / pkg.name / f"{pkg.name}_{pkg.version.split(':')[-1]}_amd64.deb"
    if out.exists():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        root.chmod(0o755)  # TemporaryDirectory is 0700; dpkg would record that for "./"
        (root / "DEBIAN").mkdir()
        control = [
            f"Package: {pkg.name}",
            f"Version: {pkg.version}",
            "Architecture: amd64",
            f"Maintainer: {MAINTAINER}",
            "Section: devel",
            "Priority: optional",
        ]
        if pkg.depends:
            control.append("Depends: " + ", ".join(pkg.depends))
        control.append(
            f"Description: {pkg.description}\n"
            " TEST DOUBLE built by tools/testhosts/amd_repo_testdouble/build.py."
        )
        (root / "DEBIAN" / "control").write_text("\n".join(control) + "\n", encoding="utf-8")
        for script, body in (("postinst", pkg.postinst), ("prerm", pkg.prerm)):
            if body:
                path = root / "DEBIAN" / script
                path.write_text("#!/bin/sh\nset -e\n" + body, encoding="utf-8")
                path.chmod(0o755)
        for rel, (content, mode) in pkg.files.items():
            path = root / rel.lstrip("/")
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(content, encoding="utf-8")
            path.chmod(mode)
        subprocess.run(
            ["dpkg-deb", "-Zgzip", "-z1", "--root-owner-group", "--build", str(root), str(out)],
            check=True,
            stdout=subprocess.DEVNULL,
        )
    return out


def write_suite(base: Path, suite: str, debs: list[Path], gpg: list[str], archs: tuple[str, ...]) -> None:
    """dists/<suite>/main/binary-*/Packages(.gz) + Release signed as InRelease and Release.gpg."""
    dist = base / "dists" / suite
    shutil.rmtree(dist, ignore_errors=True)
    indexes: list[Path] = []
    for arch in archs:
        bdir = dist / "main" / f"binary-{arch}"
        bdir.mkdir(parents=True)
        packages = ""
        if arch == "amd64":
            packages = subprocess.run(
                ["dpkg-scanpackages", "--multiversion", "pool", "/dev/null"],
                cwd=base,
                check=True,
                capture_output=True,
                text=True,
            ).stdout
        (bdir / "Packages").write_text(packages, encoding="utf-8")
        (bdir / "Packages.gz").write_bytes(gzip.compress(packages.encode(), mtime=0))
        indexes += [bdir / "Packages", bdir / "Packages.gz"]
    assert debs, base
    lines = [
        "Origin: repo.radeon.com",
        "Label: TEST DOUBLE of repo.radeon.com (mift test rig, not AMD)",
        f"Suite: {suite}",
        f"Codename: {suite}",
        f"Date: {formatdate(usegmt=True)}",
        "Architectures: " + " ".join(archs),
        "Components: main",
        "Description: TEST DOUBLE of AMD's apt repository, signed with a throwaway test key",
    ]
    for algo, title in (("md5", "MD5Sum"), ("sha256", "SHA256")):
        lines.append(f"{title}:")
        for index in indexes:
            data = index.read_bytes()
            lines.append(f" {hashlib.new(algo, data).hexdigest()} {len(data):>8} {index.relative_to(dist)}")
    release = dist / "Release"
    release.write_text("\n".join(lines) + "\n", encoding="utf-8")
    subprocess.run([*gpg, "--clearsign", "-o", str(dist / "InRelease"), str(release)], check=True)
    subprocess.run(
        [*gpg, "--armor", "--detach-sign", "-o", str(dist / "Release.gpg"), str(release)], check=True
    )


def ensure_key(keydir: Path) -> list[str]:
    keydir.mkdir(parents=True, exist_ok=True, mode=0o700)
    keydir.chmod(0o700)
    gpg = [
        "gpg",
        "--homedir",
        str(keydir),
        "--batch",
        "--yes",
        "--quiet",
        "--pinentry-mode",
        "loopback",
        "--passphrase",
        "",
    ]
    listed = subprocess.run([*gpg, "--list-secret-keys"], capture_output=True, text=True, check=False)
    if KEY_UID not in listed.stdout:
        subprocess.run([*gpg, "--quick-generate-key", KEY_UID, "ed25519", "sign", "never"], check=True)
    return [*gpg, "--local-user", KEY_UID]


def inputs_digest() -> str:
    digest = hashlib.sha256()
    for path in [Path(__file__), VERSION_MAP_FILE, *sorted(FIXTURES.rglob("*.txt"))]:
        digest.update(str(path).encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--out", type=Path, required=True, help="served directory (…/repo/amd)")
    parser.add_argument(
        "--keydir", type=Path, required=True, help="GnuPG home for the throwaway key (not served)"
    )
    parser.add_argument("--force", action="store_true", help="rebuild even if the inputs did not change")
    args = parser.parse_args()
    gpg = ensure_key(args.keydir)
    stamp = args.out / ".built-from"
    digest = inputs_digest()
    if not args.force and stamp.is_file() and stamp.read_text().strip() == digest:
        print(f"AMD repo TEST DOUBLE up to date in {args.out}")
        return 0
    shutil.rmtree(args.out, ignore_errors=True)
    (args.out / "rocm").mkdir(parents=True)
    key = subprocess.run([*gpg, "--armor", "--export", KEY_UID], check=True, capture_output=True).stdout
    (args.out / "rocm" / "rocm.gpg.key").write_bytes(key)
    # Its fingerprint, for the test inventories' rocm_apt_key_fingerprints (the role refuses any other key).
    colons = subprocess.run(
        [*gpg, "--with-colons", "--fingerprint", KEY_UID], check=True, capture_output=True, text=True
    ).stdout
    fpr = next(line.split(":")[9] for line in colons.splitlines() if line.startswith("fpr:"))
    (args.out / "rocm" / "rocm.gpg.key.fingerprint").write_text(fpr + "\n", encoding="utf-8")
    # One tree per path: releases may share a driver (7.2.1 and 7.2.2: 30.30.1) or a graphics tree (7.2.2 uses
    # graphics/7.2.1), and only the graphics trees AMD published exist (no graphics/7.2.2).
    graphics = graphics_map()
    found: dict[Path, tuple[list[Pkg], tuple[str, ...]]] = {}
    for ver, drv in version_map().items():
        gfx = graphics.get(ver, ver)
        found.setdefault(args.out / "rocm" / "apt" / ver, (rocm_packages(ver), ("amd64",)))
        found.setdefault(args.out / "graphics" / gfx / "ubuntu", (graphics_packages(gfx), ("amd64", "i386")))
        found.setdefault(args.out / "amdgpu" / drv / "ubuntu", (amdgpu_packages(drv), ("amd64", "i386")))
    trees = [(base, pkgs, archs) for base, (pkgs, archs) in found.items()]
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
        built = {
            base: list(pool.map(lambda p, b=base: build_deb(p, b / "pool" / "main"), pkgs))
            for base, pkgs, _ in trees
        }
    for base, _, archs in trees:
        for suite in SUITES:
            write_suite(base, suite, built[base], gpg, archs)
    stamp.write_text(digest + "\n", encoding="utf-8")
    count = sum(len(v) for v in built.values())
    print(
        f"AMD repo TEST DOUBLE: {len(trees)} trees, {count} packages, "
        f"suites {', '.join(SUITES)} in {args.out}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
