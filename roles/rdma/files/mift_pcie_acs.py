#!/usr/bin/python3
"""Disable PCIe ACS on every PCI bridge where it is enabled (rdma role; run at boot by mift-pcie-acs.service).

AMD's multi-node RCCL guidance (docs/rocm.md, "rdma role"): ACS redirects peer-to-peer traffic between a GPU
and an RDMA NIC through the root complex; check ``lspci -vvv | grep -i acsctl`` for ``SrcValid+`` and clear
it with ``setpci -s <bdf> ECAP_ACS+0x6.w=0000`` on each bridge, again after every reboot.

    mift_pcie_acs.py            # clear ACS on each bridge whose ACSCtl shows SrcValid+, one line per bridge
    mift_pcie_acs.py --dry-run  # say which bridges it would change, change nothing

It prints one line per bridge changed (or that would be changed) and one ``none:`` line when there was none.
Exit 0 when every bridge was cleared (or none needed it); 1, with one ``error:`` line on stderr, when lspci or
setpci is missing, lspci could not read the capabilities (not root), or a bridge still reads non-zero after
the write. Standard library only: it runs with the node's system python3.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Callable

PROG = "mift-pcie-acs"
# lspci -D: full domain:bus:device.function; -nn: class and ids as numbers too ("PCI bridge [0604]"; without
# the pci.ids names, lspci prints "Class [0604]"), so the class never depends on the names file.
LSPCI_ARGS = ("-D", "-nn", "-vvv")
ACS_CONTROL = "ECAP_ACS+0x6.w"  # ACS Control register: capability offset 6, 16 bits
BRIDGE_CLASS = "0604"  # PCI-to-PCI bridge: root ports and switch ports

# a device's first line: [domain:]bus:device.function, then its class (lspci -D always prints the domain)
_HEADER = re.compile(r"^(?P<bdf>(?:[0-9a-fA-F]{4}:)?[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]) ")
_CLASS = re.compile(r"^[^:]*?\[(?P<code>[0-9a-fA-F]{4})\]:")
_ACSCTL = re.compile(r"^\s+ACSCtl:\s*(?P<flags>.*)$")
_DENIED = re.compile(r"^\s+Capabilities: <access denied>")


@dataclass(frozen=True)
class Bridge:
    """A PCI bridge whose ACS Control shows Source Validation on."""

    bdf: str
    acsctl: str


class AcsError(Exception):
    """Something that stops the script; its text is the one line printed."""


def _is_bridge(header: str) -> bool:
    rest = header.split(" ", 1)[1] if " " in header else ""
    match = _CLASS.match(rest)
    if match:
        return match.group("code").lower() == BRIDGE_CLASS
    return rest.startswith("PCI bridge:")  # lspci without -nn


def acs_enabled_bridges(lspci_text: str) -> list[Bridge]:
    """Return the bridges of ``lspci -vvv`` output whose ACSCtl line shows ``SrcValid+``, in lspci's order.

    Raises AcsError when lspci could not read the capabilities of a bridge (run as a user other than root).
    """
    found: list[Bridge] = []
    denied: list[str] = []
    bdf: str | None = None
    bridge = False
    for line in lspci_text.splitlines():
        header = _HEADER.match(line)
        if header:
            bdf, bridge = header.group("bdf"), _is_bridge(line)
            continue
        if not bridge or bdf is None:
            continue
        if _DENIED.match(line):
            denied.append(bdf)
            continue
        acsctl = _ACSCTL.match(line)
        if acsctl and "SrcValid+" in acsctl.group("flags").split():
            found.append(Bridge(bdf, acsctl.group("flags").strip()))
    if denied:
        msg = f"lspci could not read the capabilities of {', '.join(denied)} (run as root)"
        raise AcsError(msg)
    return found


def bridge_count(lspci_text: str) -> int:
    """Number of PCI bridges in ``lspci -vvv`` output."""
    return sum(1 for line in lspci_text.splitlines() if _HEADER.match(line) and _is_bridge(line))


def _run(argv: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, check=False)


def _tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        msg = f"{name} not found (install pciutils)"
        raise AcsError(msg)
    return path


def _lspci() -> str:
    done = _run([_tool("lspci"), *LSPCI_ARGS])
    if done.returncode != 0:
        msg = f"lspci {' '.join(LSPCI_ARGS)} exited {done.returncode}: {done.stderr.strip()}"
        raise AcsError(msg)
    return done.stdout


def _disable(setpci: str, bridge: Bridge) -> None:
    done = _run([setpci, "-s", bridge.bdf, f"{ACS_CONTROL}=0000"])
    if done.returncode != 0:
        msg = f"{bridge.bdf}: setpci exited {done.returncode}: {done.stderr.strip()}"
        raise AcsError(msg)
    check = _run([setpci, "-s", bridge.bdf, ACS_CONTROL])
    value = check.stdout.strip()
    if check.returncode != 0 or value != "0000":
        msg = f"{bridge.bdf}: ACS Control reads {value or check.stderr.strip()!r} after writing 0000"
        raise AcsError(msg)


def run(*, dry_run: bool, emit: Callable[[str], None]) -> None:
    """Disable ACS where it is enabled (or only say where, with dry_run); one line per bridge as it goes."""
    text = _lspci()
    bridges = acs_enabled_bridges(text)
    if not bridges:
        emit(f"{PROG}: none: no PCI bridge with ACS enabled (ACSCtl SrcValid+), {bridge_count(text)} bridges")
        return
    setpci = "" if dry_run else _tool("setpci")
    for bridge in bridges:
        if dry_run:
            emit(f"{PROG}: {bridge.bdf}: ACS would be disabled (ACSCtl: {bridge.acsctl})")
            continue
        _disable(setpci, bridge)
        emit(f"{PROG}: {bridge.bdf}: ACS disabled (ACSCtl was: {bridge.acsctl})")


def _print(line: str) -> None:
    print(line, flush=True)


def main(argv: list[str]) -> int:
    """Command line: [--dry-run]."""
    if argv not in ([], ["--dry-run"]):
        print(f"error: {PROG}: usage: mift_pcie_acs.py [--dry-run], got {' '.join(argv)}", file=sys.stderr)
        return 2
    try:
        run(dry_run=argv == ["--dry-run"], emit=_print)
    except AcsError as exc:
        print(f"error: {PROG}: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
