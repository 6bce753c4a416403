"""tools/testhosts/hostconfig.py: the rig's Debian mirror and Python index, read from the controller's config.

The sample hosts are documentation addresses (RFC 5737) and ``.invalid`` names (RFC 2606): nothing here is
contacted. The pip tests run the real pip of this interpreter against temporary configuration files and
compare with pip's own option parser.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
_SPEC = importlib.util.spec_from_file_location("hostconfig", REPO / "tools" / "testhosts" / "hostconfig.py")
assert _SPEC is not None and _SPEC.loader is not None
hostconfig = importlib.util.module_from_spec(_SPEC)
sys.modules["hostconfig"] = hostconfig
_SPEC.loader.exec_module(hostconfig)

# the shape of this machine's /etc/apt/sources.list.d/debian.sources (comment lines inside a stanza, a
# security stanza), with a disabled stanza, a multi-line field and several URIs added
DEB822 = """\
# managed by hand
Types: deb
URIs: http://192.0.2.10/debian
Suites: bookworm
Components: main
Enabled: no

Types: deb
# http://192.0.2.99/archive/debian-security/20250520T000000Z
URIs: http://mirror-a.invalid/debian-security
Suites: bookworm-security
Components: main

types: deb-src deb
# the first URI is not one debootstrap fetches, the third is never reached
uris: mirror+file:/etc/apt/mirrors.txt
 http://mirror-b.invalid/debian
 http://mirror-c.invalid/debian
suites: bookworm-updates
  bookworm
Components: main contrib
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
"""

ONE_LINE = """\
# deb http://192.0.2.20/debian bookworm main
deb-src http://192.0.2.21/debian bookworm main
deb http://mirror-s.invalid/debian-security bookworm-security main
deb [ arch=amd64 signed-by=/usr/share/keyrings/x.gpg ] http://mirror-o.invalid/debian bookworm main # why
deb [trusted=yes] http://mirror-p.invalid/debian bookworm main
"""


def _mirror(entries, release="bookworm"):
    found = hostconfig.debian_mirror(entries, release)
    return found.url if found else None


# --------------------------------------------------------------------------------------------- deb822
def test_deb822_stanzas_fields_and_line_numbers() -> None:
    entries = hostconfig.parse_deb822(DEB822, "d.sources")
    assert [(e.types, e.enabled, e.origin) for e in entries] == [
        (("deb",), False, "d.sources:2"),
        (("deb",), True, "d.sources:8"),
        (("deb-src", "deb"), True, "d.sources:14"),
    ]
    third = entries[2]
    assert third.uris == (
        "mirror+file:/etc/apt/mirrors.txt",
        "http://mirror-b.invalid/debian",
        "http://mirror-c.invalid/debian",
    )
    assert third.suites == ("bookworm-updates", "bookworm")


def test_deb822_mirror_skips_disabled_security_and_unfetchable_uris() -> None:
    entries = hostconfig.parse_deb822(DEB822, "d.sources")
    found = hostconfig.debian_mirror(entries, "bookworm")
    assert found == hostconfig.Choice("http://mirror-b.invalid/debian", "d.sources:14")


@pytest.mark.parametrize("word", ["no", "No", "false", "off", "disable", "without", "0"])
def test_deb822_enabled_false_words_of_apt(word: str) -> None:
    text = f"Types: deb\nURIs: http://192.0.2.1/debian\nSuites: bookworm\nEnabled: {word}\n"
    assert _mirror(hostconfig.parse_deb822(text, "x")) is None
    enabled = text.replace(f"Enabled: {word}", "Enabled: yes")
    assert _mirror(hostconfig.parse_deb822(enabled, "x")) == "http://192.0.2.1/debian"


def test_deb822_release_match_is_preferred_then_a_main_archive_suite() -> None:
    text = (
        "Types: deb\nURIs: http://trixie.invalid/debian\nSuites: trixie trixie-updates\n\n"
        "Types: deb\nURIs: http://backports.invalid/debian\nSuites: bookworm-backports\n\n"
        "Types: deb\nURIs: http://bookworm.invalid/debian\nSuites: bookworm\n"
    )
    entries = hostconfig.parse_deb822(text, "x")
    assert _mirror(entries, "bookworm") == "http://bookworm.invalid/debian"
    # no stanza for the release: the first main archive (a trixie controller's mirror also carries bookworm)
    assert _mirror(entries, "forky") == "http://trixie.invalid/debian"


@pytest.mark.parametrize(
    ("text", "where"),
    [
        ("Types: deb\nthis is not a field\n", "x:2"),
        ("  URIs: http://192.0.2.1/debian\n", "x:1"),
    ],
)
def test_deb822_bad_lines_name_file_and_line(text: str, where: str) -> None:
    with pytest.raises(hostconfig.ConfigError, match=f"^{where}: "):
        hostconfig.parse_deb822(text, "x")


# ------------------------------------------------------------------------------------------- one-line
def test_one_line_options_comments_and_deb_src() -> None:
    entries = hostconfig.parse_one_line(ONE_LINE, "sources.list")
    assert [(e.types, e.uris, e.suites, e.origin) for e in entries] == [
        (("deb-src",), ("http://192.0.2.21/debian",), ("bookworm",), "sources.list:2"),
        (("deb",), ("http://mirror-s.invalid/debian-security",), ("bookworm-security",), "sources.list:3"),
        (("deb",), ("http://mirror-o.invalid/debian",), ("bookworm",), "sources.list:4"),
        (("deb",), ("http://mirror-p.invalid/debian",), ("bookworm",), "sources.list:5"),
    ]
    assert hostconfig.debian_mirror(entries) == hostconfig.Choice(
        "http://mirror-o.invalid/debian", "sources.list:4"
    )


def test_one_line_old_style_security_suite_is_skipped() -> None:
    text = "deb http://192.0.2.5/debian-security bookworm/updates main\ndeb file:/srv/debian bookworm main\n"
    assert _mirror(hostconfig.parse_one_line(text, "x")) == "file:/srv/debian"


@pytest.mark.parametrize(
    "line", ["deb [arch=amd64 http://192.0.2.1/debian bookworm main", "deb http://192.0.2.1/debian"]
)
def test_one_line_bad_lines_name_file_and_line(line: str) -> None:
    with pytest.raises(hostconfig.ConfigError, match=r"^sources\.list:2: "):
        hostconfig.parse_one_line("# ok\n" + line + "\n", "sources.list")


# ------------------------------------------------------------------------------------ files and env
def _write_sources(root: Path) -> tuple[Path, Path]:
    sources_list = root / "sources.list"
    parts = root / "sources.list.d"
    parts.mkdir()
    sources_list.write_text("deb-src http://192.0.2.30/debian bookworm main\n")
    (parts / "b.sources").write_text("Types: deb\nURIs: http://from-b.invalid/debian\nSuites: bookworm\n")
    (parts / "a.list").write_text("deb http://from-a.invalid/debian bookworm main\n")
    (parts / "0.list.save").write_text("deb http://192.0.2.31/debian bookworm main\n")  # apt ignores it
    return sources_list, parts


def test_files_are_read_in_apts_order(tmp_path: Path) -> None:
    sources_list, parts = _write_sources(tmp_path)
    entries = hostconfig.read_apt_sources(sources_list, parts)
    assert [e.origin for e in entries] == [f"{sources_list}:1", f"{parts}/a.list:1", f"{parts}/b.sources:1"]
    sources_list.write_text("deb http://from-list.invalid/debian bookworm main\n")
    assert _mirror(hostconfig.read_apt_sources(sources_list, parts)) == "http://from-list.invalid/debian"


def test_mirror_reads_the_folders_the_rig_variables_name(tmp_path: Path) -> None:
    sources_list, parts = _write_sources(tmp_path)
    env = {"RIG_APT_SOURCES_LIST": str(sources_list), "RIG_APT_SOURCES_DIR": str(parts)}
    assert hostconfig.mirror(env) == hostconfig.Choice("http://from-a.invalid/debian", f"{parts}/a.list:1")
    assert hostconfig.mirror(env | {"RIG_MIRROR": "http://192.0.2.40/debian"}) == hostconfig.Choice(
        "http://192.0.2.40/debian", "RIG_MIRROR"
    )


def test_no_mirror_is_one_line_naming_the_files_and_the_override(tmp_path: Path) -> None:
    env = {"RIG_APT_SOURCES_LIST": str(tmp_path / "absent.list"), "RIG_APT_SOURCES_DIR": str(tmp_path)}
    (tmp_path / "x.sources").write_text(
        "Types: deb\nURIs: http://192.0.2.1/debian\nSuites: bookworm\nEnabled: no\n"
    )
    with pytest.raises(hostconfig.ConfigError) as err:
        hostconfig.mirror(env)
    message = str(err.value)
    assert "\n" not in message and str(tmp_path / "absent.list") in message and "RIG_MIRROR=" in message


def test_default_paths_are_apts_own(monkeypatch: pytest.MonkeyPatch) -> None:
    try:
        proc = subprocess.run(
            ["apt-config", "dump", "Dir::Etc"], capture_output=True, text=True, check=True, timeout=30
        )
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("apt-config not available here")
    sources_list, sources_dir = hostconfig.apt_source_paths({})
    # apt-config dump prints the relative names; the paths end with them
    dump = proc.stdout
    assert f'Dir::Etc::sourcelist "{sources_list.name}";' in dump, (sources_list, dump)
    assert f'Dir::Etc::sourceparts "{sources_dir.name}";' in dump, (sources_dir, dump)
    assert sources_list.is_absolute() and sources_dir.is_absolute()


def test_cli_prints_url_and_origin_or_one_error_line(tmp_path: Path) -> None:
    sources_list, parts = _write_sources(tmp_path)
    script = REPO / "tools" / "testhosts" / "hostconfig.py"
    env = {k: v for k, v in os.environ.items() if not k.startswith("RIG_")}
    env |= {"RIG_APT_SOURCES_LIST": str(sources_list), "RIG_APT_SOURCES_DIR": str(parts)}
    ok = subprocess.run(
        [sys.executable, script, "mirror"], env=env, capture_output=True, text=True, check=True
    )
    assert ok.stdout == f"http://from-a.invalid/debian {parts}/a.list:1\n"
    env["RIG_APT_SOURCES_DIR"] = str(tmp_path / "empty")
    bad = subprocess.run(
        [sys.executable, script, "mirror"], env=env, capture_output=True, text=True, check=False
    )
    assert bad.returncode == 1 and bad.stdout == ""
    assert bad.stderr.count("\n") == 1 and bad.stderr.startswith("mirror: no Debian mirror for bookworm"), (
        bad.stderr
    )


# ------------------------------------------------------------------------------------------------ pip
# this machine's `pip config list` (PIP_* variables and /etc/xdg/pip/pip.conf): extra indexes, no index-url
PIP_LIST = """\
:env:.cert='/etc/ssl/certs/ca-certificates.crt'
:env:.default-timeout='180'
:env:.disable-pip-version-check='1'
:env:.find-links='/opt/wheels'
global.cert='/etc/ssl/certs/ca-certificates.crt'
global.constraint='/etc/xdg/pip/constraints.txt'
global.extra-index-url='file:///opt/pypi/simple file:///opt/pypi-more/simple'
global.find-links='/opt/wheels'
"""


def test_pip_config_list_without_index_url_gives_pips_default() -> None:
    config = hostconfig.parse_pip_config_list(PIP_LIST)
    assert config["global.extra-index-url"] == "file:///opt/pypi/simple file:///opt/pypi-more/simple"
    assert hostconfig.pip_index(config, "http://default.invalid/simple") == hostconfig.Choice(
        "http://default.invalid/simple", "pip's default (no index-url configured)"
    )
    assert hostconfig.pip_extra_indexes(config) == ["file:///opt/pypi/simple", "file:///opt/pypi-more/simple"]
    # file: indexes have no host to reach
    assert hostconfig.network_endpoints(hostconfig.pip_extra_indexes(config)) == []


def test_pip_index_precedence_env_then_command_then_global() -> None:
    lines = [
        "global.index-url='http://global.invalid/simple'",
        "install.index-url='http://install.invalid/simple'",
        "download.index_url='http://download.invalid/simple'",
    ]
    config = hostconfig.parse_pip_config_list("\n".join(lines))
    assert hostconfig.pip_index(config, "d").url == "http://download.invalid/simple"
    assert hostconfig.pip_index(config, "d", command="install").url == "http://install.invalid/simple"
    env = hostconfig.parse_pip_config_list("\n".join([*lines, ":env:.index-url='http://env.invalid/simple'"]))
    assert hostconfig.pip_index(env, "d") == hostconfig.Choice(
        "http://env.invalid/simple", "pip config :env:.index-url"
    )
    empty = hostconfig.parse_pip_config_list(
        "global.index-url='http://global.invalid/simple'\n:env:.index-url=''"
    )
    assert hostconfig.pip_index(empty, "d").url == "http://global.invalid/simple"  # pip ignores empty values


@pytest.mark.parametrize("line", ["global.index-url=http://x.invalid/simple", "no-section='x'", "key"])
def test_pip_config_list_bad_line(line: str) -> None:
    with pytest.raises(hostconfig.ConfigError, match="pip config list, line 2: "):
        hostconfig.parse_pip_config_list("global.cert='/x'\n" + line)


_PIP_OWN_CHOICE = (
    "from pip._internal.commands import create_command; "
    "options, _ = create_command('download').parse_args([]); print(options.index_url)"
)


@pytest.mark.parametrize(
    ("conf", "env_index"),
    [
        ("", None),
        ("[global]\nindex-url = http://192.0.2.50/simple/\n", None),
        (
            "[global]\nindex-url = http://192.0.2.50/simple/\n[download]\nindex-url = http://192.0.2.51/simple/\n",
            None,
        ),
        ("[global]\nindex-url = http://192.0.2.50/simple/\n", "http://192.0.2.52/simple/"),
    ],
    ids=["default", "global", "download-section", "env"],
)
def test_index_agrees_with_pips_own_option_parser(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, conf: str, env_index: str | None
) -> None:
    for name in list(os.environ):
        if name.startswith("PIP_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)  # pip then reads no configuration file at all
    if conf:
        (tmp_path / "pip.conf").write_text(conf)
        monkeypatch.setenv("PIP_CONFIG_FILE", str(tmp_path / "pip.conf"))
    if env_index:
        monkeypatch.setenv("PIP_INDEX_URL", env_index)
    ours = hostconfig.index({}, sys.executable)
    pips = subprocess.run(
        [sys.executable, "-c", _PIP_OWN_CHOICE], capture_output=True, text=True, check=True, timeout=120
    ).stdout.strip()
    assert ours.url == pips
    if not conf:
        assert ours.origin.startswith("pip's default")
    assert hostconfig.index(
        {"RIG_INDEX_URL": "http://192.0.2.60/simple/"}, sys.executable
    ) == hostconfig.Choice("http://192.0.2.60/simple/", "RIG_INDEX_URL")


def test_network_endpoints() -> None:
    urls = [
        "http://mirror.invalid/debian",
        "https://index.invalid/simple/",
        "http://mirror.invalid/debian-security",
        "http://[2001:db8::1]:8080/simple",
        "file:///opt/pypi/simple",
    ]
    assert hostconfig.network_endpoints(urls) == [
        ("mirror.invalid", 80),
        ("index.invalid", 443),
        ("2001:db8::1", 8080),
    ]


def test_controller_urls_of_a_configuration(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    sources_list, parts = _write_sources(tmp_path)
    for name in list(os.environ):
        if name.startswith("PIP_"):
            monkeypatch.delenv(name)
    (tmp_path / "pip.conf").write_text(
        "[global]\nindex-url = https://index.invalid/simple/\nextra-index-url = http://192.0.2.70/x file:///srv/y\n"
    )
    monkeypatch.setenv("PIP_CONFIG_FILE", str(tmp_path / "pip.conf"))
    env = {"RIG_APT_SOURCES_LIST": str(sources_list), "RIG_APT_SOURCES_DIR": str(parts)}
    urls = hostconfig.controller_urls(env, sys.executable)
    assert urls == [
        "http://from-a.invalid/debian",
        "https://index.invalid/simple/",
        "http://192.0.2.70/x",
        "file:///srv/y",
    ]
    assert hostconfig.network_endpoints(urls) == [
        ("from-a.invalid", 80),
        ("index.invalid", 443),
        ("192.0.2.70", 80),
    ]
