"""Two CI runs side by side, stage by stage: the wall seconds and the CPU seconds of each stage (``.ci/run``'s
table, the test hosts' share in brackets), before and after, with the difference, and the totals. What a
cut of CI's work did, per stage (docs/testing.md "CI time").

    python tools/ci_compare.py BEFORE.out AFTER.out
    python tools/ci_compare.py BEFORE.out AFTER.out --cases 30

``--cases N`` adds the N costliest test cases of both runs, case by case (the ``cpu ... s (hosts ...) NODEID``
lines of ``mift_testsupport/case_cpu.py``: run CI with ``MIFT_CPU_TOP`` raised, e.g. 100, to have them all; a
module's shared set-up counts to its first case).

Each file is the whole output of a ``.ci/run`` (its table is read, from ``== stage timings``). A stage in one
run only is listed with a dash for the other (a stage that did not run has no row); a file without a table is
one error line, exit 2.
"""

from __future__ import annotations

import argparse
import re
import sys
from dataclasses import dataclass
from pathlib import Path

ROW = re.compile(
    r"^\s+(?P<name>\S+)\s+start \+(?P<start>\d+) s\s+(?P<wall>[\d.]+) s\s+rc=(?P<rc>-?\d+)"
    r".*?cpu-s\s+(?P<cpu>\d+) \(hosts\s+(?P<hosts>\d+|-)\)"
)
TOTAL = re.compile(r"^\s+total\s+(?P<wall>[\d.]+) s\s*$")
STAGE = re.compile(r"^== stage: (?P<name>\S+)")
CASE = re.compile(r"^cpu (?P<cpu>[\d.]+) s \([^)]*\) (?P<nodeid>\S+)")


@dataclass(frozen=True)
class Stage:
    name: str
    wall_s: float
    rc: int
    cpu_s: int
    hosts_cpu_s: int


@dataclass(frozen=True)
class Table:
    stages: dict[str, Stage]
    total_s: float | None


def read_table(text: str) -> Table:
    """Return the stage rows and the total of the last ``== stage timings`` table in a CI output."""
    start = text.rfind("== stage timings")
    if start < 0:
        raise ValueError("no '== stage timings' table")
    stages: dict[str, Stage] = {}
    total: float | None = None
    for line in text[start:].splitlines()[1:]:
        if m := ROW.match(line):
            hosts = 0 if m["hosts"] == "-" else int(m["hosts"])  # "-": no cgroup to count the hosts with
            stages[m["name"]] = Stage(m["name"], float(m["wall"]), int(m["rc"]), int(m["cpu"]), hosts)
        elif m := TOTAL.match(line):
            total = float(m["wall"])
        elif line.startswith("=="):
            break
    return Table(stages, total)


def read_cases(text: str) -> dict[str, float]:
    """Return ``stage nodeid`` -> CPU seconds for every case a CI output lists."""
    cases: dict[str, float] = {}
    stage = ""
    for line in text.splitlines():
        if m := STAGE.match(line):
            stage = m["name"]
        elif m := CASE.match(line):
            cases[f"{stage} {m['nodeid']}"] = float(m["cpu"])
    return cases


def compare_cases(before: dict[str, float], after: dict[str, float], count: int) -> list[str]:
    """The ``count`` costliest cases of either run, before and after (a dash where a run has none)."""
    keys = sorted(set(before) | set(after), key=lambda k: -max(before.get(k, 0.0), after.get(k, 0.0)))
    lines = [f"{'CPU-s':>7s} {'->':>7s}  {'stage':22s} case"]
    for key in keys[:count]:
        stage, _, nodeid = key.partition(" ")
        case = nodeid.rpartition("::")[2]
        lines.append(f"{_num(before.get(key), 7, 1)} {_num(after.get(key), 7, 1)}  {stage:22s} {case}")
    return lines


def _num(value: float | None, width: int, digits: int = 0) -> str:
    return f"{'-':>{width}}" if value is None else f"{value:{width}.{digits}f}"


def compare(before: Table, after: Table) -> list[str]:
    """The side-by-side lines: stage, wall before/after, CPU before/after (hosts), CPU difference."""
    lines = [
        f"{'stage':28s} {'wall s':>8s} {'->':>8s}   {'CPU-s (hosts)':>14s} {'->':>14s} {'CPU diff':>9s}",
    ]
    names = list(before.stages) + [n for n in after.stages if n not in before.stages]
    for name in sorted(names, key=lambda n: -(before.stages.get(n) or after.stages[n]).cpu_s):
        b, a = before.stages.get(name), after.stages.get(name)
        cpu_b = f"{b.cpu_s:6d} ({b.hosts_cpu_s:5d})" if b else f"{'-':>14s}"
        cpu_a = f"{a.cpu_s:6d} ({a.hosts_cpu_s:5d})" if a else f"{'-':>14s}"
        diff = f"{a.cpu_s - b.cpu_s:+9d}" if a and b else f"{'-':>9s}"
        failed = "  rc!=0" if (b and b.rc) or (a and a.rc) else ""
        lines.append(
            f"{name:28s} {_num(b.wall_s if b else None, 8, 1)} {_num(a.wall_s if a else None, 8, 1)}   "
            f"{cpu_b} {cpu_a} {diff}{failed}"
        )
    cpu_before = sum(s.cpu_s for s in before.stages.values())
    cpu_after = sum(s.cpu_s for s in after.stages.values())
    hosts_before = sum(s.hosts_cpu_s for s in before.stages.values())
    hosts_after = sum(s.hosts_cpu_s for s in after.stages.values())
    lines.append(
        f"{'all stages (CPU), total (wall)':28s} {_num(before.total_s, 8, 1)} {_num(after.total_s, 8, 1)}   "
        f"{cpu_before:6d} ({hosts_before:5d}) {cpu_after:6d} ({hosts_after:5d}) {cpu_after - cpu_before:+9d}"
    )
    if cpu_before:
        lines.append(f"CPU seconds after / before: {cpu_after / cpu_before:.1%}")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tools/ci_compare.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("before", type=Path, help="the output of one .ci/run")
    parser.add_argument("after", type=Path, help="the output of another")
    parser.add_argument("--cases", type=int, default=0, metavar="N", help="also the N costliest cases")
    args = parser.parse_args(argv)
    texts = []
    tables = []
    for path in (args.before, args.after):
        try:
            texts.append(path.read_text(errors="replace"))
            tables.append(read_table(texts[-1]))
        except (OSError, ValueError) as e:
            print(f"error: {path}: {e.strerror if isinstance(e, OSError) else e}", file=sys.stderr)
            return 2
    print("\n".join(compare(*tables)))
    if args.cases > 0:
        print()
        print("\n".join(compare_cases(read_cases(texts[0]), read_cases(texts[1]), args.cases)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
