#!/usr/bin/env python3
"""hipcc TEST DOUBLE (mift test rig) - NOT AMD SOFTWARE: the C++ header lookup of hipcc in ROCm 7.0.x.

hipcc of ROCm 7.0.x drives clang, and clang compiles C++ against the libstdc++ headers of the newest GCC
installed under ``GCC_ROOT`` (the highest version directory holding ``crtbegin.o``):
``INCLUDE_ROOT/c++/<version>`` and ``INCLUDE_ROOT/<triple>/c++/<version>``. When that GCC's libstdc++
headers are not installed (Ubuntu 22.04: GCC 12 present without ``libstdc++-12-dev``), ``#include <cmath>``
fails with ``'cmath' file not found`` (AMD's verified issue, fixed in ROCm 7.1.0;
/work/shared/reference/rocm7-audit.md, "Second pass").

The test hosts have no ROCm compiler. This double compiles for real with the host's ``g++``, restricted to
those same header directories (``-nostdinc++``), and prints a missing header in clang's words, so that a
caller sees what hipcc would print for the host's state: it passes where the headers are installed and fails
where they are not. It compiles host C++ only (no HIP, no ``--offload-arch``).

Installed by molecule ``gpu_negative`` as ``/opt/rocm/bin/hipcc`` for one case and removed after it.
Overridable for tests: ``MIFT_HIPCC_DOUBLE_GCC_ROOT``, ``MIFT_HIPCC_DOUBLE_INCLUDE_ROOT``,
``MIFT_HIPCC_DOUBLE_CXX``. Standard library only (the test hosts' python3).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

TRIPLE = "x86_64-linux-gnu"
GCC_ROOT = Path(os.environ.get("MIFT_HIPCC_DOUBLE_GCC_ROOT", f"/usr/lib/gcc/{TRIPLE}"))
INCLUDE_ROOT = Path(os.environ.get("MIFT_HIPCC_DOUBLE_INCLUDE_ROOT", "/usr/include"))
CXX = os.environ.get("MIFT_HIPCC_DOUBLE_CXX", "g++")
_GCC_MISSING = re.compile(r"fatal error: (\S+): No such file or directory")


def _version_key(name: str) -> tuple[int, ...]:
    return tuple(int(n) for n in re.findall(r"\d+", name))


def newest_gcc(root: Path = GCC_ROOT) -> str | None:
    """The newest GCC installation as clang picks it: the highest version directory with ``crtbegin.o``."""
    if not root.is_dir():
        return None
    found = [
        d.name for d in root.iterdir() if re.fullmatch(r"\d+(\.\d+)*", d.name) and (d / "crtbegin.o").exists()
    ]
    return max(found, key=_version_key) if found else None


def as_clang(stderr: str) -> str:
    """GCC's missing-header error in clang's words (``'cmath' file not found``)."""
    return _GCC_MISSING.sub(lambda m: f"fatal error: '{m.group(1)}' file not found", stderr)


def command(args: list[str], gcc: str | None) -> list[str]:
    """The real compile: ``g++`` with only the newest GCC's libstdc++ headers."""
    includes: list[str] = []
    if gcc is not None:
        includes = ["-isystem", str(INCLUDE_ROOT / "c++" / gcc)]
        includes += ["-isystem", str(INCLUDE_ROOT / TRIPLE / "c++" / gcc)]
    return [CXX, "-nostdinc++", *includes, *args]


def main(argv: list[str] | None = None) -> int:
    """Compile like hipcc would on this host; print a missing header as clang does."""
    args = sys.argv[1:] if argv is None else argv
    proc = subprocess.run(command(args, newest_gcc()), capture_output=True, text=True, check=False)
    sys.stdout.write(proc.stdout)
    sys.stderr.write(as_clang(proc.stderr))
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main())
