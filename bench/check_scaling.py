"""Wall time and round count of ``launcher check`` at N test hosts (CPU: the link test is gloo over TCP).

Not a CI stage. Starts N provisioned test hosts from the image (``mift_testsupport.image``, rig
``$CHECK_BENCH_RIG_ID``), runs ``python -m launcher check JOB -i INVENTORY --fresh --no-gpu-test`` once per N,
one N after the other, and takes the rig down after each. The launcher under test is whatever ``launcher``
imports first on ``PYTHONPATH`` (main's checkout for "before", a branch's for "after"): its path is printed.

    RIG_HOME=/work/main/.rig CHECK_BENCH_RIG_ID=41 PYTHONPATH=<checkout>/python \\
        python bench/check_scaling.py 3 8 16

Prints per N: the check's wall time (the command, start to exit), the time of its link test as it reports it,
the groups in its link table and the rounds they took (the check's own count where it prints one; one round
per group where the groups run one after the other).
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import tempfile
import time
from pathlib import Path

import launcher
from mift_testsupport.cluster import Cluster
from mift_testsupport.image import provisioned_rig
from mift_testsupport.rig import rig_id_from_env

LINKS_RE = re.compile(r"links(?: \(TCP\))? measured in ([\d.]+) s(?: \((\d+) rounds\))?")


def measure(hosts: int, rig_id: int, work: Path) -> dict[str, object]:
    """Run one check on ``hosts`` test hosts; return its figures."""
    with provisioned_rig(rig_id, hosts, log=work / f"image-{hosts}.log") as rig:
        cluster = Cluster(rig, work / f"n{hosts}")
        job = cluster.job("check-scale")
        os.environ["MIFT_CHECK_CACHE"] = tempfile.mkdtemp(prefix="check-cache-", dir=work)
        t0 = time.monotonic()
        args = ("check", str(job), "-i", str(cluster.inventory), "--fresh", "--no-gpu-test")
        out = cluster.run(*args, timeout=7200)
        wall = time.monotonic() - t0
    text = out.stdout + out.stderr
    (work / f"check-{hosts}.log").write_text(text)
    groups = [line for line in text.splitlines() if re.match(r"^(host\d+-host\d+|ring\()", line)]
    match = LINKS_RE.search(text)
    rounds = int(match.group(2)) if match and match.group(2) else len(groups)
    return {
        "hosts": hosts,
        "rc": out.returncode,
        "wall_s": round(wall, 1),
        "links_s": float(match.group(1)) if match else None,
        "groups": len(groups),
        "rounds": rounds,
        "summary": next((line for line in text.splitlines() if line.startswith("check: ")), ""),
    }


def main(argv: list[str] | None = None) -> int:
    """Measure each N given, one after the other."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("hosts", type=int, nargs="+")
    parser.add_argument("--work", type=Path, default=None, help="where logs go (default: a temp folder)")
    args = parser.parse_args(argv)
    rig_id = rig_id_from_env("CHECK_BENCH_RIG_ID", 41)
    work = args.work or Path(tempfile.mkdtemp(prefix="check-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    print(f"launcher under test: {Path(launcher.__file__).parent}; rig {rig_id}; logs {work}", flush=True)
    for hosts in args.hosts:
        row = measure(hosts, rig_id, work)
        print(
            f"{row['hosts']:>3} hosts: check {row['wall_s']} s (rc {row['rc']}), link test "
            f"{row['links_s']} s, {row['groups']} groups in {row['rounds']} rounds | {row['summary']}",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
