"""Which interpreter builds the node venv, per (distribution, release): the python_env role's one decision.

The stack needs Python 3.11 or newer: LLaMA-Factory 0.9.5 declares ``requires-python >=3.11.0`` and the
pinned numpy 2.4.6 ``>=3.11`` (sources in docs/stack.md, "Interpreter"). Ubuntu 22.04's python3 is 3.10, so
on jammy the venv is built with python3.11 from jammy-updates (universe); Ubuntu 24.04 (3.12) and Debian 12
(3.11) use their system python3. Every row lists the interpreter, its venv module and its headers, so the
build host's ``-dev`` package always matches the venv's interpreter.

Pure Python, no Ansible import: the role's module ``mift_python_interpreter`` and the unit tests import it.
"""

from __future__ import annotations

from dataclasses import dataclass

# Oldest interpreter the pinned stack installs on (LLaMA-Factory 0.9.5, numpy 2.4.6).
MIN_PYTHON: tuple[int, int] = (3, 11)


@dataclass(frozen=True)
class Choice:
    """The interpreter of one supported release and the apt packages that provide it."""

    python: str
    version: str  # major.minor the release ships under that path
    apt_packages: tuple[str, ...]
    source: str  # where the packages come from (documentation)


# (distribution, release codename) -> interpreter. ansible_facts['distribution'] / ['distribution_release'].
CHOICES: dict[tuple[str, str], Choice] = {
    ("Ubuntu", "jammy"): Choice(
        python="/usr/bin/python3.11",
        version="3.11",
        apt_packages=("python3.11", "python3.11-venv", "python3.11-dev"),
        source="jammy-updates, universe (python3 of jammy is 3.10, below the stack's minimum)",
    ),
    ("Ubuntu", "noble"): Choice(
        python="/usr/bin/python3",
        version="3.12",
        apt_packages=("python3", "python3-venv", "python3-dev"),
        source="noble, main/universe (system python3)",
    ),
    ("Debian", "bookworm"): Choice(
        python="/usr/bin/python3",
        version="3.11",
        apt_packages=("python3", "python3-venv", "python3-dev"),
        source="bookworm, main (system python3)",
    ),
}


class UnsupportedPlatformError(ValueError):
    """No interpreter is known for this distribution and release."""


def supported() -> str:
    """Return the supported releases as one readable list, e.g. ``Ubuntu jammy (python3.11), ...``."""
    return ", ".join(f"{d} {r} (python{c.version})" for (d, r), c in CHOICES.items())


def choose(distribution: str, release: str) -> Choice:
    """Return the interpreter for ``distribution`` / ``release``, or raise with one line saying what to do."""
    choice = CHOICES.get((distribution, release.lower()))
    if choice is None:
        raise UnsupportedPlatformError(
            f"python_env: no interpreter is known for {distribution} {release or '(no release)'}; supported: "
            f"{supported()}. Set python_env_python (Python >= {version_text(MIN_PYTHON)}) and "
            "python_env_apt_packages to use another one."
        )
    return choice


def version_text(version: tuple[int, ...]) -> str:
    """Return ``(3, 11)`` as ``3.11``."""
    return ".".join(str(part) for part in version)


def parse_version(text: str) -> tuple[int, ...]:
    """Return ``3.11.0`` (or ``3.11.0rc1``, as a release-candidate build reports itself) as ``(3, 11, 0)``."""
    parts: list[int] = []
    for piece in text.strip().split("."):
        digits = ""
        for char in piece:
            if not char.isdigit():
                break
            digits += char
        if not digits:
            break
        parts.append(int(digits))
    if len(parts) < 2:
        raise ValueError(f"not a Python version: {text!r}")
    return tuple(parts)


def too_old(version: str, minimum: tuple[int, int] = MIN_PYTHON) -> str | None:
    """Return a one-line reason when ``version`` is below ``minimum`` (None: new enough)."""
    if parse_version(version)[:2] >= minimum:
        return None
    return (
        f"Python {version} is older than {version_text(minimum)}, the stack's minimum "
        "(LLaMA-Factory 0.9.5 and numpy 2.4.6 require it)"
    )
