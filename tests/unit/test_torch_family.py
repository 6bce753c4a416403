"""The torch family probe (roles/pytorch/files/mift_torch_family.py).

Which requirements of the installed torch wheels come from PyTorch's index, and which are still missing
before the node's index is used."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.requirements import Requirement

REPO = Path(__file__).resolve().parents[2]
PROBE = REPO / "roles" / "pytorch" / "files" / "mift_torch_family.py"
FAMILY = {"torch", "torchvision", "torchaudio", "pytorch-triton-rocm", "triton-rocm", "triton"}

_spec = importlib.util.spec_from_file_location("mift_torch_family", PROBE)
assert _spec is not None
assert _spec.loader is not None
probe = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(probe)

# Requires-Dist lines: the first seven as in the real METADATA of torch-2.13.0+cpu (the rig's wheelhouse); the
# Triton lines in the form torch's ROCm wheels use (name==version; platform markers).
REQUIRES = [
    "filelock",
    "typing-extensions>=4.10.0",
    "setuptools>=77.0.3",
    "sympy>=1.13.3",
    "networkx>=2.5.1",
    "jinja2",
    "fsspec>=0.8.5",
    'optree>=0.13.0; extra == "optree"',
    'pytorch-triton-rocm==3.5.1; platform_system == "Linux" and platform_machine == "x86_64"',
    'triton-rocm==3.6.0; platform_system == "Windows"',
]


def test_only_family_members_that_apply_here_are_listed() -> None:
    reqs = probe.family_requirements(REQUIRES, FAMILY)
    if sys.platform == "linux" and __import__("platform").machine() == "x86_64":
        assert [probe.pin(r) for r in reqs] == ["pytorch-triton-rocm==3.5.1"]
    else:
        assert [probe.pin(r) for r in reqs] == []


def test_the_dependencies_outside_the_family_are_left_to_the_node_index() -> None:
    names = {r.name for r in probe.family_requirements(REQUIRES, FAMILY)}
    assert names.isdisjoint({"filelock", "sympy", "networkx", "jinja2", "fsspec", "typing-extensions"})


def test_a_missing_or_other_version_is_unsatisfied() -> None:
    reqs = [Requirement("surely-not-installed-mift==1.0"), Requirement("pytest==0.0.1")]
    assert probe.unsatisfied(reqs) == [
        "surely-not-installed-mift==1.0 (installed: none)",
        f"pytest==0.0.1 (installed: {pytest.__version__})",
    ]


def test_an_installed_match_is_satisfied() -> None:
    assert probe.unsatisfied([Requirement(f"pytest=={pytest.__version__}")]) == []


def test_the_script_prints_json_for_installed_distributions() -> None:
    proc = subprocess.run(
        [sys.executable, str(PROBE), "--dists", "pytest", "--family", "pluggy", "iniconfig"],
        capture_output=True,
        text=True,
        check=True,
    )
    result = json.loads(proc.stdout)
    assert result["unsatisfied"] == []
    names = {Requirement(entry).name for entry in result["family"]}
    assert names == {"pluggy", "iniconfig"}


def test_the_script_names_a_distribution_that_is_not_installed() -> None:
    proc = subprocess.run(
        [sys.executable, str(PROBE), "--dists", "surely-not-installed-mift", "--family", "triton"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 1
    assert json.loads(proc.stdout) == {"error": "surely-not-installed-mift is not installed"}
