"""Provisioning benchmark: playbooks/stack.yml (cpu backend) on 1, then 4 fresh test hosts, then a re-run.

Each phase starts fresh test hosts of rig instance 7 (``PROVISION_BENCH_RIG_ID``). By default the
controller wheel cache is the repository's .cache/wheels/ (as in production): if it already holds the
DeepSpeed key, no phase builds and the numbers are the cost of installing everywhere; with --cold-cache every
phase starts from an empty cache and includes the one build on the builder. Prints the wall times, whether a
build ran, the ratio 4-host / 1-host, and the time of a second, no-change run on the 4 hosts (with its
changed count).
Needs root and the rig (tools/testhosts/rig setup).

    python bench/provision_scaling.py [--hosts 1 4] [--cold-cache] [--keep]
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from mift_testsupport.paths import REPO_ROOT as REPO
from mift_testsupport.proc import ansible_bin
from mift_testsupport.rig import Rig, rig_id_from_env

RIG = Rig(rig_id=rig_id_from_env("PROVISION_BENCH_RIG_ID", 7), hosts=1)
ENV = RIG.env()
T0 = time.monotonic()


def rig(*args: str) -> None:
    """Run the rig tool for the bench's instance (``PROVISION_BENCH_RIG_ID``, default 7)."""
    say(f"rig {RIG.rig_id}: {' '.join(args)}")
    RIG.rig(*args, timeout=600)


def say(msg: str) -> None:
    """Print a progress line with the time since the bench started."""
    print(f"[{time.monotonic() - T0:7.1f} s] {msg}", flush=True)


def cache_state(cache: Path) -> str:
    """Say what the controller wheel cache holds (warm: a DeepSpeed entry with its manifest)."""
    entries = sorted(p.parent.name for p in cache.glob("*/manifest.json"))
    return f"warm ({', '.join(entries)})" if entries else "cold (empty)"


def provision(cache: Path, log: Path, what: str, timeout: float) -> tuple[float, int, int]:
    """Run playbooks/stack.yml on the instance's hosts; return (wall seconds, total changed, builds).

    The output goes to ``log`` (a file, never a pipe); a progress line every 60 s; killed after ``timeout`` s.
    """
    argv = [
        ansible_bin("ansible-playbook"),
        "-i",
        str(RIG.inventory),
        str(REPO / "playbooks" / "stack.yml"),
        "-e",
        f'{{"pytorch_backend": "cpu", "wheel_cache_dir": "{cache}"}}',
    ]
    say(f"{what}: ansible-playbook playbooks/stack.yml (cache {cache}: {cache_state(cache)}; log {log})")
    start = time.monotonic()
    with log.open("w") as out:
        proc = subprocess.Popen(
            argv, env=ENV, cwd=REPO, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT
        )
        while True:
            try:
                rc = proc.wait(timeout=60)
                break
            except subprocess.TimeoutExpired:
                pass
            if time.monotonic() - start > timeout:
                proc.kill()
                proc.wait(timeout=60)
                sys.exit(f"{what}: no result after {timeout:.0f} s (killed); see {log}")
            tasks = re.findall(r"^TASK \[(.*?)\]", log.read_text(errors="replace"), re.MULTILINE)
            say(f"  {what}: {time.monotonic() - start:.0f} s, at: {tasks[-1] if tasks else '(starting)'}")
    wall = time.monotonic() - start
    text = log.read_text(errors="replace")
    if rc != 0:
        recap = text.rsplit("PLAY RECAP", 1)[-1]
        sys.exit(f"{what}: provisioning failed (rc={rc}); see {log}\n{recap[-2000:]}")
    changed = sum(int(n) for n in re.findall(r"changed=(\d+)", text))
    sections = text.split("TASK [")
    builds = sum(1 for s in sections if s.startswith("wheel_cache : Build the wheel") and "\nchanged:" in s)
    say(f"{what}: {wall:.1f} s, changed={changed}, builds={builds}")
    return wall, changed, builds


def main() -> int:
    """Run the phases and print the table."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--hosts", type=int, nargs=2, default=[1, 4], metavar=("SMALL", "LARGE"))
    parser.add_argument("--cold-cache", action="store_true", help="start every phase with an empty cache")
    parser.add_argument("--keep", action="store_true", help="leave the hosts of the last phase up")
    parser.add_argument("--timeout", type=float, default=5400, help="deadline of one playbook run, s")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="mift-bench-"))
    say(f"work dir {work}")
    results: dict[str, tuple[float, int, int]] = {}
    small, large = args.hosts
    try:
        for count in (small, large):
            rig("down", "--purge")
            rig("up", str(count))
            cache = work / f"wheels-{count}" if args.cold_cache else REPO / ".cache" / "wheels"
            what = f"{count} host(s), fresh"
            results[what] = provision(cache, work / f"run-{count}.log", what, args.timeout)
        what = f"{large} host(s), second run"
        results[what] = provision(cache, work / "rerun.log", what, args.timeout)
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
