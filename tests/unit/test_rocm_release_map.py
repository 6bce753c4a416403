"""The rocm role's release map: the repository lines each ROCm release writes, from the role's own data.

The role's vars/main.yml and defaults/main.yml are templated by Ansible's own Templar (no host), so
these cases check the Jinja the role runs, not a copy of it. Sources of each pair: docs/rocm.md.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
ROLE = REPO / "roles" / "rocm"
BASE = "https://repo.radeon.com"


# Ansible's Templar runs in a child process: importing ansible patches sys.intern (ansible.module_utils
# _internal._patches), which breaks torch._dynamo in later tests of the same pytest process.
_RENDER = """
import json, sys
import yaml
from ansible.parsing.dataloader import DataLoader
from ansible.template import Templar, trust_as_template

def trust(value):
    if isinstance(value, str):
        return trust_as_template(value)
    if isinstance(value, dict):
        return {key: trust(item) for key, item in value.items()}
    if isinstance(value, list):
        return [trust(item) for item in value]
    return value

role, expr, overrides = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
if len(sys.argv) > 4:  # a filter plugin folder (test_kernel_metapackage.py: mift_defaults' filters)
    from ansible.plugins.loader import filter_loader
    filter_loader.add_directory(sys.argv[4])
variables = {}
for name in ("defaults", "vars"):
    with open(f"{role}/{name}/main.yml", encoding="utf-8") as fh:
        variables.update(yaml.safe_load(fh))
variables = trust(variables)
variables.update(
    mift_defaults_rocm_version="7.2.4",
    mift_defaults_facts_dir="/etc/ansible/facts.d",
    ansible_facts={"distribution": "Ubuntu", "distribution_major_version": "22", "kernel": "5.15.0-1"},
)
variables.update(overrides)
print(json.dumps(Templar(loader=DataLoader(), variables=variables).template(trust_as_template(expr))))
"""


def render(expr: str, **overrides: Any) -> Any:
    """Template ``expr`` with the role's defaults and vars, as on an Ubuntu 22.04 host."""
    proc = subprocess.run(
        [sys.executable, "-c", _RENDER, str(ROLE), expr, json.dumps(overrides)],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    return json.loads(proc.stdout)


# ROCm release -> (rocm/apt path, graphics path, amdgpu path)
RELEASES = {
    "7.0": ("7.0", "7.0", "30.10"),
    "7.0.1": ("7.0.1", "7.0.1", "30.10.1"),
    "7.0.2": ("7.0.2", "7.0.2", "30.10.2"),
    "7.1": ("7.1", "7.1", "30.20"),
    "7.1.1": ("7.1.1", "7.1.1", "30.20.1"),
    "7.2": ("7.2", "7.2", "30.30"),
    "7.2.1": ("7.2.1", "7.2.1", "30.30.1"),
    "7.2.2": ("7.2.2", "7.2.1", "30.30.1"),  # published under graphics/7.2.1 and amdgpu/30.30.1
    "7.2.3": ("7.2.3", "7.2.3", "30.30.3"),
    "7.2.4": ("7.2.4", "7.2.4", "30.30.4"),
}


@pytest.mark.parametrize(("release", "paths"), RELEASES.items())
def test_each_release_writes_its_three_repository_lines(release: str, paths: tuple[str, str, str]) -> None:
    rocm, graphics, amdgpu = paths
    lines = render("{{ _rocm_repo_lines }}", rocm_version=release)
    key = "signed-by=/etc/apt/keyrings/rocm.asc"
    assert lines == {
        "rocm": f"deb [arch=amd64 {key}] {BASE}/rocm/apt/{rocm} jammy main",
        "graphics": f"deb [arch=amd64 {key}] {BASE}/graphics/{graphics}/ubuntu jammy main",
        "amdgpu": f"deb [arch=amd64,i386 {key}] {BASE}/amdgpu/{amdgpu}/ubuntu jammy main",
    }


def test_the_map_holds_exactly_these_releases() -> None:
    assert list(render("{{ _rocm_driver_versions.keys() | list }}")) == list(RELEASES)


@pytest.mark.parametrize("release", ["7.2.2", "7.2.3", "7.2.4"])
def test_installed_version_of_a_patch_release_is_the_release_itself(release: str) -> None:
    # /opt/rocm/.info/version and rocm-core start with the ROCm release, not the graphics one.
    assert render("{{ _rocm_full_version }}", rocm_version=release) == release


def test_graphics_and_driver_overrides_win_over_the_map() -> None:
    lines = render(
        "{{ _rocm_repo_lines }}",
        rocm_version="7.2.2",
        rocm_graphics_version="7.2.2",
        rocm_driver_version="30.30.2",
    )
    assert "/graphics/7.2.2/ubuntu" in lines["graphics"]
    assert "/amdgpu/30.30.2/ubuntu" in lines["amdgpu"]


def test_unknown_release_has_no_driver_and_keeps_its_graphics_path() -> None:
    # preflight.yml refuses an empty driver release before anything is written.
    assert render("{{ _rocm_driver_version }}", rocm_version="7.3") == ""
    assert render("{{ _rocm_graphics_version }}", rocm_version="7.3") == "7.3"


@pytest.mark.parametrize(
    ("path", "key"),
    [
        ("inventory/example/group_vars/all.yml", "rocm_version"),
        ("roles/mift_defaults/defaults/main.yml", "mift_defaults_rocm_version"),
    ],
)
def test_example_inventory_and_default_avoid_the_hipcc_cmath_issue_of_7_0(path: str, key: str) -> None:
    # hipcc on Ubuntu 22.04 with ROCm 7.0.x: "'cmath' file not found" (AMD verified issue, fixed in 7.1.0).
    release = str(yaml.safe_load((REPO / path).read_text(encoding="utf-8"))[key])
    assert release in RELEASES
    assert tuple(int(part) for part in release.split(".")) >= (7, 1)
