"""Where a test run's CPU goes on the 2-core machine: a trainer that spins next to a paced one, and the follow
loop's poll period, each side by side with its alternative in one call.

On 2 hosts of rig ``--rig-id`` started from the provisioned host image (``mift_testsupport.image``), with the
faults suite's job (2 ranks per host, gloo), it runs:

1. ``plain``: one 8-step run to its end (the poll period the job spec's default), with an exit hook in every
   Python process on the hosts (a MEASUREMENT DOUBLE: ``sitecustomize.py`` in the system and venv site
   folders of each test host, which appends the process's own CPU seconds and command line to
   ``/tmp/pyacct.log`` at exit), and prints the hosts' Python processes by CPU: what one trainer start costs;
2. ``window``: a long run kept ``--window`` seconds after its first logged step, then stopped (``launcher
   stop``), for each of ``unpaced`` (the tiny model steps as fast as it can) and ``paced``
   (``Cluster.job(paced=True)``: a 1 s sleep before each step, the slow-step test double), and for each of the
   poll periods ``--polls`` (default: 2 s, the old default, and 5 s); prints the controller's and the hosts'
   CPU seconds and the steps each run made.

The hosts' CPU is the rig's accounting cgroup (``rig cpu``); the controller's is this process's children.
Not a test: numbers for docs/measurements.md ("Where a test run's CPU goes").

    python bench/run_cost.py [--rig-id 19] [--window 40] [--polls 2,5]
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "python"))
sys.path.insert(0, str(REPO / "tests"))
from faults.conftest import JOBS  # noqa: E402
from mift_testsupport.cluster import Cluster  # noqa: E402
from mift_testsupport.image import provisioned_rig  # noqa: E402

ACCT = """
import atexit, os, resource, sys
def _mift_acct():
    try:
        s = resource.getrusage(resource.RUSAGE_SELF)
        with open("/tmp/pyacct.log", "a") as f:
            f.write("%.2f\\t%s\\n" % (s.ru_utime + s.ru_stime, " ".join(sys.argv)[:120]))
    except Exception:
        pass
atexit.register(_mift_acct)
"""
VENV = "/opt/mift/venv"


def children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def hosts_cpu(rig_id: int) -> float:
    out = subprocess.run(
        [str(REPO / "tools" / "testhosts" / "rig"), "cpu"],
        env={"RIG_ID": str(rig_id), "PATH": "/usr/bin:/bin:/usr/sbin:/sbin"},
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return float(out.split()[-1])


def install_accounting(cluster: Cluster) -> None:
    site = f"$({VENV}/bin/python -c 'import site; print(site.getsitepackages()[0])')"
    for host in cluster.hosts:
        cluster.ssh(
            host,
            f"cat > /usr/lib/python3.11/sitecustomize.py <<'EOF'\n{ACCT}\nEOF\n"
            f"cp /usr/lib/python3.11/sitecustomize.py {site}/sitecustomize.py; rm -f /tmp/pyacct.log",
        )


def remove_accounting(cluster: Cluster) -> None:
    site = f"$({VENV}/bin/python -c 'import site; print(site.getsitepackages()[0])')"
    for host in cluster.hosts:
        cluster.ssh(
            host, f"rm -f /usr/lib/python3.11/sitecustomize.py {site}/sitecustomize.py /tmp/pyacct.log"
        )


def processes(cluster: Cluster, host: int) -> list[tuple[float, str]]:
    rows = []
    for line in cluster.ssh(host, "cat /tmp/pyacct.log 2>/dev/null; true").splitlines():
        cpu, _, argv = line.partition("\t")
        rows.append((float(cpu), argv))
    return sorted(rows, reverse=True)


def kind(argv: str) -> str:
    for key, name in (
        ("llamafactory/launcher.py", "training rank"),
        ("llamafactory-cli", "llamafactory-cli (parent)"),
        ("torchrun", "torchrun"),
        ("mift_node.pyz agent status", "agent status (poll)"),
        ("mift_node.pyz", "agent start/collect/stop"),
        ("--dists", "preflight probe"),
    ):
        if key in argv:
            return name
    return "other (ansible modules, -c)"


def plain(cluster: Cluster, rig_id: int) -> None:
    install_accounting(cluster)
    job = cluster.job("cost-plain")
    c0, h0, t0 = children_cpu(), hosts_cpu(rig_id), time.monotonic()
    out = cluster.run("run", str(job), "-i", str(cluster.inventory), timeout=900)
    wall, ctrl, hosts = time.monotonic() - t0, children_cpu() - c0, hosts_cpu(rig_id) - h0
    print(
        f"plain 8-step run: exit {out.returncode}, {wall:.1f} s, "
        f"controller {ctrl:.1f} CPU-s, hosts {hosts:.1f} CPU-s"
    )
    for host in cluster.hosts:
        by_kind: dict[str, list[float]] = {}
        for cpu, argv in processes(cluster, host):
            by_kind.setdefault(kind(argv), []).append(cpu)
        print(f"  host{host}: python processes by CPU-s (count, sum, largest)")
        for name, cpus in sorted(by_kind.items(), key=lambda kv: -sum(kv[1])):
            print(f"    {name:30s} {len(cpus):3d}  {sum(cpus):6.2f}  {max(cpus):5.2f}")
    remove_accounting(cluster)


def window(cluster: Cluster, rig_id: int, *, paced: bool, poll_s: float, seconds: float) -> dict[str, float]:
    name = f"cost-{'paced' if paced else 'unpaced'}-{poll_s:g}"
    job = cluster.job(name, max_steps=2000, paced=paced, poll_interval_s=poll_s, recovery={"max_restarts": 0})
    c0, h0 = children_cpu(), hosts_cpu(rig_id)
    proc, _log = cluster.start("run", str(job), "-i", str(cluster.inventory))
    run_id = cluster.wait_step(cluster.run_id_of(name), proc)
    h1 = hosts_cpu(rig_id)
    time.sleep(seconds)
    h2 = hosts_cpu(rig_id)  # the launcher still runs: its CPU reaches children_cpu once it exited
    cluster.run("stop", run_id, timeout=300)
    proc.wait(timeout=300)
    c3, h3 = children_cpu(), hosts_cpu(rig_id)
    steps = json.loads(cluster.ssh(1, f"tail -n 1 /var/lib/mift/runs/{run_id}/output/trainer_log.jsonl"))
    return {
        "start_hosts": h1 - h0,
        "window_hosts": h2 - h1,
        "ctrl_all": c3 - c0,  # the launcher's own CPU reaches children_cpu once it exited
        "hosts_all": h3 - h0,
        "steps": float(steps.get("current_steps") or 0),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rig-id", type=int, default=19)
    parser.add_argument("--window", type=float, default=40.0)
    parser.add_argument("--polls", default="2,5")
    args = parser.parse_args()
    polls = [float(p) for p in args.polls.split(",")]
    work = Path("/tmp") / f"mift-run-cost-{args.rig_id}"
    subprocess.run(["rm", "-rf", str(work)], check=True)
    work.mkdir(parents=True)
    with provisioned_rig(args.rig_id, 2) as rig:
        cluster = Cluster(rig, work, real_backend=False, base=JOBS)
        plain(cluster, args.rig_id)
        print(f"\nkept running {args.window:g} s after the first logged step, then `launcher stop`:")
        print(
            f"{'trainer':9s} {'poll':>5s} {'steps':>6s} {'hosts CPU-s in window':>22s} "
            f"{'hosts CPU-s all':>16s} {'controller CPU-s all':>21s}"
        )
        for poll_s in polls:
            for paced in (False, True):
                r = window(cluster, args.rig_id, paced=paced, poll_s=poll_s, seconds=args.window)
                print(
                    f"{'paced' if paced else 'unpaced':9s} {poll_s:4g}s {r['steps']:6.0f} "
                    f"{r['window_hosts']:22.1f} {r['hosts_all']:16.1f} {r['ctrl_all']:21.1f}",
                    flush=True,
                )
    return 0


if __name__ == "__main__":
    sys.exit(main())
