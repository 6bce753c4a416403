"""The kernel flavour metapackage decision (roles/mift_defaults/filter_plugins/mift_kernel.py).

Real kernel release strings, each with where it was seen:
- ``6.8.0-45-generic``: ``Python platform: Linux-6.8.0-45-generic-x86_64-with-glibc2.35`` in an 8x MI300X
  collect_env capture (shared/fixtures/gpu-tools/torch/mi300x_x8_vllm_collect_env_dstack_tgi_vs_vllm.txt);
  glibc 2.35 is Ubuntu 22.04, whose GA kernel is 5.15 (shared/reference/domain-facts.md §1.1): the HWE kernel.
- ``6.14.0-29-generic``: AMD's post-install ``dkms status`` sample on Ubuntu 24.04 (domain-facts §1.7);
  24.04's GA kernel is 6.8, so HWE.
- ``5.15.0-1073-azure``: the MI300X VF Azure VM of tests/fixtures/gpu-tools/INDEX.md
  (rocminfo/NEG_mi300x_vf_x4_azure_rccl_issue1728.txt).
- ``6.2.0-060200-generic``: a mainline build that amdgpu-dkms refused
  (shared/reference/anchors-and-user-needs.md).
- ``5.15.0-125-generic``: Ubuntu 22.04's GA series (5.15) in Ubuntu's <series>.0-<abi>-<flavour> form.
- ``6.1.0-57-amd64`` / ``6.1.0-50-amd64``: Debian 12's ``linux-headers-amd64`` 6.1.192-3 / 6.1.176-1 depend on
  ``linux-headers-6.1.0-57-amd64`` / ``-50-amd64`` (``apt-cache show linux-headers-amd64`` on Debian 12).
- ``6.18.44-fc-v1272``: the CI machine's own kernel (``uname -r``), a custom build.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from test_rocm_release_map import _RENDER

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "roles" / "mift_defaults" / "filter_plugins"))

import mift_kernel as k  # noqa: E402

HWE_2204 = "generic-hwe-22.04"
HWE_2404 = "generic-hwe-24.04"


@pytest.mark.parametrize(
    ("release", "distribution", "version", "headers", "tools"),
    [
        ("5.15.0-125-generic", "Ubuntu", "22.04", "linux-headers-generic", "linux-tools-generic"),
        ("6.8.0-45-generic", "Ubuntu", "22.04", f"linux-headers-{HWE_2204}", f"linux-tools-{HWE_2204}"),
        ("6.8.0-45-generic", "Ubuntu", "24.04", "linux-headers-generic", "linux-tools-generic"),
        ("6.14.0-29-generic", "Ubuntu", "24.04", f"linux-headers-{HWE_2404}", f"linux-tools-{HWE_2404}"),
        ("6.1.0-57-amd64", "Debian", "12", "linux-headers-amd64", ""),
        ("6.1.0-50-amd64", "Debian", "12", "linux-headers-amd64", ""),
    ],
)
def test_the_running_kernels_flavour_gives_its_metapackage(
    release: str, distribution: str, version: str, headers: str, tools: str
) -> None:
    assert k.kernel_metapackage(release, "headers", distribution, version) == headers
    assert k.kernel_metapackage(release, "tools", distribution, version) == tools


@pytest.mark.parametrize(
    ("release", "distribution", "version"),
    [
        ("6.2.0-060200-generic", "Ubuntu", "22.04"),  # mainline build: no metapackage follows it
        ("5.15.0-1073-azure", "Ubuntu", "22.04"),  # cloud flavour: its metapackage naming is not in the table
        ("6.18.44-fc-v1272", "Debian", "12"),  # custom kernel, no <abi>-<flavour>
        ("5.15.0-125-generic", "Ubuntu", "20.04"),  # a release without a GA series in the table
        ("6.1.0-57-amd64", "RedHat", "9"),
    ],
)
def test_no_metapackage_where_the_flavour_has_none_known(
    release: str, distribution: str, version: str
) -> None:
    assert k.kernel_metapackage(release, "headers", distribution, version) == ""
    assert k.kernel_metapackage(release, "tools", distribution, version) == ""


def test_an_unknown_kind_is_refused_in_one_line() -> None:
    want = r"^error: mift_kernel_metapackage: kind 'modules' is not one of headers, tools$"
    with pytest.raises(ValueError, match=want):
        k.kernel_metapackage("5.15.0-125-generic", "modules", "Ubuntu", "22.04")


def test_the_filter_is_registered_under_its_name() -> None:
    flt = k.FilterModule().filters()["mift_kernel_metapackage"]
    assert callable(flt)
    assert flt("6.8.0-45-generic", "headers", "Ubuntu", "22.04") == "linux-headers-generic-hwe-22.04"


# The roles' vars, templated by Ansible's Templar with the filter plugin loaded: test_rocm_release_map's
# child-process script (importing ansible patches sys.intern), given the filter folder.


def render(role: str, expr: str, release: str, distribution: str, version: str, **overrides: Any) -> Any:
    facts = {
        "kernel": release,
        "distribution": distribution,
        "distribution_version": version,
        "distribution_major_version": version.split(".", maxsplit=1)[0],
        "processor": [],
    }
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            _RENDER,
            str(ROOT / "roles" / role),
            expr,
            json.dumps({"ansible_facts": facts, "mift_defaults_rocm_version": "7.2.1", **overrides}),
            str(ROOT / "roles" / "mift_defaults" / "filter_plugins"),
        ],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    return json.loads(proc.stdout)


ROCM_APT = "{{ _rocm_kernel_install_packages }}"
CPUPOWER_APT = "{{ _host_tuning_cpupower_packages[ansible_facts['distribution']] }}"


def test_rocm_installs_the_running_kernels_headers_and_the_flavours_metapackage() -> None:
    assert render("rocm", ROCM_APT, "6.8.0-45-generic", "Ubuntu", "22.04") == [
        "linux-headers-6.8.0-45-generic",
        "linux-modules-extra-6.8.0-45-generic",
        "linux-headers-generic-hwe-22.04",
    ]
    assert render("rocm", ROCM_APT, "6.1.0-57-amd64", "Debian", "12") == [
        "linux-headers-6.1.0-57-amd64",
        "linux-headers-amd64",
    ]


def test_rocm_metapackage_none_or_named_by_the_inventory() -> None:
    assert render("rocm", ROCM_APT, "5.15.0-1073-azure", "Ubuntu", "22.04") == [
        "linux-headers-5.15.0-1073-azure",
        "linux-modules-extra-5.15.0-1073-azure",
    ]
    named = render(
        "rocm",
        ROCM_APT,
        "5.15.0-1073-azure",
        "Ubuntu",
        "22.04",
        rocm_kernel_headers_metapackage="linux-headers-azure",
    )
    assert named[-1] == "linux-headers-azure"
    off = render(
        "rocm", ROCM_APT, "5.15.0-125-generic", "Ubuntu", "22.04", rocm_kernel_headers_metapackage=""
    )
    assert off == ["linux-headers-5.15.0-125-generic", "linux-modules-extra-5.15.0-125-generic"]


def test_host_tuning_installs_the_flavours_tools_metapackage_with_cpupower() -> None:
    assert render("host_tuning", CPUPOWER_APT, "5.15.0-125-generic", "Ubuntu", "22.04") == [
        "linux-tools-common",
        "linux-tools-5.15.0-125-generic",
        "linux-tools-generic",
    ]
    assert render("host_tuning", CPUPOWER_APT, "6.8.0-45-generic", "Ubuntu", "22.04")[-1] == (
        "linux-tools-generic-hwe-22.04"
    )
    off = render(
        "host_tuning", CPUPOWER_APT, "6.8.0-45-generic", "Ubuntu", "22.04", host_tuning_tools_metapackage=""
    )
    assert off == ["linux-tools-common", "linux-tools-6.8.0-45-generic"]
    assert render("host_tuning", CPUPOWER_APT, "6.1.0-57-amd64", "Debian", "12") == ["linux-cpupower"]
