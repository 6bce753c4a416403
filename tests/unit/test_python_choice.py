"""The node venv's interpreter decision (plugins/module_utils/mift_python_choice.py, role python_env).

Ubuntu 22.04's python3 is 3.10, below the stack's minimum (LLaMA-Factory 0.9.5 and numpy 2.4.6 need 3.11):
jammy gets python3.11 from jammy-updates; noble (3.12) and bookworm (3.11) their system python3. Every row
installs the interpreter's own -dev package, so the builder's headers match the venv.
"""

from __future__ import annotations

import importlib.metadata as md
import sys
from pathlib import Path

import pytest
import yaml
from packaging.specifiers import SpecifierSet
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "plugins" / "module_utils"))

import mift_python_choice as c  # noqa: E402


@pytest.mark.parametrize(
    ("distribution", "release", "python", "packages"),
    [
        ("Ubuntu", "jammy", "/usr/bin/python3.11", ("python3.11", "python3.11-venv", "python3.11-dev")),
        ("Ubuntu", "noble", "/usr/bin/python3", ("python3", "python3-venv", "python3-dev")),
        ("Debian", "bookworm", "/usr/bin/python3", ("python3", "python3-venv", "python3-dev")),
    ],
)
def test_decision_per_release(
    distribution: str, release: str, python: str, packages: tuple[str, ...]
) -> None:
    choice = c.choose(distribution, release)
    assert choice.python == python
    assert choice.apt_packages == packages
    assert c.too_old(choice.version) is None  # every supported release's interpreter carries the stack


def test_jammy_never_gets_its_system_python3() -> None:
    choice = c.choose("Ubuntu", "Jammy")  # release names compare case-insensitively
    assert choice.version == "3.11" and "python3-dev" not in choice.apt_packages
    assert c.too_old("3.10.12") == (
        "Python 3.10.12 is older than 3.11, the stack's minimum "
        "(LLaMA-Factory 0.9.5 and numpy 2.4.6 require it)"
    )


@pytest.mark.parametrize(
    ("distribution", "release"), [("Ubuntu", "focal"), ("Debian", "trixie"), ("Rocky", "9")]
)
def test_unsupported_release_is_one_clear_line(distribution: str, release: str) -> None:
    with pytest.raises(c.UnsupportedPlatformError) as err:
        c.choose(distribution, release)
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith(f"python_env: no interpreter is known for {distribution} {release}; ")
    assert (
        "supported: Ubuntu jammy (python3.11), Ubuntu noble (python3.12), Debian bookworm (python3.11)"
        in message
    )
    assert message.endswith(
        "Set python_env_python (Python >= 3.11) and python_env_apt_packages to use another one."
    )


def test_versions_of_release_candidates_parse() -> None:
    # jammy-updates ships python3.11 3.11.0~rc1-1~22.04; its interpreter calls itself 3.11.0rc1
    assert c.parse_version("3.11.0rc1") == (3, 11, 0)
    assert c.too_old("3.11.0rc1") is None
    with pytest.raises(ValueError, match="not a Python version"):
        c.parse_version("python")


def test_role_minimum_is_the_decisions_minimum() -> None:
    role_vars = yaml.safe_load((ROOT / "roles" / "python_env" / "vars" / "main.yml").read_text())
    assert role_vars["_python_env_min_python"] == c.version_text(c.MIN_PYTHON)


def test_minimum_is_what_the_pinned_stack_requires() -> None:
    """The highest requires-python lower bound among the pins installed here is MIN_PYTHON (3.11)."""
    pins = {}
    for line in (ROOT / "requirements" / "node-cpu.txt").read_text().splitlines():
        if "==" in line and not line.startswith("#"):
            name, version = line.strip().split("==")
            pins[name.lower()] = version
    bounds: dict[str, Version] = {}
    for name, version in pins.items():
        try:
            dist = md.distribution(name)
        except md.PackageNotFoundError:
            continue
        spec = dist.metadata.get("Requires-Python")
        if dist.version != version or not spec:
            continue
        lows = [Version(s.version) for s in SpecifierSet(spec) if s.operator in (">=", ">")]
        if lows:
            bounds[name] = max(lows)
    if not {"llamafactory", "numpy"} <= set(bounds):
        pytest.skip("the pinned llamafactory and numpy are not installed in this environment")
    assert bounds["llamafactory"] >= Version("3.11") and bounds["numpy"] >= Version("3.11")
    highest = max(bounds.values())
    at_highest = {n: str(v) for n, v in bounds.items() if v == highest}
    assert (highest.major, highest.minor) == c.MIN_PYTHON, at_highest
