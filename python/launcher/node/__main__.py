"""``python3 mift_node.pyz PROGRAM ARGS...``: run one node program with the command line it has always had.

PROGRAM is one of :data:`PROGRAMS`; ARGS go to that program's ``main`` unchanged (``agent status RUN_DIR`` is
what ``mift_agent.py status RUN_DIR`` was before the programs became one file). Standard library only.
"""

from __future__ import annotations

import importlib
import sys

# program name -> its module in this package (each has ``main(argv) -> int``)
PROGRAMS = {
    "agent": "agent",
    "allreduce": "allreduce",
    "gpu-allreduce": "gpu_allreduce",
    "gpu-check": "gpu_check",
    "install": "install",
    "lease": "lease",
    "prepare": "prepare",
    "probe": "probe",
    "stage": "stage",
}


def main(argv: list[str] | None = None) -> int:
    """Run PROGRAM (the first argument) with the rest of the arguments; its exit status is ours."""
    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] not in PROGRAMS:
        given = repr(args[0]) if args else "nothing"
        print(f"mift_node: program {given} is not one of {', '.join(PROGRAMS)}", file=sys.stderr)
        return 2
    package = __spec__.parent if __spec__ is not None else "mift_node"
    module = importlib.import_module(f"{package}.{PROGRAMS[args[0]]}")
    return int(module.main(args[1:]) or 0)


if __name__ == "__main__":
    sys.exit(main())
