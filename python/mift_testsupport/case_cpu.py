"""Where a suite's CPU goes, case by case (a pytest plugin, loaded by tests/conftest.py).

For each test, the CPU seconds it used from its setup to its teardown (a module fixture's setup counts to the
first test that needs it):

* the controller's: this pytest process and the children it reaped (the launcher, ansible-playbook, molecule),
  from :func:`os.times`;
* the test hosts': the cgroup v1 ``cpuacct`` count of each rig named in ``MIFT_CPU_RIGS`` (space-separated rig
  ids; ``.ci/run`` sets its lane's), which ``tools/testhosts/rig`` keeps for every process a rig's hosts run.
  Without that variable, or without cgroup v1 ``cpuacct`` on this machine, the hosts are not counted and the
  summary says so.

With ``MIFT_CPU_TOP=N`` in the environment (``.ci/run`` exports 3; an environment variable, not an option, so
that no other pytest run that inherits it can fail on it) the terminal summary ends with the N cases that used
the most, one line each: ``cpu 123.4 s (hosts 101.2) tests/x.py::test_y``; ``.ci/run`` puts them in the
stage table next to the slowest cases.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from collections.abc import Generator

CPU_CG_ROOT = Path("/sys/fs/cgroup/cpuacct/mift-cpu")  # tools/testhosts/lib.sh: CPU_CG_ROOT
HEADER = "most CPU, by case"


def controller_cpu_s() -> float:
    """Return this process's and its reaped children's CPU seconds (user + system)."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def hosts_cpu_s(rig_ids: list[str], root: Path = CPU_CG_ROOT) -> float | None:
    """Return the CPU seconds the hosts of ``rig_ids`` used since their count began (a rig never up counts
    0), or None when there is nothing to count with (no rig named, or no cgroup v1 ``cpuacct`` here)."""
    if not rig_ids or not root.parent.is_dir():
        return None
    total = 0.0
    for rig in rig_ids:
        usage = root / f"rig{rig}" / "cpuacct.usage"
        try:
            total += int(usage.read_text().split()[0]) / 1e9
        except (OSError, ValueError, IndexError):
            continue  # not up yet in this run: nothing used
    return total


class CaseCpu:
    """Collects each case's CPU seconds and reports the largest."""

    def __init__(self, top: int, rig_ids: list[str]) -> None:
        self.top = top
        self.rig_ids = rig_ids
        self.cases: list[tuple[float, float | None, str]] = []  # (all, hosts, nodeid)

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item: pytest.Item) -> Generator[None, None, None]:
        own0, hosts0 = controller_cpu_s(), hosts_cpu_s(self.rig_ids)
        yield
        own, hosts = controller_cpu_s() - own0, hosts_cpu_s(self.rig_ids)
        used = None if hosts is None or hosts0 is None else hosts - hosts0
        self.cases.append((own + (used or 0.0), used, item.nodeid))

    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        if not self.cases or self.top <= 0:
            return
        terminalreporter.write_sep("=", f"{HEADER} (top {self.top})")
        for total, hosts, nodeid in sorted(self.cases, reverse=True)[: self.top]:
            where = f"hosts {hosts:.1f}" if hosts is not None else "hosts not counted"
            terminalreporter.write_line(f"cpu {total:.1f} s ({where}) {nodeid}")


def pytest_configure(config: pytest.Config) -> None:
    top = os.environ.get("MIFT_CPU_TOP", "")
    if top.isdigit() and int(top) > 0:
        rigs = os.environ.get("MIFT_CPU_RIGS", "").split()
        config.pluginmanager.register(CaseCpu(int(top), rigs), "mift-case-cpu")
