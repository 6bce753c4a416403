"""The builder's compile check (roles/wheel_cache/files/mift_compile_check.py), before any long build."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
CHECK = REPO / "roles" / "wheel_cache" / "files" / "mift_compile_check.py"
# What clang-based hipcc prints for the known issue ("'cmath' file not found", ROCm 7.0.x on Ubuntu 22.04);
# the line is in clang's format, the path and line number are made up for the stand-in.
HIPCC_CMATH = (
    "In file included from /tmp/x/mift_compile_check.cpp:1:\n"
    "/opt/rocm/lib/llvm/include/hip_wrappers/cmath:1:10: fatal error: 'cmath' file not found\n"
    "1 error generated.\n"
)


def stand_in(tmp_path: Path, name: str, stderr: str, rc: int) -> Path:
    """A TEST DOUBLE compiler: prints ``stderr`` and exits ``rc``."""
    path = tmp_path / name
    path.write_text(f"#!/bin/sh\n# TEST DOUBLE compiler\ncat >&2 <<'EOF'\n{stderr}EOF\nexit {rc}\n")
    path.chmod(0o755)
    return path


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(CHECK), "--host", "host1", *args], capture_output=True, text=True, check=False
    )


def test_hipcc_without_the_libstdcxx_headers_fails_in_one_line_with_the_fix(tmp_path: Path) -> None:
    hipcc = stand_in(tmp_path, "hipcc_TEST_DOUBLE", HIPCC_CMATH, 1)
    proc = run(str(hipcc), "c++")
    assert proc.returncode == 1
    assert proc.stdout == (
        f"error: host1: compile check: {hipcc} cannot compile a 3-line C++ file before the build: "
        "'cmath' file not found (fix: install the libstdc++ headers of the newest installed GCC "
        "(Ubuntu 22.04: libstdc++-12-dev; AMD's known issue of hipcc in ROCm 7.0.x, fixed in 7.1.0: or "
        "set rocm_version 7.1 or newer))\n"
    )
    print(proc.stdout, end="")


def test_an_unknown_error_gets_the_generic_fix(tmp_path: Path) -> None:
    broken = stand_in(tmp_path, "cc_TEST_DOUBLE", "cc1plus: error: bad value for -march\n", 1)
    proc = run(str(broken))
    assert proc.stdout.endswith(
        "bad value for -march (fix: install build-essential and check the compiler on the builder)\n"
    )


def test_missing_compilers_are_skipped_and_none_at_all_is_an_error(tmp_path: Path) -> None:
    proc = run(str(tmp_path / "no-hipcc"), str(tmp_path / "no-cxx"))
    assert proc.returncode == 2
    assert proc.stdout.startswith("error: host1: compile check: none of ")


@pytest.mark.skipif(shutil.which("c++") is None, reason="no C++ compiler on this machine")
def test_the_system_compiler_passes(tmp_path: Path) -> None:
    proc = run(str(tmp_path / "no-hipcc"), "c++")
    assert proc.returncode == 0
    assert proc.stdout == "host1: compile check passed: c++\n"
