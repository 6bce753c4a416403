"""Where a suite's CPU goes, case by case (mift_testsupport/case_cpu.py; the costliest in CI's table)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

from mift_testsupport.case_cpu import controller_cpu_s, hosts_cpu_s

REPO = Path(__file__).resolve().parents[2]


def test_the_hosts_count_is_the_sum_of_the_named_rigs_cgroups(tmp_path: Path) -> None:
    root = tmp_path / "cpuacct" / "mift-cpu"
    for rig, ns in (("5", 2_500_000_000), ("6", 1_000_000_000), ("7", 9_000_000_000)):
        (root / f"rig{rig}").mkdir(parents=True)
        (root / f"rig{rig}" / "cpuacct.usage").write_text(f"{ns}\n")
    assert hosts_cpu_s(["5", "6"], root) == 3.5  # rig 7 is the other lane's
    assert hosts_cpu_s(["5", "9"], root) == 2.5  # rig 9 never up in this run: nothing used
    assert hosts_cpu_s([], root) is None  # no rig named: not counted, never a 0 that reads as "cheap"
    assert hosts_cpu_s(["5"], tmp_path / "no-cgroup-v1" / "mift-cpu") is None


def test_the_controller_count_grows_with_the_work_done() -> None:
    before = controller_cpu_s()
    sum(i * i for i in range(2_000_000))
    assert controller_cpu_s() - before > 0.01


def test_the_summary_lists_the_costliest_cases_first(tmp_path: Path) -> None:
    (tmp_path / "test_two.py").write_text(
        textwrap.dedent(
            """
            def test_cheap():
                pass

            def test_busy():
                sum(i * i for i in range(3_000_000))
            """
        )
    )
    env = {**os.environ, "MIFT_CPU_TOP": "2", "MIFT_CPU_RIGS": "", "PYTEST_ADDOPTS": ""}
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "mift_testsupport.case_cpu", str(tmp_path)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    lines = out.stdout.splitlines()
    at = next(i for i, line in enumerate(lines) if "most CPU, by case (top 2)" in line)
    first, second = lines[at + 1], lines[at + 2]
    assert first.endswith("test_two.py::test_busy") and "(hosts not counted)" in first, first
    assert second.endswith("test_two.py::test_cheap"), second
    assert float(first.split()[1]) > float(second.split()[1])
