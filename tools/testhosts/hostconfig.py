"""Where the test rig downloads from: the controller's own Debian mirror and Python package index.

Usage (``tools/testhosts/rig setup`` calls it; each prints ``URL ORIGIN`` on one line)::

    hostconfig.py mirror [--release bookworm]   # RIG_MIRROR, else the mirror the controller's apt uses
    hostconfig.py index                         # RIG_INDEX_URL, else the index this Python's pip uses

The mirror is the first enabled ``deb`` entry, in apt's reading order (``sources.list``, then the files
of ``sources.list.d`` by name, ``*.list`` one-line and ``*.sources`` deb822 alike), whose suite is the
release; failing that, the first entry of a main archive suite (no ``-updates``, ``-security``,
``-backports``). Entries of a ``debian-security`` archive and URIs debootstrap cannot fetch (``cdrom:``,
``mirror+``, ``tor+``) are skipped. The files are those apt reads (``apt-config``: ``Dir::Etc::sourcelist``,
``Dir::Etc::sourceparts``); ``RIG_APT_SOURCES_LIST`` and ``RIG_APT_SOURCES_DIR`` point elsewhere (tests, a
copy of another machine's configuration).

The index is the ``index-url`` that ``pip download`` takes from ``pip config list`` (precedence as in pip's
own option parser: ``:env:`` over ``[download]`` over ``[global]``), else pip's built-in default, read from
pip itself (``pip._internal.models.index.PyPI.simple_url``). ``extra-index-url`` entries stay pip's business
(the rig's pip reads them from the same configuration); :func:`network_endpoints` lists their hosts too.

A failure is one line on stderr naming what was read, and exit status 1.
"""

from __future__ import annotations

import argparse
import ast
import os
import subprocess
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

DEFAULT_RELEASE = "bookworm"
# URI schemes debootstrap can fetch from (its "download" function: http, https, ftp via wget; file via cp)
DEBOOTSTRAP_SCHEMES = ("http", "https", "ftp", "file")
# apt's StringToBool (apt-pkg/contrib/strutl.cc): the words it reads as false
_APT_FALSE = frozenset({"no", "false", "without", "off", "disable", "0"})


class ConfigError(Exception):
    """The controller's configuration gave no usable answer (message: one line)."""


@dataclass(frozen=True)
class AptEntry:
    """One apt source: a one-line ``deb`` line or a deb822 stanza."""

    types: tuple[str, ...]
    uris: tuple[str, ...]
    suites: tuple[str, ...]
    enabled: bool
    origin: str  # FILE:LINE of the line or stanza


@dataclass(frozen=True)
class Choice:
    """A URL and where it came from."""

    url: str
    origin: str


# ------------------------------------------------------------------------------------------------- apt
def parse_deb822(text: str, origin: str) -> list[AptEntry]:
    """The stanzas of a deb822 ``.sources`` file (sources.list(5): "DEB822-STYLE FORMAT")."""
    entries: list[AptEntry] = []
    fields: dict[str, str] = {}
    start = 0
    key = ""

    def flush() -> None:
        if fields:
            entries.append(
                AptEntry(
                    types=tuple(fields.get("types", "").split()),
                    uris=tuple(fields.get("uris", "").split()),
                    suites=tuple(fields.get("suites", "").split()),
                    enabled=fields.get("enabled", "yes").strip().lower() not in _APT_FALSE,
                    origin=f"{origin}:{start}",
                )
            )
        fields.clear()

    for number, line in enumerate(text.splitlines(), 1):
        if line.startswith("#"):
            continue
        if not line.strip():
            flush()
            key = ""
            continue
        if line[0] in " \t":
            if not key:
                raise ConfigError(f"{origin}:{number}: continuation line outside a field")
            fields[key] += " " + line.strip()
            continue
        name, sep, value = line.partition(":")
        if not sep or not name.strip():
            raise ConfigError(f"{origin}:{number}: expected 'Field: value', got {line.strip()!r}")
        if not fields:
            start = number
        key = name.strip().lower()
        fields[key] = value.strip()
    flush()
    return entries


def parse_one_line(text: str, origin: str) -> list[AptEntry]:
    """The entries of a one-line ``sources.list`` file (sources.list(5): "ONE-LINE-STYLE FORMAT")."""
    entries: list[AptEntry] = []
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()  # apt drops everything after a '#'
        if not line:
            continue
        kind, _, rest = line.partition(" ")
        rest = rest.strip()
        if rest.startswith("["):
            _, closed, rest = rest.partition("]")
            if not closed:
                raise ConfigError(f"{origin}:{number}: '[' of the options is never closed")
        words = rest.split()
        if len(words) < 2:
            raise ConfigError(f"{origin}:{number}: expected 'TYPE [OPTIONS] URI SUITE ...', got {line!r}")
        entries.append(
            AptEntry(
                types=(kind,), uris=(words[0],), suites=(words[1],), enabled=True, origin=f"{origin}:{number}"
            )
        )
    return entries


def read_apt_sources(sources_list: Path, sources_dir: Path) -> list[AptEntry]:
    """Every entry apt reads, in its order: ``sources_list``, then ``sources_dir/*.{list,sources}``."""
    entries: list[AptEntry] = []
    files = [sources_list] if sources_list.is_file() else []
    if sources_dir.is_dir():
        files += sorted(p for p in sources_dir.iterdir() if p.suffix in {".list", ".sources"} and p.is_file())
    for path in files:
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"{path}: cannot read: {exc}") from exc
        parse = parse_deb822 if path.suffix == ".sources" else parse_one_line
        entries += parse(text, str(path))
    return entries


def _is_security(uri: str, suite: str) -> bool:
    return suite.endswith(("-security", "/updates")) or uri.rstrip("/").endswith("-security")


def _main_archive(suite: str) -> bool:
    return "-" not in suite and "/" not in suite


def debian_mirror(entries: Iterable[AptEntry], release: str = DEFAULT_RELEASE) -> Choice | None:
    """The mirror debootstrap should use for ``release``, from entries in apt's order (None: none fits)."""
    candidates: list[tuple[bool, Choice]] = []
    for entry in entries:
        if not entry.enabled or "deb" not in entry.types:
            continue
        for uri in entry.uris:
            if urlsplit(uri).scheme not in DEBOOTSTRAP_SCHEMES:
                continue
            for suite in entry.suites:
                if _is_security(uri, suite) or not _main_archive(suite):
                    continue
                candidates.append((suite == release, Choice(uri, entry.origin)))
    exact = [choice for match, choice in candidates if match]
    if exact:
        return exact[0]
    return candidates[0][1] if candidates else None


def apt_source_paths(env: Mapping[str, str]) -> tuple[Path, Path]:
    """The sources.list file and sources.list.d folder: ``RIG_APT_SOURCES_*``, else apt's own settings."""
    sources_list, sources_dir = Path("/etc/apt/sources.list"), Path("/etc/apt/sources.list.d")
    try:
        proc = subprocess.run(
            ["apt-config", "shell", "SL", "Dir::Etc::sourcelist/f", "SD", "Dir::Etc::sourceparts/d"],
            capture_output=True,
            text=True,
            check=True,
            timeout=30,
        )
    except (OSError, subprocess.SubprocessError):
        pass  # no apt-config here: apt's compiled-in defaults
    else:
        found = dict(_shell_assignments(proc.stdout))
        sources_list = Path(found.get("SL", sources_list))
        sources_dir = Path(found.get("SD", sources_dir))
    return (
        Path(env.get("RIG_APT_SOURCES_LIST") or sources_list),
        Path(env.get("RIG_APT_SOURCES_DIR") or sources_dir),
    )


def _shell_assignments(text: str) -> Iterable[tuple[str, str]]:
    """``NAME='value'`` lines as ``apt-config shell`` prints them."""
    for line in text.splitlines():
        name, sep, value = line.partition("=")
        if sep and len(value) >= 2 and value[0] == value[-1] == "'":
            yield name, value[1:-1]


def mirror(env: Mapping[str, str], release: str = DEFAULT_RELEASE) -> Choice:
    """``RIG_MIRROR``, else the controller apt's mirror for ``release``."""
    if env.get("RIG_MIRROR"):
        return Choice(env["RIG_MIRROR"], "RIG_MIRROR")
    sources_list, sources_dir = apt_source_paths(env)
    found = debian_mirror(read_apt_sources(sources_list, sources_dir), release)
    if found is None:
        raise ConfigError(
            f"no Debian mirror for {release} in {sources_list} or {sources_dir}/*.list|*.sources "
            f"(an enabled 'deb' entry with an {'/'.join(DEBOOTSTRAP_SCHEMES)} URI); set RIG_MIRROR=URL"
        )
    return found


# ------------------------------------------------------------------------------------------------- pip
def parse_pip_config_list(text: str) -> dict[str, str]:
    """``pip config list`` output (``section.key='value'`` per line, the value as Python's repr) as a dict."""
    config: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        key, sep, value = line.partition("=")
        try:
            parsed = ast.literal_eval(value) if sep else None
        except (ValueError, SyntaxError):
            parsed = None
        if not isinstance(parsed, str) or "." not in key:
            raise ConfigError(f"pip config list, line {number}: expected section.key='value', got {line!r}")
        section, name = key.split(".", 1)
        config[f"{section}.{name.lower().replace('_', '-')}"] = parsed
    return config


def _pip_value(config: Mapping[str, str], key: str, command: str) -> tuple[str, str] | None:
    """The value of ``key`` for ``pip <command>``, sections in ConfigOptionParser's order; empty is unset."""
    for section in (":env:", command, "global"):
        value = config.get(f"{section}.{key}", "")
        if value.strip():
            return value.strip(), f"pip config {section}.{key}"
    return None


def pip_index(config: Mapping[str, str], default: str, command: str = "download") -> Choice:
    """The ``index-url`` pip uses for ``command``, else ``default`` (pip's built-in)."""
    found = _pip_value(config, "index-url", command)
    if found is None:
        return Choice(default, "pip's default (no index-url configured)")
    return Choice(*found)


def pip_extra_indexes(config: Mapping[str, str], command: str = "download") -> list[str]:
    found = _pip_value(config, "extra-index-url", command)
    return found[0].split() if found else []


def _pip(python: str, *args: str) -> str:
    argv = [python, *args]
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
    except (OSError, subprocess.SubprocessError) as exc:
        raise ConfigError(f"{' '.join(argv)}: {exc}; set RIG_INDEX_URL=URL") from exc
    if proc.returncode != 0:
        why = (proc.stderr.strip().splitlines() or [f"exit status {proc.returncode}"])[-1]
        raise ConfigError(f"{' '.join(argv)} failed: {why}; set RIG_INDEX_URL=URL")
    return proc.stdout


def pip_config(python: str) -> dict[str, str]:
    return parse_pip_config_list(_pip(python, "-m", "pip", "config", "list"))


def pip_default_index(python: str) -> str:
    """pip's built-in index URL, as pip itself defines it."""
    code = "from pip._internal.models.index import PyPI; print(PyPI.simple_url)"
    url = _pip(python, "-c", code).strip()
    if not urlsplit(url).scheme:
        raise ConfigError(f"{python}: pip's PyPI.simple_url is {url!r}, not a URL; set RIG_INDEX_URL=URL")
    return url


def index(env: Mapping[str, str], python: str) -> Choice:
    """``RIG_INDEX_URL``, else the index ``python -m pip download`` uses."""
    if env.get("RIG_INDEX_URL"):
        return Choice(env["RIG_INDEX_URL"], "RIG_INDEX_URL")
    config = pip_config(python)
    if _pip_value(config, "index-url", "download") is None:
        return pip_index(config, pip_default_index(python))
    return pip_index(config, "")


# --------------------------------------------------------------------------------------------- targets
def network_endpoints(urls: Iterable[str]) -> list[tuple[str, int]]:
    """(host, port) of each network URL (file: and other local URLs have none), in order, without repeats."""
    default_ports = {"http": 80, "https": 443, "ftp": 21}
    found: list[tuple[str, int]] = []
    for url in urls:
        parts = urlsplit(url)
        if parts.hostname and parts.scheme in default_ports:
            endpoint = (parts.hostname, parts.port or default_ports[parts.scheme])
            if endpoint not in found:
                found.append(endpoint)
    return found


def controller_urls(env: Mapping[str, str], python: str, release: str = DEFAULT_RELEASE) -> list[str]:
    """Every URL the rig's setup downloads from: the mirror, the index and pip's extra indexes."""
    urls = [mirror(env, release).url, index(env, python).url]
    return urls + pip_extra_indexes(pip_config(python))


# ------------------------------------------------------------------------------------------------- CLI
def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    sub = parser.add_subparsers(dest="what", required=True)
    sub.add_parser("mirror", help="the Debian mirror for debootstrap").add_argument(
        "--release", default=DEFAULT_RELEASE
    )
    sub.add_parser("index", help="the Python package index for pip download")
    args = parser.parse_args(argv)
    try:
        choice = (
            mirror(os.environ, args.release) if args.what == "mirror" else index(os.environ, sys.executable)
        )
    except ConfigError as exc:
        print(f"{args.what}: {exc}", file=sys.stderr)
        return 1
    if any(c.isspace() for c in choice.url) or not choice.url:
        print(f"{args.what}: {choice.origin} gives {choice.url!r}, not one URL", file=sys.stderr)
        return 1
    print(choice.url, choice.origin)
    return 0


if __name__ == "__main__":
    sys.exit(main())
