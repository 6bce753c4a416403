"""Provisioning benchmark: ``provision.yml`` fresh, re-run with nothing changed, and adding a node.

Two modes, both on test hosts of rig instance ``PROVISION_BENCH_RIG_ID`` (default 7):

* default (``--hosts 1 4``): ``playbooks/stack.yml`` (cpu backend) on 1, then 4 fresh test hosts, then a
  re-run on the 4; prints the wall times, whether a build ran, the ratio large / small. By default the
  controller wheel cache is the repository's .cache/wheels/ (as in production); ``--cold-cache`` starts every
  phase from an empty cache and includes the one build on the builder.
* ``--from-image``: the rows of a re-run, each ``provision.yml`` with the test-double switches
  (mift_testsupport.provision):

  - ``fresh-1``: 1 bare host, provisioned; that host is then saved as image ``--image`` (unless
    ``--reuse-image``: the image exists, saved by an earlier ``fresh-1`` row of this bench from the same code,
    and the row is not measured). The bench's hosts are plain-mode (the numbers in docs/stack.md are), so its
    image is too: the suites' image ``provisioned`` is made on a systemd-mode host, and ``rig up`` refuses to
    start an image in the other mode;
  - ``nochange-2`` / ``nochange-8``: 2 / 8 hosts started from the image (``rig up N --image``: provisioned in
    seconds, python/mift_testsupport/image.py), then provision.yml with nothing changed;
  - ``addone``: 2 hosts from the image plus one bare host of rig ``PROVISION_BENCH_ADD_RIG_ID`` (default 8),
    named host3 in one inventory; provision.yml on all 3; the recap lines of host1 and host2 are printed.

  Every run is profiled by bench/callback_plugins/mift_task_times.py: the tasks started, and the slowest
  tasks (wall seconds, as profile_tasks measures them). ``--repo DIR`` runs another checkout's playbooks
  (the before column: a copy of main) with this bench; ``--json FILE`` keeps the rows, ``--compare
  BEFORE.json`` prints both side by side.
  Load averages are printed with every row: the machine is shared.

Needs root and the rig (tools/testhosts/rig setup).

    python bench/provision_scaling.py [--hosts 1 4] [--cold-cache] [--keep]
    python bench/provision_scaling.py --from-image [--rows fresh-1 nochange-2 nochange-8 addone]
        [--image NAME] [--reuse-image] [--repo DIR] [--json FILE] [--compare BEFORE.json]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import yaml

from mift_testsupport.image import make_hosts_their_own
from mift_testsupport.paths import REPO_ROOT as REPO
from mift_testsupport.proc import ansible_bin
from mift_testsupport.provision import provision_argv, recap, tiny_model
from mift_testsupport.rig import Rig, rig_id_from_env

RIG = Rig(rig_id=rig_id_from_env("PROVISION_BENCH_RIG_ID", 7), hosts=1)
ADD_RIG_ID = rig_id_from_env("PROVISION_BENCH_ADD_RIG_ID", 8)
ENV = RIG.env()
T0 = time.monotonic()
ROWS = ("fresh-1", "nochange-2", "nochange-8", "addone")


def rig(*args: str, rig_id: int | None = None, timeout: float = 900) -> None:
    """Run the rig tool for the bench's instance (or ``rig_id``)."""
    the_rig = RIG if rig_id is None else Rig(rig_id=rig_id, hosts=1)
    say(f"rig {the_rig.rig_id}: {' '.join(args)}")
    the_rig.rig(*args, timeout=timeout)


def say(msg: str) -> None:
    """Print a progress line with the time since the bench started."""
    print(f"[{time.monotonic() - T0:7.1f} s] {msg}", flush=True)


def load() -> str:
    """The 1-minute and 5-minute load averages."""
    one, five, _ = os.getloadavg()
    return f"{one:.1f}/{five:.1f}"


def cache_state(cache: Path) -> str:
    """Say what the controller wheel cache holds (warm: a DeepSpeed entry with its manifest)."""
    entries = sorted(p.parent.name for p in cache.glob("*/manifest.json"))
    return f"warm ({', '.join(entries)})" if entries else "cold (empty)"


def run_logged(
    argv: list[str],
    log: Path,
    what: str,
    timeout: float,
    *,
    cwd: Path = REPO,
    env: dict[str, str] | None = None,
) -> tuple[float, int]:
    """Run ``argv`` with its output in ``log`` (a file, never a pipe), a progress line every 60 s; killed
    after ``timeout`` s. Returns (wall seconds, exit status)."""
    start = time.monotonic()
    with log.open("w") as out:
        proc = subprocess.Popen(
            argv, env=env or ENV, cwd=cwd, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT
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
    return time.monotonic() - start, rc


def provision(cache: Path, log: Path, what: str, timeout: float) -> tuple[float, int, int]:
    """Run playbooks/stack.yml on the instance's hosts; return (wall seconds, total changed, builds)."""
    argv = [
        ansible_bin("ansible-playbook"),
        "-i",
        str(RIG.inventory),
        str(REPO / "playbooks" / "stack.yml"),
        "-e",
        f'{{"pytorch_backend": "cpu", "wheel_cache_dir": "{cache}"}}',
    ]
    say(f"{what}: ansible-playbook playbooks/stack.yml (cache {cache}: {cache_state(cache)}; log {log})")
    wall, rc = run_logged(argv, log, what, timeout)
    text = log.read_text(errors="replace")
    if rc != 0:
        recap_text = text.rsplit("PLAY RECAP", 1)[-1]
        sys.exit(f"{what}: provisioning failed (rc={rc}); see {log}\n{recap_text[-2000:]}")
    changed = sum(int(n) for n in re.findall(r"changed=(\d+)", text))
    sections = text.split("TASK [")
    builds = sum(1 for s in sections if s.startswith("wheel_cache : Build the wheel") and "\nchanged:" in s)
    say(f"{what}: {wall:.1f} s, changed={changed}, builds={builds}")
    return wall, changed, builds


def stack_scaling(args: argparse.Namespace) -> int:
    """The default mode: playbooks/stack.yml on SMALL, then LARGE fresh hosts, then a re-run."""
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


# ---- --from-image: the re-run rows -------------------------------------------------------------------------


def profile(times_file: Path, top: int = 6) -> tuple[int, list[tuple[str, float]]]:
    """Tasks started and the slowest tasks of a run (bench/callback_plugins/mift_task_times.py): wall seconds
    from a task's start to the next one's, summed over the serial batches of a play."""
    rows = json.loads(times_file.read_text()) if times_file.exists() else []
    times: dict[str, float] = defaultdict(float)
    for name, sec in rows:
        times[name] += sec
    return len(rows), sorted(times.items(), key=lambda kv: -kv[1])[:top]


def provision_full(repo: Path, inventory: Path, log: Path, what: str, timeout: float) -> dict[str, Any]:
    """``provision.yml`` of checkout ``repo`` with the test-double switches: wall time, recap, profile."""
    times = log.with_suffix(".times.json")
    env = dict(ENV)
    env.update(
        ANSIBLE_CONFIG=str(repo / "ansible.cfg"),
        ANSIBLE_CALLBACK_PLUGINS=str(REPO / "bench" / "callback_plugins"),
        ANSIBLE_CALLBACKS_ENABLED="mift_task_times",
        MIFT_TASK_TIMES=str(times),
    )
    argv = provision_argv(inventory, tiny_model())
    before = load()
    say(f"{what}: ansible-playbook provision.yml in {repo} (load {before}; log {log})")
    wall, rc = run_logged(argv, log, what, timeout, cwd=repo, env=env)
    text = log.read_text(errors="replace")
    if rc != 0:
        tail = text.rsplit("PLAY RECAP", 1)[-1][-3000:]
        sys.exit(f"{what}: provisioning failed (rc={rc}); see {log}\n{tail}")
    recap_text = text.rsplit("PLAY RECAP", 1)[-1]
    lines = [line.strip() for line in recap_text.splitlines() if re.match(r"^host\d+\s*:", line)]
    row: dict[str, Any] = {
        "wall_s": round(wall, 1),
        "tasks": profile(times)[0],
        "recap": recap(text),
        "recap_lines": lines,
        "load": f"{before} -> {load()}",
        "top": [(name, round(sec, 1)) for name, sec in profile(times)[1]],
        "log": str(log),
    }
    changed = sum(v["changed"] for v in row["recap"].values())
    say(f"{what}: {wall:.1f} s, {row['tasks']} tasks, changed={changed}, load {row['load']}")
    return row


def image_rig(hosts: int, image: str) -> Rig:
    """``hosts`` hosts of the bench's rig started from ``image``, each but host1 made a non-builder."""
    the_rig = Rig(rig_id=RIG.rig_id, hosts=hosts, image=image)
    the_rig.down(purge=True)
    say(f"rig {RIG.rig_id}: up {hosts} --image {image}")
    the_rig.up()
    make_hosts_their_own(the_rig)
    return the_rig


def merged_inventory(main: Rig, extra: Rig, dest: Path) -> Path:
    """One inventory: ``main``'s hosts, then ``extra``'s host1 as host<N+1> (its own rig network)."""
    data = yaml.safe_load(main.inventory.read_text())
    hosts = data["all"]["children"]["trainers"]["hosts"]
    ip = extra.ip(1)
    hosts[f"host{main.hosts + 1}"] = {"ansible_host": ip, "train_address": ip}
    dest.write_text(yaml.safe_dump(data, sort_keys=False))
    return dest


def from_image(args: argparse.Namespace) -> int:
    """The re-run rows, each on its own hosts; prints the table (and the before column with --compare)."""
    repo = args.repo.resolve()
    work = Path(tempfile.mkdtemp(prefix="mift-bench-"))
    say(f"work dir {work}; checkout {repo}; image {args.image}")
    rows: dict[str, dict[str, Any]] = {}
    try:
        if "fresh-1" in args.rows and not args.reuse_image:
            RIG.down(purge=True)
            rig("up", "1")
            log = work / "fresh-1.log"
            rows["fresh-1"] = provision_full(repo, RIG.inventory, log, "fresh-1", args.timeout)
            RIG.rig("image", "rm", args.image, check=False)
            rig("image", "save", args.image, "--host", "1")
        for count in (2, 8):
            name = f"nochange-{count}"
            if name in args.rows:
                the_rig = image_rig(count, args.image)
                rows[name] = provision_full(repo, the_rig.inventory, work / f"{name}.log", name, args.timeout)
        if "addone" in args.rows:
            the_rig = image_rig(2, args.image)
            extra = Rig(rig_id=ADD_RIG_ID, hosts=1)
            extra.down(purge=True)
            rig("up", "1", rig_id=ADD_RIG_ID)
            inventory = merged_inventory(the_rig, extra, work / "addone-inventory.yml")
            rows["addone"] = provision_full(repo, inventory, work / "addone.log", "addone", args.timeout)
    finally:
        if not args.keep:
            RIG.down(purge=True)
            if "addone" in args.rows:  # the add rig is touched only by that row
                Rig(rig_id=ADD_RIG_ID, hosts=1).down(purge=True)
    if args.json:
        args.json.write_text(json.dumps({"repo": str(repo), "rows": rows}, indent=2) + "\n")
    before = json.loads(args.compare.read_text())["rows"] if args.compare else {}
    print_table(rows, before)
    return 0


def _cell(row: dict[str, Any] | None) -> str:
    if not row:
        return f"{'-':>34}"
    changed = sum(v["changed"] for v in row["recap"].values())
    return f"{row['wall_s']:>8.1f} s {row['tasks']:>5} tasks ch={changed:<3} ({row['load']:>9})"


def print_table(rows: dict[str, dict[str, Any]], before: dict[str, dict[str, Any]]) -> None:
    """The rows (after), with the before column when given; recap lines of add-one; the slowest tasks."""
    print()
    head = f"{'row':<12}" + (f"{'before: wall, tasks, changed (load)':>48}" if before else "")
    print(head + f"{'after: wall, tasks, changed (load)':>48}")
    for name in ROWS:
        if name in rows or name in before:
            left = f"{_cell(before.get(name)):>48}" if before else ""
            print(f"{name:<12}{left}{_cell(rows.get(name)):>48}")
    for label, data in (("before", before), ("after", rows)):
        for name, row in data.items():
            if name == "addone":
                print(f"{label} addone recap: " + " | ".join(row["recap_lines"]))
    n2, n8 = rows.get("nochange-2"), rows.get("nochange-8")
    if n2 and n8:
        print(f"after: nochange-8 / nochange-2 = {n8['wall_s'] / n2['wall_s']:.2f}")
    for label, data in (("before", before), ("after", rows)):
        for name, row in data.items():
            print(f"{label} {name} slowest: " + "; ".join(f"{t} {s:.1f} s" for t, s in row["top"]))


def main() -> int:
    """Run the phases of the chosen mode and print the table."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--hosts", type=int, nargs=2, default=[1, 4], metavar=("SMALL", "LARGE"))
    parser.add_argument("--cold-cache", action="store_true", help="start every phase with an empty cache")
    parser.add_argument("--keep", action="store_true", help="leave the hosts of the last phase up")
    parser.add_argument("--timeout", type=float, default=5400, help="deadline of one playbook run, s")
    parser.add_argument("--from-image", action="store_true", help="the re-run rows (see above)")
    parser.add_argument("--rows", nargs="+", choices=ROWS, default=list(ROWS))
    parser.add_argument("--image", default="bench-provisioned", help="rig image of a provisioned host")
    parser.add_argument("--reuse-image", action="store_true", help="use --image as it is; no fresh-1 row")
    parser.add_argument("--repo", type=Path, default=REPO, help="checkout whose provision.yml runs")
    parser.add_argument("--json", type=Path, help="write the rows here")
    parser.add_argument("--compare", type=Path, help="rows of a before run (--json) to print alongside")
    args = parser.parse_args()
    return from_image(args) if args.from_image else stack_scaling(args)


if __name__ == "__main__":
    sys.exit(main())
