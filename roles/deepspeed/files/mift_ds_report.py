"""Run DeepSpeed's ``ds_report`` and print its op table and versions as JSON (deepspeed role probe).

Usage: <venv>/bin/python mift_ds_report.py <venv>/bin/ds_report
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from typing import Any

ANSI = re.compile(r"\x1b\[[0-9;]*m")
OP_LINE = re.compile(r"^(\S+)\s+\.*\s*\[(YES|NO)\]\s+\.+\s+\[(OKAY|NO)\]\s*$")
INFO_LINE = re.compile(r"^(torch version|deepspeed info|torch hip version|torch cuda version)\s+\.+\s+(.*)$")


def parse(raw: str) -> dict[str, Any]:
    """Parse ds_report's output (with its colour codes) into the op table and the version lines."""
    text = ANSI.sub("", raw)
    ops: dict[str, dict[str, bool]] = {}
    info: dict[str, str] = {}
    for line in text.splitlines():
        if match := OP_LINE.match(line.strip()):
            ops[match[1]] = {"installed": match[2] == "YES", "compatible": match[3] == "OKAY"}
        elif match := INFO_LINE.match(line.strip()):
            info[match[1]] = match[2].strip()
    return {"ops": ops, "info": info, "tail": text[-2000:]}


def main() -> int:
    """Run ds_report, parse it, print JSON; return ds_report's exit status."""
    proc = subprocess.run([sys.argv[1]], capture_output=True, text=True, check=False)
    print(json.dumps({"rc": proc.returncode, **parse(proc.stdout + proc.stderr)}))
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main())
