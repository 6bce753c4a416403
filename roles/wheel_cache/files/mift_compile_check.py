"""Compile a tiny C++ file with the builder's toolchain before any long build (shipped and run by Ansible).

A flash-attn or DeepSpeed build runs its hipify stage and much else before the first C++ file
compiles; a toolchain that cannot compile ``#include <cmath>`` then fails an hour in. This compiles
three lines with each compiler given that exists (``hipcc`` of ROCm and the system ``c++``) and prints
one line: passed, or the compiler, its first error and the fix. Known cause: hipcc of ROCm 7.0.x on
Ubuntu 22.04 looks for the libstdc++ headers of the newest installed GCC and fails with "'cmath' file
not found" unless they are installed (AMD's verified issue, fixed in ROCm 7.1.0; workaround
libstdc++-12-dev).

Usage: python mift_compile_check.py --host NAME COMPILER [COMPILER ...]   (exit 0 ok, 1 failed, 2 none found)
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

SOURCE = """#include <cmath>
#include <vector>
int main() { std::vector<double> v{2.0}; return static_cast<int>(std::sqrt(v[0])) - 1; }
"""
TIMEOUT_S = 300
_ERROR = re.compile(r"(?:fatal )?error:\s*(.+)")
FIXES = (
    (
        re.compile(r"'?(cmath|vector|cstdlib|type_traits)'? file not found|No such file or directory"),
        "install the libstdc++ headers of the newest installed GCC (Ubuntu 22.04: libstdc++-12-dev; "
        "AMD's known issue of hipcc in ROCm 7.0.x, fixed in 7.1.0: or set rocm_version 7.1 or newer)",
    ),
)
GENERIC_FIX = "install build-essential and check the compiler on the builder"


def first_error(output: str) -> str:
    """The first ``error:`` line of a compiler's output, else its last non-empty line."""
    for line in output.splitlines():
        match = _ERROR.search(line)
        if match:
            return match.group(1).strip()
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    return lines[-1] if lines else "no output"


def fix_for(error: str) -> str:
    """The fix for a known error, else the generic one."""
    for pattern, fix in FIXES:
        if pattern.search(error):
            return fix
    return GENERIC_FIX


def check(compiler: str, workdir: Path) -> str | None:
    """None when ``compiler`` compiles the tiny source, else its first error."""
    source = workdir / "mift_compile_check.cpp"
    source.write_text(SOURCE, encoding="utf-8")
    try:
        proc = subprocess.run(
            [compiler, "-c", str(source), "-o", str(workdir / "mift_compile_check.o")],
            capture_output=True,
            text=True,
            timeout=TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return str(exc)
    return None if proc.returncode == 0 else first_error(proc.stderr + "\n" + proc.stdout)


def main(argv: list[str] | None = None) -> int:
    """Check each compiler that exists; print one line for the first that fails."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--host", required=True, help="the builder's name, for the message")
    parser.add_argument("compilers", nargs="+", help="compiler paths or names; missing ones are skipped")
    args = parser.parse_args(argv)
    found = [c for c in args.compilers if shutil.which(c)]
    if not found:
        print(
            f"error: {args.host}: compile check: none of {', '.join(args.compilers)} found "
            f"(fix: {GENERIC_FIX})"
        )
        return 2
    with tempfile.TemporaryDirectory(prefix="mift-compile-check-") as tmp:
        for compiler in found:
            error = check(compiler, Path(tmp))
            if error is not None:
                print(
                    f"error: {args.host}: compile check: {compiler} cannot compile a 3-line C++ file "
                    f"before the build: {error} (fix: {fix_for(error)})"
                )
                return 1
    print(f"{args.host}: compile check passed: {', '.join(found)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
