"""Where a whole CI run's CPU goes, by kind of process: the kernel's process accounting of every process that
ended while it ran (acct(5): the controller's, and the test hosts', which live in the same kernel), sorted
by what started it.

Turn accounting on before the run and off after it (package ``acct``; root)::

    touch /tmp/ci.pacct && accton /tmp/ci.pacct
    CI=true bash .ci/run
    accton off
    python bench/cpu_accounting.py /tmp/ci.pacct [--top 25]

Each process (user + system CPU, acct_v3 records) is put in the group of its nearest ancestor that names
one, first match from the process itself upwards (parents are matched by pid and lifetime, since pids are
reused over a long run):

* ``trainer``: ``llamafactory-cli`` and what it started (torchrun, the training ranks; the kernel records a
  process under the name of the thread that exited last, so a rank shows as ``pt_gloo_runloop`` and the like);
* ``host: ansible module``: a ``python3`` under ``sshd`` that is no trainer (Ansible's modules on the test
  hosts, the node agent) and the ``sh``/``sshd`` around it;
* ``controller: ansible``: under ``ansible-playbook``/``ansible-runner`` on this machine (the play, its
  forks, the ``ssh`` clients);
* ``controller: pytest``/``molecule``/``lint``/``bootstrap``: the rest by the stage's own tool;
* everything else by its command name.

A process still running when accounting stops (the rig's long-lived daemons) is not in the file: the numbers
are what ended, which for a CI run is nearly all of it. What the numbers tell: which kind of work a cut of CI
time has to reach (docs/measurements.md "Where CI's CPU goes").
"""

from __future__ import annotations

import argparse
import collections
import struct
import sys
from dataclasses import dataclass
from pathlib import Path

# struct acct_v3 (linux/acct.h): flag, version, tty, exitcode, uid, gid, pid, ppid, btime, etime (float),
# utime, stime, mem, io, rw, minflt, majflt, swaps (comp_t), comm[16]
RECORD = struct.Struct("<BBHIIIIIIf8H16s")
ACCT_V3 = 3
AHZ = 100  # comp_t times are in 1/AHZ s


def comp_t(value: int) -> int:
    """Decode a comp_t: 13-bit mantissa, 3-bit base-8 exponent."""
    return (value & 0x1FFF) << (3 * (value >> 13))


@dataclass(frozen=True)
class Proc:
    pid: int
    ppid: int
    comm: str
    start: float  # btime, s since the epoch
    end: float
    cpu_s: float


def read_pacct(path: Path) -> list[Proc]:
    """Return the processes of an acct_v3 file; a truncated last record is left out."""
    data = path.read_bytes()
    procs = []
    for off in range(0, len(data) - RECORD.size + 1, RECORD.size):
        f = RECORD.unpack_from(data, off)
        if f[1] & 0x0F != ACCT_V3:
            raise SystemExit(f"{path}: record at byte {off} is not acct_v3 (version {f[1] & 0x0F})")
        comm = f[18].split(b"\0", 1)[0].decode(errors="replace")
        cpu = (comp_t(f[10]) + comp_t(f[11])) / AHZ
        procs.append(Proc(f[6], f[7], comm, float(f[8]), f[8] + f[9] / AHZ, cpu))  # etime: 1/AHZ s too
    return procs


TRAINER = "trainer (llamafactory-cli, torchrun, ranks)"
# command name (the process's own or an ancestor's) -> its group; the nearest one upwards wins
GROUP_OF = {
    # a process is recorded under the name of its thread that exited last: torchrun as pt_elastic, a rank
    # as pt_gloo_runloop, gloo_tcp_loop, jemalloc_bg_thd...; llamafactory-cli (which starts torchrun) keeps
    # its name, so the trainer is what it started
    "llamafactory-cl": TRAINER,
    "pt_elastic": TRAINER,
    "ansible-playboo": "controller: ansible",
    "ansible-runner": "controller: ansible",
    "molecule": "controller: molecule",
    "ruff": "controller: lint",
    "mypy": "controller: lint",
    "ansible-lint": "controller: lint",
    "yamllint": "controller: lint",
    "pip": "controller: bootstrap",
    "debootstrap": "controller: rig setup",
    "pytest": "controller: pytest",
    "sshd": "host: ssh session (ansible modules, agent, test commands)",
}


def parent_index(procs: list[Proc]) -> dict[int, list[Proc]]:
    by_pid: dict[int, list[Proc]] = collections.defaultdict(list)
    for p in procs:
        by_pid[p.pid].append(p)
    return by_pid


def parent_of(p: Proc, by_pid: dict[int, list[Proc]]) -> Proc | None:
    """The recorded process with p's ppid whose lifetime holds p's start (1 s slack: btime is whole s)."""
    for q in by_pid.get(p.ppid, ()):
        if q is not p and q.start <= p.start + 1 and q.end >= p.start - 1:
            return q
    return None


def group(p: Proc, by_pid: dict[int, list[Proc]]) -> str:
    chain: list[str] = []
    node: Proc | None = p
    while node is not None and len(chain) < 64:
        chain.append(node.comm)
        node = parent_of(node, by_pid)
    return next((GROUP_OF[comm] for comm in chain if comm in GROUP_OF), f"other: {p.comm}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("pacct", type=Path)
    ap.add_argument("--top", type=int, default=20, help="how many command names to list")
    args = ap.parse_args(argv)
    try:
        procs = read_pacct(args.pacct)
    except OSError as err:
        print(f"{args.pacct}: cannot read: {err.strerror}", file=sys.stderr)
        return 1
    if not procs:
        print(f"{args.pacct}: no process ended while accounting was on", file=sys.stderr)
        return 1
    by_pid = parent_index(procs)
    total = sum(p.cpu_s for p in procs)
    span = max(p.end for p in procs) - min(p.end for p in procs)
    print(f"{len(procs)} processes ended over {span:.0f} s; {total:.0f} CPU-s in all")
    groups: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0])
    comms: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0])
    for p in procs:
        g = groups[group(p, by_pid)]
        g[0] += p.cpu_s
        g[1] += 1
        c = comms[p.comm]
        c[0] += p.cpu_s
        c[1] += 1
    print(f"\n{'CPU-s':>8} {'share':>6} {'processes':>9}  group (nearest ancestor that names one)")
    for name, (cpu, n) in sorted(groups.items(), key=lambda kv: -kv[1][0])[: args.top]:
        print(f"{cpu:8.0f} {cpu / total:6.1%} {n:9d}  {name}")
    print(f"\n{'CPU-s':>8} {'share':>6} {'processes':>9} {'CPU-s each':>10}  command name")
    for name, (cpu, n) in sorted(comms.items(), key=lambda kv: -kv[1][0])[: args.top]:
        print(f"{cpu:8.0f} {cpu / total:6.1%} {n:9d} {cpu / n:10.2f}  {name}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
