"""Provisioning benchmark: playbooks/stack.yml (cpu backend) on 1, then 4 fresh test hosts, then a re-run.

Each phase starts fresh test hosts of rig instance 7. By default the controller wheel cache is the
repository's .cache/wheels/ (as in production): if it already holds the DeepSpeed key, no phase builds and
the numbers are the cost of installing everywhere; with --cold-cache every phase starts from an empty cache
and includes the one build on the builder. Prints the wall times, whether a build ran, the ratio
4-host / 1-host, and the time of a second, no-change run on the 4 hosts (with its changed count).
Needs root and the rig (tools/testhosts/rig setup).

    python bench/provision_scaling.py [--hosts 1 4] [--cold-cache] [--keep]
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RIG = REPO / "tools" / "testhosts" / "rig"
RIG_ID = "7"
ENV = {**os.environ, "RIG_ID": RIG_ID, "ANSIBLE_CONFIG": str(REPO / "ansible.cfg")}


def rig(*args: str) -> None:
    """Run the rig tool for instance 7."""
    subprocess.run([str(RIG), *args], check=True, env=ENV, stdout=subprocess.DEVNULL, timeout=600)


def provision(cache: Path, log: Path) -> tuple[float, int, int]:
    """Run playbooks/stack.yml on the instance's hosts; return (wall seconds, total changed, builds)."""
    inventory = REPO / ".rig" / RIG_ID / "inventory.yml"
    argv = [
        "ansible-playbook",
        "-i",
        str(inventory),
        str(REPO / "playbooks" / "stack.yml"),
        "-e",
        f'{{"pytorch_backend": "cpu", "wheel_cache_dir": "{cache}"}}',
    ]
    start = time.monotonic()
    with log.open("w") as out:
        proc = subprocess.run(argv, env=ENV, cwd=REPO, stdout=out, stderr=subprocess.STDOUT, check=False)
    wall = time.monotonic() - start
    if proc.returncode != 0:
        sys.exit(f"provisioning failed (rc={proc.returncode}); see {log}")
    text = log.read_text()
    changed = sum(int(n) for n in re.findall(r"changed=(\d+)", text))
    sections = text.split("TASK [")
    builds = sum(1 for s in sections if s.startswith("wheel_cache : Build the wheel") and "\nchanged:" in s)
    return wall, changed, builds


def main() -> int:
    """Run the phases and print the table."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--hosts", type=int, nargs=2, default=[1, 4], metavar=("SMALL", "LARGE"))
    parser.add_argument("--cold-cache", action="store_true", help="start every phase with an empty cache")
    parser.add_argument("--keep", action="store_true", help="leave the hosts of the last phase up")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="mift-bench-"))
    results: dict[str, tuple[float, int, int]] = {}
    small, large = args.hosts
    try:
        for count in (small, large):
            rig("down", "--purge")
            rig("up", str(count))
            cache = work / f"wheels-{count}" if args.cold_cache else REPO / ".cache" / "wheels"
            results[f"{count} host(s), fresh"] = provision(cache, work / f"run-{count}.log")
            print(f"{count} host(s) fresh: {results[f'{count} host(s), fresh'][0]:.1f} s", flush=True)
        results[f"{large} host(s), second run"] = provision(cache, work / "rerun.log")
    finally:
        if not args.keep:
            rig("down", "--purge")
    t_small = results[f"{small} host(s), fresh"][0]
    t_large = results[f"{large} host(s), fresh"][0]
    print()
    print(f"{'phase':<28}{'wall s':>10}{'changed':>10}{'builds':>8}")
    for phase, (wall, changed, builds) in results.items():
        print(f"{phase:<28}{wall:>10.1f}{changed:>10}{builds:>8}")
    print(f"ratio {large}-host / {small}-host: {t_large / t_small:.2f}  (logs: {work})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
