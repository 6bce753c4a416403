"""Which interpreter builds the controller's venv (tools/bootstrap): one decision, from /etc/os-release and
the pythons on PATH.

The launcher needs Python 3.11 or newer (pyproject.toml ``requires-python``). Ubuntu 22.04's python3 is 3.10,
so there the venv is built with python3.11 from jammy-updates (universe: ``python3.11``,
``python3.11-venv``); Ubuntu 24.04 (3.12) and Debian 12 (3.11) use their system python3 with
``python3-venv``. Elsewhere the newest python3.N >= 3.11 that can make a venv is taken. Anything else is
refused in one line naming what to install.

Standard library only, and valid on Python 3.8+: tools/bootstrap runs it with whatever ``python3`` the machine
has (3.10 on Ubuntu 22.04) before any venv exists. Usage: ``python3 tools/controller_python.py`` prints the
interpreter's path (exit 0) or the refusal line on stderr (exit 1).
Tests: tests/unit/test_controller_python.py.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

# pyproject.toml: requires-python = ">=3.11"
MIN_PYTHON: tuple[int, int] = (3, 11)
# the names looked up on PATH, newest first
CANDIDATES = ("python3.14", "python3.13", "python3.12", "python3.11", "python3")


@dataclass(frozen=True)
class Found:
    """One interpreter on PATH: its path, version and whether ``python -m venv`` works (ensurepip present)."""

    path: str
    version: tuple[int, int]
    venv: bool


@dataclass(frozen=True)
class Release:
    """What a supported controller OS needs: the interpreter name and the apt packages that provide it."""

    name: str  # as looked up on PATH
    version: tuple[int, int]
    packages: tuple[str, ...]


# (os-release ID, VERSION_ID) -> the interpreter of that release
RELEASES: dict[tuple[str, str], Release] = {
    ("ubuntu", "22.04"): Release("python3.11", (3, 11), ("python3.11", "python3.11-venv")),
    ("ubuntu", "24.04"): Release("python3", (3, 12), ("python3", "python3-venv")),
    ("debian", "12"): Release("python3", (3, 11), ("python3", "python3-venv")),
}


@dataclass(frozen=True)
class Decision:
    """Either the interpreter to build the venv with, or the one line that says what to install."""

    python: str | None = None
    refusal: str | None = None


def _v(version: tuple[int, int]) -> str:
    return f"{version[0]}.{version[1]}"


def supported() -> str:
    """The supported controller releases, e.g. ``Ubuntu 22.04 (python3.11), ...``."""
    return ", ".join(
        f"{os_id.capitalize()} {ver} (python{_v(r.version)})" for (os_id, ver), r in RELEASES.items()
    )


def choose(os_id: str, version_id: str, found: dict[str, Found]) -> Decision:
    """Pick the venv's interpreter for this OS from ``found`` (name on PATH -> what it is)."""
    release = RELEASES.get((os_id, version_id))
    if release is not None:
        have = found.get(release.name)
        if have is not None and have.version >= MIN_PYTHON and have.venv:
            return Decision(python=have.path)
        if have is None:
            state, missing = "is missing", release.packages
        elif have.version < MIN_PYTHON:
            state, missing = f"is {_v(have.version)}, older than {_v(MIN_PYTHON)}", release.packages
        else:
            state, missing = f"({_v(have.version)}) has no venv module", release.packages[1:]
        return Decision(
            refusal=f"bootstrap: {os_id.capitalize()} {version_id}: {release.name} {state}; "
            f"install it: apt-get install {' '.join(missing)}"
        )
    usable = sorted(
        (f for f in found.values() if f.version >= MIN_PYTHON and f.venv),
        key=lambda f: f.version,
        reverse=True,
    )
    if usable:
        return Decision(python=usable[0].path)
    return Decision(
        refusal=f"bootstrap: {os_id or 'unknown OS'} {version_id}: no Python >= {_v(MIN_PYTHON)} with its "
        f"venv module on PATH; install one (supported controllers: {supported()})"
    )


def read_os_release(path: Path = Path("/etc/os-release")) -> tuple[str, str]:
    """``(ID, VERSION_ID)`` of os-release(5); empty strings where absent."""
    values: dict[str, str] = {}
    try:
        text = path.read_text(encoding="utf-8")
    except OSError:
        return "", ""
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep:
            values[key.strip()] = value.strip().strip("\"'")
    return values.get("ID", ""), values.get("VERSION_ID", "")


_PROBE = "import sys; v = sys.version_info; import ensurepip, venv; print(v[0], v[1])"
_VERSION = "import sys; v = sys.version_info; print(v[0], v[1])"


def probe(names: tuple[str, ...] = CANDIDATES) -> dict[str, Found]:
    """Each name on PATH with its version and whether its venv module works (Debian strips ensurepip without
    the ``python3.N-venv`` package)."""
    found: dict[str, Found] = {}
    for name in names:
        path = shutil.which(name)
        if path is None:
            continue
        out = subprocess.run([path, "-c", _VERSION], capture_output=True, text=True, timeout=30, check=False)
        if out.returncode != 0 or len(out.stdout.split()) != 2:
            continue
        major, minor = (int(x) for x in out.stdout.split())
        has_venv = (
            subprocess.run([path, "-c", _PROBE], capture_output=True, timeout=30, check=False).returncode == 0
        )
        found[name] = Found(path=path, version=(major, minor), venv=has_venv)
    return found


def main() -> int:
    """Print the chosen interpreter, or the refusal line on stderr."""
    os_id, version_id = read_os_release()
    decision = choose(os_id, version_id, probe())
    if decision.python is None:
        print(decision.refusal, file=sys.stderr)
        return 1
    print(decision.python)
    return 0


if __name__ == "__main__":
    sys.exit(main())
