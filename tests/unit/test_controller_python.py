"""The controller's interpreter decision (tools/controller_python.py, run by tools/bootstrap before a venv).

The table: OS (os-release ID and VERSION_ID) x the pythons on PATH -> the interpreter chosen, or the one
refusal line that names what to install. Found entries are written by hand (the OSes are not here: this
machine is Debian 12); the probe itself runs once against this machine's own interpreter.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))

import controller_python as cp  # noqa: E402

PY310 = cp.Found("/usr/bin/python3", (3, 10), venv=True)
PY311 = cp.Found("/usr/bin/python3.11", (3, 11), venv=True)
PY311_NO_VENV = cp.Found("/usr/bin/python3.11", (3, 11), venv=False)
PY3_311 = cp.Found("/usr/bin/python3", (3, 11), venv=True)
PY3_311_NO_VENV = cp.Found("/usr/bin/python3", (3, 11), venv=False)
PY3_312 = cp.Found("/usr/bin/python3", (3, 12), venv=True)
PY3_312_NO_VENV = cp.Found("/usr/bin/python3", (3, 12), venv=False)
PY312_LOCAL = cp.Found("/usr/local/bin/python3.12", (3, 12), venv=True)

# (ID, VERSION_ID, found on PATH) -> chosen path, or the refusal line
TABLE: list[tuple[str, str, dict[str, cp.Found], str]] = [
    ("ubuntu", "22.04", {"python3": PY310, "python3.11": PY311}, "/usr/bin/python3.11"),
    (
        "ubuntu",
        "22.04",
        {"python3": PY310},
        "bootstrap: Ubuntu 22.04: python3.11 is missing; install it: "
        "apt-get install python3.11 python3.11-venv",
    ),
    (
        "ubuntu",
        "22.04",
        {"python3": PY310, "python3.11": PY311_NO_VENV},
        "bootstrap: Ubuntu 22.04: python3.11 (3.11) has no venv module; install it: "
        "apt-get install python3.11-venv",
    ),
    ("ubuntu", "24.04", {"python3": PY3_312, "python3.12": PY3_312}, "/usr/bin/python3"),
    (
        "ubuntu",
        "24.04",
        {"python3": PY3_312_NO_VENV},
        "bootstrap: Ubuntu 24.04: python3 (3.12) has no venv module; install it: "
        "apt-get install python3-venv",
    ),
    ("debian", "12", {"python3": PY3_311, "python3.11": PY3_311}, "/usr/bin/python3"),
    (
        "debian",
        "12",
        {"python3": PY3_311_NO_VENV},
        "bootstrap: Debian 12: python3 (3.11) has no venv module; install it: apt-get install python3-venv",
    ),
    (
        "debian",
        "12",
        {},
        "bootstrap: Debian 12: python3 is missing; install it: apt-get install python3 python3-venv",
    ),
    ("fedora", "40", {"python3": PY3_312, "python3.12": PY312_LOCAL}, "/usr/bin/python3"),
    ("debian", "11", {"python3": PY310, "python3.12": PY312_LOCAL}, "/usr/local/bin/python3.12"),
    (
        "debian",
        "11",
        {"python3": cp.Found("/usr/bin/python3", (3, 9), venv=True)},
        "bootstrap: debian 11: no Python >= 3.11 with its venv module on PATH; install one (supported "
        "controllers: Ubuntu 22.04 (python3.11), Ubuntu 24.04 (python3.12), Debian 12 (python3.11))",
    ),
]


@pytest.mark.parametrize(("os_id", "version_id", "found", "expected"), TABLE)
def test_decision_table(os_id: str, version_id: str, found: dict[str, cp.Found], expected: str) -> None:
    decision = cp.choose(os_id, version_id, found)
    if expected.startswith("bootstrap:"):
        assert (decision.python, decision.refusal) == (None, expected)
    else:
        assert (decision.python, decision.refusal) == (expected, None)


def test_every_refusal_is_one_line() -> None:
    for os_id, version_id, found, _ in TABLE:
        refusal = cp.choose(os_id, version_id, found).refusal
        assert refusal is None or "\n" not in refusal


def test_os_release_parsing(tmp_path: Path) -> None:
    path = tmp_path / "os-release"
    path.write_text('PRETTY_NAME="Ubuntu 22.04.4 LTS"\nID=ubuntu\nVERSION_ID="22.04"\nID_LIKE=debian\n')
    assert cp.read_os_release(path) == ("ubuntu", "22.04")
    assert cp.read_os_release(tmp_path / "absent") == ("", "")


def test_probe_reads_this_machines_interpreter() -> None:
    # the running interpreter has a working venv module (the shared venv was made with it)
    found = cp.probe((Path(sys.executable).name,))
    (only,) = found.values()
    assert only.version == sys.version_info[:2]
    assert only.venv is True


def test_minimum_is_pyprojects() -> None:
    text = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    assert f'requires-python = ">={cp.MIN_PYTHON[0]}.{cp.MIN_PYTHON[1]}"' in text
