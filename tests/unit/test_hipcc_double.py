"""The hipcc TEST DOUBLE (python/mift_testsupport/hipcc_double.py) that molecule gpu_negative puts on a host.

It must fail for the real cause only: the libstdc++ headers of the newest GCC missing. With them it compiles.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from mift_testsupport import hipcc_double

DOUBLE = Path(hipcc_double.__file__)
SOURCE = "#include <cmath>\nint main() { return static_cast<int>(std::sqrt(1.0)) - 1; }\n"
REAL_GCC = hipcc_double.newest_gcc()

needs_gxx = pytest.mark.skipif(
    shutil.which("g++") is None or REAL_GCC is None, reason="needs the machine's g++ and libstdc++ headers"
)


def gcc_root(tmp_path: Path, *versions: str) -> Path:
    """A GCC installation directory per version, as clang recognises one (crtbegin.o)."""
    root = tmp_path / "gcc"
    for version in versions:
        (root / version).mkdir(parents=True)
        (root / version / "crtbegin.o").write_bytes(b"")
    return root


def compile_with_double(tmp_path: Path, gcc: Path, include: Path) -> subprocess.CompletedProcess[str]:
    source = tmp_path / "x.cpp"
    source.write_text(SOURCE, encoding="utf-8")
    env = dict(os.environ, MIFT_HIPCC_DOUBLE_GCC_ROOT=str(gcc), MIFT_HIPCC_DOUBLE_INCLUDE_ROOT=str(include))
    return subprocess.run(
        [sys.executable, str(DOUBLE), "-c", str(source), "-o", str(tmp_path / "x.o")],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )


def test_clang_picks_the_newest_gcc_installation(tmp_path: Path) -> None:
    root = gcc_root(tmp_path, "9", "12", "11")
    (root / "13").mkdir()  # no crtbegin.o: not an installation
    assert hipcc_double.newest_gcc(root) == "12"
    assert hipcc_double.newest_gcc(tmp_path / "none") is None


def test_a_missing_header_is_reported_in_clangs_words() -> None:
    gcc = "/tmp/x.cpp:1:10: fatal error: cmath: No such file or directory\ncompilation terminated.\n"
    clang = "/tmp/x.cpp:1:10: fatal error: 'cmath' file not found\ncompilation terminated.\n"
    assert hipcc_double.as_clang(gcc) == clang


@needs_gxx
def test_without_the_newest_gccs_libstdcxx_headers_cmath_is_not_found(tmp_path: Path) -> None:
    # The jammy state: the newest GCC is installed, its libstdc++ headers are not.
    proc = compile_with_double(tmp_path, gcc_root(tmp_path, str(REAL_GCC)), tmp_path / "include")
    assert proc.returncode != 0
    assert "fatal error: 'cmath' file not found" in proc.stderr


@needs_gxx
def test_with_the_headers_it_compiles(tmp_path: Path) -> None:
    proc = compile_with_double(tmp_path, gcc_root(tmp_path, str(REAL_GCC)), Path("/usr/include"))
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "x.o").stat().st_size > 0
