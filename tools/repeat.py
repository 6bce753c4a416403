"""Run one test tier N times in a row and say which tests ever failed, how often, and with what: the flake
hunt of docs/testing.md "Flake hunt". A test that failed in any run is listed with its count and its first
message; the exit status is 1 when any run had a failure, 0 when every run passed, 2 when a run collected
no test at all (a hunt that ran nothing does not say "0 failures").

    python tools/repeat.py 20 tests/unit                       # the unit tier, 20 times
    python tools/repeat.py 20 tests/faults -m 'not rig'        # the in-process bad inputs
    LAUNCHER_E2E_RIG_ID=19 python tools/repeat.py 3 tests/integration/test_launcher_e2e.py

The arguments after N go to pytest as they are (each run: ``-q -p no:cacheprovider --junitxml``); the junit
files stay in ``--keep`` (default a new folder under /tmp) for a second look.
"""

from __future__ import annotations

import argparse
import collections
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path


def outcomes(junit: Path) -> dict[str, str]:
    """Return test id -> '' (passed or skipped) or the first line of its failure or error."""
    result: dict[str, str] = {}
    for case in ET.parse(junit).getroot().iter("testcase"):  # noqa: S314 - the junit file our pytest wrote
        test = f"{case.get('classname', '')}::{case.get('name', '')}"
        bad = next((c for c in case if c.tag in ("failure", "error")), None)
        if bad is None:
            result[test] = ""
        else:
            text = (bad.get("message") or bad.text or bad.tag).strip()
            result[test] = text.splitlines()[0][:300] if text else bad.tag
    return result


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("times", type=int, help="how many runs")
    ap.add_argument("--keep", type=Path, help="folder for each run's junit XML (default: a new one in /tmp)")
    args, pytest_args = ap.parse_known_args(argv)
    if args.times < 1:
        ap.error(f"N: {args.times} runs would check nothing; give 1 or more")
    keep = args.keep or Path(tempfile.mkdtemp(prefix="mift-repeat."))
    keep.mkdir(parents=True, exist_ok=True)
    failures: dict[str, list[int]] = collections.defaultdict(list)
    first: dict[str, str] = {}
    runs_failed = 0
    empty = 0
    tests_seen = 0
    for run in range(1, args.times + 1):
        junit = keep / f"run-{run}.xml"
        t0 = time.monotonic()
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "pytest",
                "-q",
                "-p",
                "no:cacheprovider",
                f"--junitxml={junit}",
                *pytest_args,
            ],
            capture_output=True,
            text=True,
            check=False,
        )
        took = time.monotonic() - t0
        got = outcomes(junit) if junit.exists() else {}
        bad = {t: m for t, m in got.items() if m}
        for test, message in bad.items():
            failures[test].append(run)
            first.setdefault(test, message)
        tests_seen = max(tests_seen, len(got))
        if not got:
            empty += 1
            print(f"run {run}/{args.times}: no test ran (pytest rc={proc.returncode}) {proc.stdout[-300:]!r}")
        else:
            print(f"run {run}/{args.times}: {len(got)} tests, {len(bad)} failed, {took:.0f} s", end="")
            print(f" (pytest rc={proc.returncode})")
        if bad or proc.returncode not in (0, 5):
            runs_failed += 1
        sys.stdout.flush()
    print(
        f"\n{args.times} runs of {tests_seen} tests ({' '.join(pytest_args)}): {runs_failed} with a failure"
    )
    for test, runs in sorted(failures.items(), key=lambda kv: -len(kv[1])):
        print(f"  {len(runs)} of {args.times} (runs {runs}): {test}\n      {first[test]}")
    print(f"junit files: {keep}")
    if empty:
        return 2
    return 1 if runs_failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
