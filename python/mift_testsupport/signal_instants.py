"""Send SIGINT or SIGTERM to ``python -m launcher validate`` at many instants; count what each run did.

The launcher's rule (docs/launcher.md "Exit codes"): a signal before the command's outcome is decided prints
``interrupted`` and exits 1; a signal after it changes nothing (the command's own code stands). Any other end
(death by the signal, a traceback, another code) is a failure. The runs are spread evenly from 0 s to past the
end of a run without a signal, so that imports, validation, printing and interpreter shutdown are all hit.
Each instant counts from the moment the launcher's first line has run (SIGINT caught, read from
``/proc/PID/status``): before it the interpreter is still starting, and a signal there meets the disposition
the launcher inherited (ignored, or SIGTERM's default), which no program can change.

The process is started the way the reported failure was: with SIGINT ignored by the parent shell
(``trap "" INT``), as in the background of a script or a CI runner, and an empty validation cache, so that the
real DeepSpeed and LLaMA-Factory classes are imported (seconds of work to interrupt).

    python -m mift_testsupport.signal_instants [--runs 200] [--jobs 2] [--signals INT,TERM] [--rev GIT_REV]

``--rev`` runs the launcher of another revision (``git archive`` of its ``python/``), for a before/after
comparison with the same harness.
"""

from __future__ import annotations

import argparse
import collections
import concurrent.futures
import dataclasses
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from mift_testsupport.paths import REPO_ROOT

JOB = "configs/jobs/tiny-lora-z3.yaml"
FIRST_INSTANT_S = 0.0
CAUGHT_SIGINT = 1 << (signal.SIGINT - 1)
HANG_S = 300  # a run interrupted or not ends long before, even on a loaded 2-core machine
HUNG = -1000  # the returncode recorded for a run that had to be killed
IMPORT_HOLD = Path(__file__).with_name("import_hold")  # its sitecustomize holds the first heavy import


@dataclasses.dataclass(frozen=True)
class Outcome:
    """One run: the signal, when it was sent (None: the run had ended before), and how the launcher ended."""

    signum: int
    instant_s: float
    sent: bool
    returncode: int
    stdout: str
    stderr: str

    @property
    def kind(self) -> str:
        """``interrupted``, ``completed`` (the command's own result) or ``FAILED: ...``."""
        last = (self.stderr.strip().splitlines() or [""])[-1]
        if self.returncode == HUNG:
            return f"FAILED: hung after the signal; {self.stderr[-2000:]}"
        if self.returncode == 1 and last.startswith("interrupted"):
            return "interrupted"
        if self.returncode == 0 and ": ok (" in self.stdout and "Traceback" not in self.stderr:
            return "completed"
        return f"FAILED: rc={self.returncode} last stderr line {last!r}"


def _launcher_env(pythonpath: Path | None, cache: str, hold_marker: Path | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "MIFT_VALIDATE_BUILTIN"}
    env["MIFT_CACHE_DIR"] = cache  # empty: the real classes are imported
    if pythonpath is not None:
        env["PYTHONPATH"] = str(pythonpath)
    if hold_marker is not None:
        env["MIFT_IMPORT_HOLD_MARKER"] = str(hold_marker)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(IMPORT_HOLD), env.get("PYTHONPATH", "")) if p)
    return env


def _stacks(pid: int) -> str:
    """The Python stacks of a hung process (py-spy, when installed), else its kernel wait channel."""
    try:
        return subprocess.run(
            ["py-spy", "dump", "--pid", str(pid)], capture_output=True, text=True, timeout=60, check=False
        ).stdout
    except (OSError, subprocess.TimeoutExpired):
        try:
            return "wchan: " + Path(f"/proc/{pid}/wchan").read_text()
        except OSError:
            return ""


def _handlers_in_place(pid: int) -> bool:
    """True once the process catches SIGINT (``SigCgt`` of ``/proc/PID/status``): the launcher's first line
    ran (it was started with SIGINT ignored)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    caught = next((int(line.split()[1], 16) for line in status.splitlines() if line.startswith("SigCgt:")), 0)
    return bool(caught & CAUGHT_SIGINT)


def run_once(
    signum: int, instant_s: float, pythonpath: Path | None = None, *, at_import: bool = False
) -> Outcome:
    """Start the launcher, send ``signum`` ``instant_s`` seconds after its handlers are in place (unless it
    ended by then), wait for its end.

    ``at_import``: count the instant from the moment validation starts importing DeepSpeed or LLaMA-Factory,
    held there by the ``import_hold`` test double, so that the signal provably lands during validation.
    """
    with tempfile.TemporaryDirectory(prefix="mift-sig-") as cache:
        marker = Path(cache) / "import-held" if at_import else None
        proc = subprocess.Popen(
            ["/bin/sh", "-c", f'trap "" INT; exec "{sys.executable}" -m launcher validate {JOB}'],
            cwd=REPO_ROOT,
            env=_launcher_env(pythonpath, cache, marker),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        while proc.poll() is None and not (
            marker.exists() if marker is not None else _handlers_in_place(proc.pid)
        ):
            time.sleep(0.001)
        deadline = time.monotonic() + instant_s
        while proc.poll() is None and time.monotonic() < deadline:
            time.sleep(min(0.005, max(0.0, deadline - time.monotonic())))
        sent = proc.poll() is None
        if sent:
            proc.send_signal(signum)
        try:
            out, err = proc.communicate(timeout=HANG_S)
        except subprocess.TimeoutExpired:  # a hang is a failure too: what it was doing, then end it
            stacks = _stacks(proc.pid)
            proc.kill()
            out, err = proc.communicate()
            return Outcome(
                signum, instant_s, sent, HUNG, out, err + f"\nhung {HANG_S} s after the signal\n" + stacks
            )
        return Outcome(signum, instant_s, sent, proc.returncode, out, err)


def baseline_s(pythonpath: Path | None = None) -> float:
    """Seconds one run takes without a signal (it must complete)."""
    t0 = time.monotonic()
    outcome = run_once(signal.SIGINT, 1e9, pythonpath)
    if outcome.kind != "completed":
        raise SystemExit(f"signal_instants: the run without a signal did not complete: {outcome.kind}")
    return time.monotonic() - t0


def instants(runs: int, until_s: float) -> list[float]:
    """``runs`` instants spread evenly over [FIRST_INSTANT_S, until_s]."""
    if runs == 1:
        return [FIRST_INSTANT_S]
    step = (until_s - FIRST_INSTANT_S) / (runs - 1)
    return [round(FIRST_INSTANT_S + i * step, 3) for i in range(runs)]


def run_many(
    runs: int, signums: list[int], jobs: int = 2, pythonpath: Path | None = None
) -> tuple[float, list[Outcome]]:
    """The baseline and one outcome per instant; signals alternate over ``signums``."""
    base = baseline_s(pythonpath)
    plan = [(signums[i % len(signums)], t) for i, t in enumerate(instants(runs, 1.5 * base))]
    with concurrent.futures.ThreadPoolExecutor(max_workers=jobs) as pool:
        outcomes = list(pool.map(lambda st: run_once(st[0], st[1], pythonpath), plan))
    return base, outcomes


def summary(base: float, outcomes: list[Outcome]) -> list[str]:
    """The lines printed: counts by signal and outcome, the spread of instants of each, every failure."""
    lines = [f"{len(outcomes)} runs; a run without a signal takes {base:.2f} s"]
    groups: dict[tuple[str, str], list[Outcome]] = collections.defaultdict(list)
    for o in outcomes:
        groups[
            (signal.Signals(o.signum).name, o.kind if not o.kind.startswith("FAILED") else "FAILED")
        ].append(o)
    for (sig, kind), group in sorted(groups.items()):
        ts = sorted(o.instant_s for o in group)
        after = sum(not o.sent for o in group)
        lines.append(
            f"  {sig:8} {kind:12} {len(group):4} runs, instants {ts[0]:.3f}-{ts[-1]:.3f} s"
            + (f" ({after} after the run had ended)" if after else "")
        )
    failures = [o for o in outcomes if o.kind.startswith("FAILED")]
    lines.append(f"failures: {len(failures)} of {len(outcomes)}")
    lines += [f"  {signal.Signals(o.signum).name} at {o.instant_s:.3f} s: {o.kind}" for o in failures]
    return lines


def _tree_of(rev: str, into: Path) -> Path:
    archive = subprocess.run(
        ["git", "archive", rev, "python"], cwd=REPO_ROOT, check=True, capture_output=True
    )
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive.stdout, check=True)
    return into / "python"


def main(argv: list[str] | None = None) -> int:
    """Run the harness and print its summary; exit 1 when any run failed."""
    parser = argparse.ArgumentParser(prog="python -m mift_testsupport.signal_instants", description=__doc__)
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--signals", default="INT,TERM", help="comma-separated: INT, TERM")
    parser.add_argument("--rev", help="run the launcher of this git revision instead of the checkout's")
    args = parser.parse_args(argv)
    signums = [int(signal.Signals[f"SIG{name.strip()}"]) for name in args.signals.split(",")]
    with tempfile.TemporaryDirectory(prefix="mift-sig-tree-") as tmp:
        pythonpath = _tree_of(args.rev, Path(tmp)) if args.rev else None
        print(f"launcher: {args.rev or 'this checkout'}; signals {args.signals}; {args.jobs} side by side")
        base, outcomes = run_many(args.runs, signums, args.jobs, pythonpath)
    for line in summary(base, outcomes):
        print(line)
    return 1 if any(o.kind.startswith("FAILED") for o in outcomes) else 0


if __name__ == "__main__":
    sys.exit(main())
