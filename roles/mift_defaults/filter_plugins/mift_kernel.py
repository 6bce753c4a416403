"""The kernel flavour metapackage that keeps a kernel's headers (or tools) current across kernel updates.

A kernel update installs a new linux-image-<release>; DKMS can build amdgpu for it only if
linux-headers-<release> arrives in the same update, and Ubuntu's /usr/bin/cpupower runs the copy of
linux-tools-<release>. The flavour's metapackage depends on the newest kernel's package, so an (unattended)
upgrade brings them together. The flavour is read from the running kernel's release string:

- Ubuntu ``5.15.0-125-generic`` (22.04 GA kernel 5.15) -> ``linux-headers-generic``; ``6.8.0-45-generic``
  on 22.04 (an HWE kernel: not the release's GA series) -> ``linux-headers-generic-hwe-22.04``.
- Debian ``6.1.0-57-amd64`` -> ``linux-headers-amd64`` (the metapackage of that flavour); Debian's cpupower is
  ``linux-cpupower``, not per kernel release, so there is no tools metapackage.
- Anything else (a mainline build such as ``6.2.0-060200-generic``, a cloud flavour whose metapackage naming
  this table does not know, a custom kernel): '' -- no metapackage is chosen; the inventory can name one.
"""

from __future__ import annotations

import re

# Ubuntu LTS -> its GA kernel series (domain-facts §1.1: 22.04 GA 5.15, HWE 6.8; 24.04 GA 6.8, HWE 6.14).
UBUNTU_GA_SERIES: dict[str, str] = {"22.04": "5.15", "24.04": "6.8"}
# Ubuntu flavours with GA and HWE metapackages (linux-headers-generic, linux-headers-generic-hwe-22.04).
UBUNTU_FLAVOURS = ("generic",)
# Debian kernel flavours whose metapackage is linux-headers-<flavour> (linux-signed-amd64 / linux source).
DEBIAN_FLAVOURS = ("amd64", "cloud-amd64", "rt-amd64")
KINDS = ("headers", "tools")

# <major>.<minor>.<patch>-<abi>-<flavour>; a mainline build's "abi" has six digits (060200): no metapackage.
_RELEASE = re.compile(r"^(?P<series>\d+\.\d+)\.\d+-(?P<abi>\d{1,5})-(?P<flavour>[a-z][a-z0-9-]*)$")


def kernel_metapackage(release: str, kind: str, distribution: str, version: str) -> str:
    """The ``kind`` (headers, tools) metapackage of kernel ``release``'s flavour, or '' when none is known."""
    if kind not in KINDS:
        raise ValueError(f"error: mift_kernel_metapackage: kind '{kind}' is not one of {', '.join(KINDS)}")
    m = _RELEASE.match(release.strip())
    if m is None:
        return ""
    flavour = m.group("flavour")
    if distribution == "Ubuntu":
        ga = UBUNTU_GA_SERIES.get(version)
        if ga is None or flavour not in UBUNTU_FLAVOURS:
            return ""
        hwe = "" if m.group("series") == ga else f"-hwe-{version}"
        return f"linux-{kind}-{flavour}{hwe}"
    if distribution == "Debian":
        if kind != "headers" or flavour not in DEBIAN_FLAVOURS:
            return ""
        return f"linux-headers-{flavour}"
    return ""


def _filter(release: str, kind: str, distribution: str, version: str) -> str:
    return kernel_metapackage(str(release), str(kind), str(distribution), str(version))


class FilterModule:
    """``{{ ansible_facts['kernel'] | mift_kernel_metapackage('headers', distribution, version) }}``."""

    def filters(self) -> dict[str, object]:
        return {"mift_kernel_metapackage": _filter}
