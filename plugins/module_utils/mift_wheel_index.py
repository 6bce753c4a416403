"""Whether a package index (PEP 503 "simple" page, as download.pytorch.org/whl/rocmX.Y/<name>/ serves it)
has a wheel of a pinned version for a node's interpreter, and what to pin instead. Stdlib only."""

from __future__ import annotations

import html
import re
import urllib.parse

_WHEEL = re.compile(r"([A-Za-z0-9_.+%-]+\.whl)")


def wheel_files(page: str) -> list[str]:
    """Wheel file names on an index page (hrefs and link texts, URL-decoded: ``%2B`` is ``+``)."""
    names: list[str] = []
    for raw in _WHEEL.findall(html.unescape(page)):
        name = urllib.parse.unquote(raw.rsplit("/", 1)[-1])
        if name not in names:
            names.append(name)
    return names


def _parts(filename: str) -> tuple[str, str, str, str] | None:
    """``torch-2.10.0+rocm7.0-cp311-cp311-manylinux_2_28_x86_64.whl`` -> (name, version, python, platform)."""
    stem = filename[: -len(".whl")]
    pieces = stem.split("-")
    if len(pieces) < 5:  # name-version[-build]-python-abi-platform
        return None
    return pieces[0].lower().replace("_", "-"), pieces[1], pieces[-3], pieces[-1]


def _fits(platform: str) -> bool:
    return "linux" in platform and platform.endswith("x86_64")


def has_wheel(files: list[str], name: str, version: str, python_tag: str) -> bool:
    """Whether ``files`` hold ``name==version`` for ``python_tag`` (cp311) on Linux x86_64."""
    want = name.lower().replace("_", "-")
    for filename in files:
        parts = _parts(filename)
        if (
            parts
            and parts[0] == want
            and parts[1] == version
            and python_tag in parts[2].split(".")
            and _fits(parts[3])
        ):
            return True
    return False


def versions_for(files: list[str], name: str, python_tag: str, label: str = "") -> list[str]:
    """Versions of ``name`` for ``python_tag`` on Linux x86_64, newest first; only those whose local label
    (``+rocm7.2``) equals ``label`` when one is given."""
    want = name.lower().replace("_", "-")
    found: set[str] = set()
    for filename in files:
        parts = _parts(filename)
        if not parts or parts[0] != want or python_tag not in parts[2].split(".") or not _fits(parts[3]):
            continue
        if label and parts[1].partition("+")[2] != label:
            continue
        found.add(parts[1])
    return sorted(found, key=_version_key, reverse=True)


def expected_file(name: str, version: str, python_tag: str) -> str:
    """The file a pin needs, as torch's manylinux wheels are named (platform shown as manylinux_*_x86_64)."""
    return f"{name}-{version}-{python_tag}-{python_tag}-manylinux_*_x86_64.whl"


def _version_key(version: str) -> tuple[tuple[int, ...], str]:
    public, _, label = version.partition("+")
    numbers = tuple(int(n) for n in re.findall(r"\d+", public))
    return numbers, label
