#!/usr/bin/env python3
"""Ask a node's trainer interpreter what its torch was built for (CUDA or ROCm) and which GPUs it sees.

Standard library only: preflight feeds this file to the system ``python3 -`` on stdin with the node venv as
the argument. It finds the interpreter that runs the trainer (``VENV/bin/python3``, else the shebang of
``VENV/bin/llamafactory-cli``, which is what a ``pip install --target`` folder has) and prints one JSON
object: ``{"python", "torch", "cuda", "hip", "device_count", "devices": [{"name", "total_memory", "arch"}]}``,
or ``{"error": ...}`` when torch cannot be imported there. Never fails: preflight decides what that means.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

TORCH_SNIPPET = """
import json, torch
n = torch.cuda.device_count() if torch.cuda.is_available() else 0
props = [torch.cuda.get_device_properties(i) for i in range(n)]
print(json.dumps({
    "torch": torch.__version__,
    "cuda": torch.version.cuda,
    "hip": getattr(torch.version, "hip", None),
    "device_count": n,
    "devices": [
        {"name": p.name, "total_memory": int(p.total_memory), "arch": getattr(p, "gcnArchName", None)}
        for p in props
    ],
}))
"""


def shebang_python(script: Path) -> str | None:
    """Return the interpreter named by a script's ``#!`` line (``/usr/bin/env NAME`` resolved on PATH)."""
    try:
        first = script.read_bytes()[:1024].split(b"\n", 1)[0].decode()
    except (OSError, UnicodeDecodeError):
        return None
    words = first[2:].split() if first.startswith("#!") else []
    if not words:
        return None
    if Path(words[0]).name == "env" and len(words) > 1:
        return shutil.which(words[-1])
    return words[0]


def venv_python(venv: Path) -> str | None:
    """Return the trainer's interpreter: ``bin/python3`` or ``bin/python``, else the CLI's shebang."""
    for name in ("python3", "python"):
        candidate = venv / "bin" / name
        if os.access(candidate, os.X_OK):
            return str(candidate)
    return shebang_python(venv / "bin" / "llamafactory-cli")


def probe(venv: Path, timeout: float = 120.0) -> dict[str, Any]:
    """Return what torch reports in the trainer's interpreter, or ``{"error": ...}``."""
    python = venv_python(venv)
    if python is None:
        return {"error": f"no python3 in {venv}/bin and no llamafactory-cli shebang"}
    try:
        proc = subprocess.run(
            [python, "-c", TORCH_SNIPPET], capture_output=True, text=True, timeout=timeout, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as err:
        return {"python": python, "error": str(err)[:300]}
    lines = proc.stdout.strip().splitlines()
    if proc.returncode or not lines:
        err_lines = proc.stderr.strip().splitlines() or [f"exit status {proc.returncode}"]
        return {"python": python, "error": err_lines[-1][:300]}
    try:
        data = json.loads(lines[-1])
    except ValueError:
        return {"python": python, "error": f"unreadable output: {lines[-1][:200]}"}
    if not isinstance(data, dict):
        return {"python": python, "error": "output is not a JSON object"}
    return {**data, "python": python}


def main(argv: list[str] | None = None) -> int:
    """Print the probe of the venv given as the only argument."""
    args = sys.argv[1:] if argv is None else argv
    venv = Path(args[0]) if args else Path("/opt/mift/venv")
    print(json.dumps(probe(venv)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
