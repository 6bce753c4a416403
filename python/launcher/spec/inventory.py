"""Check a job's inventory and hosts on the controller, before anything reaches a node.

Ansible ignores a host pattern element that matches nothing (a warning, then the play runs on the rest), and a
YAML inventory it cannot parse becomes an empty inventory. Both are bad input here: the inventory file or the
missing host is named and nothing starts.
"""

from __future__ import annotations

import configparser
import functools
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from launcher.exceptions import ConfigurationError
from launcher.spec.config_io import load_yaml_text
from launcher.spec.repo import ANSIBLE_CFG, ANSIBLE_HOME, CHECKOUT

if TYPE_CHECKING:
    from launcher.spec.jobspec import JobSpec

# a pattern element that is a plain host or group name (not a wildcard, range, regex or exclusion)
PLAIN_NAME_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$")

INVENTORY_NOT_FOUND = "inventory not found"  # the one wording, wherever an inventory named is missing


def inventory_not_found(inventory: Path | str) -> ConfigurationError:
    """The error for an inventory that was named but is not there."""
    return ConfigurationError(f"{inventory}: {INVENTORY_NOT_FOUND}")


def existing_inventory(inventory: Path | None) -> Path | None:
    """The ``-i`` inventory resolved (None: the default); bad input (named, not there) raises at the file."""
    inv = inventory.resolve() if inventory else None
    if inv is not None and not inv.exists():
        raise ConfigurationError.at(inventory or inv, "(file)", INVENTORY_NOT_FOUND, "file")
    return inv


def default_inventory() -> Path | None:
    """Return the inventory ``ansible.cfg`` names (relative to the checkout), or None (an installed launcher
    has no default inventory)."""
    if CHECKOUT is None:
        return None
    parser = configparser.ConfigParser(interpolation=None)
    parser.read(ANSIBLE_CFG)
    value = parser.get("defaults", "inventory", fallback="").split(",")[0].strip()
    if not value:
        return None
    path = Path(value)
    return path if path.is_absolute() else CHECKOUT / path


def _ansible_inventory() -> str:
    candidate = Path(sys.executable).parent / "ansible-inventory"
    return str(candidate) if candidate.exists() else "ansible-inventory"


@functools.lru_cache(maxsize=8)
def inventory_list(inventory: Path) -> dict[str, Any]:
    """Return ``ansible-inventory --list`` of ``inventory`` (once per process); a file Ansible cannot parse
    raises ConfigurationError."""
    if inventory.is_file() and inventory.suffix in (".yml", ".yaml"):
        try:
            text = inventory.read_text()
        except OSError as err:
            raise ConfigurationError(f"{inventory}: (file): cannot read inventory: {err.strerror}") from None
        load_yaml_text(text, inventory)  # one line naming the file and the line on a syntax error
    env = {
        **os.environ,
        "ANSIBLE_CONFIG": str(ANSIBLE_CFG),
        "ANSIBLE_HOME": str(ANSIBLE_HOME),
        "ANSIBLE_LOCAL_TEMP": str(ANSIBLE_HOME / "tmp"),
        "ANSIBLE_INVENTORY_UNPARSED_FAILED": "true",
        "ANSIBLE_NOCOLOR": "1",
    }
    try:
        out = subprocess.run(
            [_ansible_inventory(), "-i", str(inventory), "--list"],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
            stdin=subprocess.DEVNULL,
            cwd=CHECKOUT,
        )
    except (OSError, subprocess.TimeoutExpired) as err:
        raise ConfigurationError(f"{inventory}: (file): cannot read inventory: {err}") from None
    try:
        data = json.loads(out.stdout) if out.returncode == 0 else None
    except ValueError:
        data = None
    if not isinstance(data, dict):
        lines = [ln.strip() for ln in out.stderr.splitlines() if ln.strip()]
        why = next((ln for ln in lines if "ERROR" in ln), lines[-1] if lines else f"rc={out.returncode}")
        raise ConfigurationError(f"{inventory}: (file): not a usable inventory: {why}")
    return data


def group_members(data: dict[str, Any]) -> dict[str, list[str]]:
    """Return group -> its hosts (direct and through child groups, inventory order) of an inventory list."""

    def members(group: str, seen: frozenset[str]) -> list[str]:
        entry = data.get(group)
        if not isinstance(entry, dict) or group in seen:
            return []
        found = list(entry.get("hosts") or [])
        for child in entry.get("children") or []:
            found += [h for h in members(child, seen | {group}) if h not in found]
        return found

    return {g: members(g, frozenset()) for g in data if g != "_meta"}


def inventory_var(data: dict[str, Any], name: str) -> object:
    """Return variable ``name`` as the inventory's hosts have it (the first host that has it), or None."""
    for hostvars in ((data.get("_meta") or {}).get("hostvars") or {}).values():
        if isinstance(hostvars, dict) and name in hostvars:
            return hostvars[name]
    return None


def inventory_names(inventory: Path) -> tuple[set[str], set[str]]:
    """Return (hosts, groups) of ``inventory``; a file Ansible cannot parse raises ConfigurationError."""
    data = inventory_list(inventory)
    groups = {g for g in data if g != "_meta"}
    hosts = set((data.get("_meta") or {}).get("hostvars") or {})
    for group in groups:
        members = data[group].get("hosts") if isinstance(data[group], dict) else None
        hosts.update(members or [])
    return hosts, groups


def first_host(spec: JobSpec, inventory: Path | None) -> str:
    """Return the job's first node: the first of its host list, else the first host of its first group."""
    if isinstance(spec.hosts, list):
        return spec.hosts[0]
    inv = inventory or default_inventory()
    data = inventory_list(inv) if inv is not None else {}
    for name in (p.strip() for p in spec.hosts.split(",") if p.strip()):
        found = _first_in_group(data, name, set())
        if found:
            return found
        if name in ((data.get("_meta") or {}).get("hostvars") or {}):
            return name
    raise ConfigurationError(f"hosts: {spec.hosts}: no host found in the inventory {inv}")


def _first_in_group(data: dict[str, Any], group: str, seen: set[str]) -> str | None:
    entry = data.get(group)
    if group in seen or not isinstance(entry, dict):
        return None
    seen.add(group)
    hosts = entry.get("hosts") or []
    if hosts:
        return str(hosts[0])
    for child in entry.get("children") or []:
        found = _first_in_group(data, str(child), seen)
        if found:
            return found
    return None


def check_hosts(spec: JobSpec, inventory: Path | None, source: Path) -> None:
    """Raise ConfigurationError when a host or group the job names is not in the inventory."""
    inv = inventory or default_inventory()
    if inv is None:
        if CHECKOUT is None:
            raise ConfigurationError(
                f"{source}: no inventory: name one with -i (an installed launcher has no default)"
            )
        return
    if not inv.exists():
        raise inventory_not_found(inv)
    hosts, groups = inventory_names(inv)
    if isinstance(spec.hosts, list):
        wanted = list(spec.hosts)
        kind = "host"
    else:
        wanted = [p.strip() for p in spec.hosts.split(",") if p.strip()]
        kind = "host or group"
    for name in wanted:
        if isinstance(spec.hosts, str) and not PLAIN_NAME_RE.match(name):
            continue  # a pattern (wildcard, exclusion, ...): preflight says when it matches nothing
        if name not in hosts and name not in groups:
            raise ConfigurationError(f"{source}: hosts: {name}: no such {kind} in the inventory {inv}")
    spares = spec.recovery.spares
    for name in (p.strip() for p in (spares or "").split(",") if p.strip()):
        if PLAIN_NAME_RE.match(name) and name not in hosts and name not in groups:
            raise ConfigurationError(
                f"{source}: recovery.spares: {name}: no such host or group in the inventory {inv}"
            )


def spare_hosts(spec: JobSpec, inventory: Path | None) -> list[str]:
    """Return the hosts of the job's ``recovery.spares`` (groups expanded, inventory order; none: [])."""
    if not spec.recovery.spares:
        return []
    inv = inventory or default_inventory()
    data = inventory_list(inv) if inv is not None else {}
    members = group_members(data)
    found: list[str] = []
    for name in (p.strip() for p in spec.recovery.spares.split(",") if p.strip()):
        for host in members.get(name, [name]):
            if host not in found:
                found.append(host)
    return found
