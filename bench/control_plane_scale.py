"""The launcher's control plane as nodes are added: provision, run, follow, status, logs, stop, a lost node.

At each host count of ``--sizes`` (in increasing order; hosts are added to the same rig, started from the
provisioned host image, docs/testing.md "The provisioned host image") this bench measures, on test hosts whose
``llamafactory-cli`` is the trainer TEST DOUBLE (``mift_testsupport.trainer_testdouble``: the log lines of
LLaMA-Factory, ``trainer_log.jsonl`` and checkpoints at a set step time, the same signals, no compute), so
that what is measured is the launcher's own cost:

* ``provision``: a no-change re-run of ``provision.yml`` (wall s; every host must report changed=0);
* ``started``: ``launcher run`` to its ``started on N nodes`` line (first run on the hosts of that size, which
  asks torch once on each new host; ``started (warm)``: the second run);
* ``step seen``: from a step logged on the rank-0 node (the double's wall time of each step) to the follow's
  table showing that step or a later one (median and max over the steps of the window);
* ``poll``: the follow's poll (wall s, median) and the controller's CPU per poll (the launcher and everything
  it starts, ansible-playbook, its workers and ssh clients, in a cgroup v1 cpuacct group of its own), also per
  node;
* ``status``, ``logs`` (rank 0's log while the run runs), ``stop`` (``launcher stop``: the stop playbook, then
  ``collect``, each timed inside the launcher);
* ``lost``: a run whose last node loses its link (``ip link set eth0 down`` in its namespace) after the first
  logged step: seconds from the cut to the follow naming it (``hostN: unreachable for 2 polls``).

The launcher runs under a timing wrapper (this file, ``launcher-timed``: a measurement double that wraps the
backend's poll, stop and collect to write their start and end times to a file; nothing else changes). It
prints one table row per host count with the 1-minute load average beside it, then each figure's growth per
added node (least squares slope) and the projection to 128 and 512 nodes (``--json`` keeps the rows;
``--compare`` prints a before table beside it). Not a CI stage: it needs root and minutes.

    RIG_HOME=/work/main/.rig python bench/control_plane_scale.py --rig-id 50 --sizes 2 8 16 32 64 \
        [--step-s 1] [--window 30] [--json after.json] [--compare before.json] [--keep]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import runpy
import shlex
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "python"))

CG_ROOT = Path("/sys/fs/cgroup/cpuacct/mift-cpu")
TIMINGS_VAR = "MIFT_BENCH_TIMINGS"
CG_VAR = "MIFT_BENCH_CGROUP"
DOUBLE = REPO / "python" / "mift_testsupport" / "trainer_testdouble.py"
CLI = "/opt/mift/venv/bin/llamafactory-cli"
DEFAULTS = REPO / "roles" / "mift_defaults"
# A host started from the image boots with a boot id of its own (systemd-nspawn gives every container one),
# and the rocm part's node fingerprint covers /proc/sys/kernel/random/boot_id ("a reboot verifies the driver
# and the GPUs again"): its first provision.yml re-verifies rocm and stack, as after a reboot. A no-change re-
# run is what the provision row measures, so each new host first records its rocm fingerprint as of its own
# boot, through the fingerprint script of the role (`record`, the inputs kept as the image's provisioning
# recorded them); nothing else of the record changes.
SETTLE_PLAYBOOK = [
    {
        "name": "Record the rocm fingerprint of hosts started from the image as of their own boot",
        "hosts": "{{ settle_hosts }}",
        "gather_facts": False,
        "vars_files": [str(DEFAULTS / "defaults" / "main.yml"), str(DEFAULTS / "vars" / "main.yml")],
        "tasks": [
            {
                "name": "Read the recorded fingerprints",
                "ansible.builtin.command": {"argv": ["cat", "{{ _mift_defaults_record }}"]},
                "register": "settle_record",
                "changed_when": False,
            },
            {
                "name": "Record rocm again at this boot, with the inputs recorded",
                "ansible.builtin.command": {
                    "argv": [
                        "python3",
                        "-c",
                        "{{ lookup('ansible.builtin.file', '"
                        + str(DEFAULTS / "files" / "mift_fingerprint.py")
                        + "') }}",
                        "record",
                        "{{ _mift_defaults_node_spec | to_json }}",
                        "rocm",
                        "{{ (settle_record.stdout | from_json).rocm.inputs }}",
                    ]
                },
            },
        ],
    }
]


# --- the timing wrapper (runs inside the launcher's process) ----------------------------------------------
def launcher_timed(args: list[str]) -> None:
    """``python -m launcher ARGS`` with the backend's poll, stop and collect timed into
    ``$MIFT_BENCH_TIMINGS`` (one JSON line each: what, t0, t1 in time.time()), in the cgroup named by
    ``$MIFT_BENCH_CGROUP``."""
    cg = os.environ.get(CG_VAR)
    if cg:
        Path(cg, "cgroup.procs").write_text(f"{os.getpid()}\n")
    out = Path(os.environ[TIMINGS_VAR])
    lock = threading.Lock()

    def timed(what: str, fn: Any) -> Any:  # noqa: ANN401 - wraps any method
        def wrapper(*a: Any, **kw: Any) -> Any:  # noqa: ANN401
            t0 = time.time()
            try:
                return fn(*a, **kw)
            finally:
                with lock, out.open("a") as fh:
                    fh.write(json.dumps({"what": what, "t0": t0, "t1": time.time()}) + "\n")

        return wrapper

    from launcher.backends import agent_stream, ssh, ssh_stream  # noqa: PLC0415
    from launcher.backends.base import PollEach  # noqa: PLC0415

    agent_stream.AgentStream.poll = timed("poll", agent_stream.AgentStream.poll)  # type: ignore[method-assign]
    ssh_stream.SshStream.poll = timed("poll", ssh_stream.SshStream.poll)  # type: ignore[method-assign]
    PollEach.poll = timed("poll", PollEach.poll)  # type: ignore[method-assign]
    ssh.SshBackend.stop = timed("stop", ssh.SshBackend.stop)  # type: ignore[method-assign]
    ssh.SshBackend.collect = timed("collect", ssh.SshBackend.collect)  # type: ignore[method-assign]
    ssh.SshBackend.start = timed("start", ssh.SshBackend.start)  # type: ignore[method-assign]
    sys.argv = ["launcher", *args]
    runpy.run_module("launcher", run_name="__main__", alter_sys=True)


# --- controller side -----------------------------------------------------------------------------------
def load1() -> float:
    return float(Path("/proc/loadavg").read_text().split()[0])


def cg_seconds(usage: Path) -> float:
    """CPU seconds of a cpuacct cgroup (v1) so far (nan: none)."""
    try:
        return int(usage.read_text()) / 1e9
    except (OSError, ValueError):
        return float("nan")


class CpuGroup:
    """One cpuacct cgroup (v1) for a launcher command: its CPU seconds so far."""

    def __init__(self, name: str) -> None:
        self.path = CG_ROOT / name
        with contextlib.suppress(OSError):
            self.path.rmdir()  # an empty one of an earlier run
        self.path.mkdir(parents=True, exist_ok=True)

    def seconds(self) -> float:
        return cg_seconds(self.path / "cpuacct.usage")

    def remove(self) -> None:
        with contextlib.suppress(OSError):
            self.path.rmdir()


@dataclass
class Launch:
    """A launcher command running under the timing wrapper: its output lines with the time each was read."""

    proc: subprocess.Popen[str]
    timings: Path
    cpu: CpuGroup
    lines: list[tuple[float, str]] = field(default_factory=list)
    _reader: threading.Thread | None = None

    def read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append((time.time(), line.rstrip("\n")))

    def wait_line(self, pattern: str, seconds: float) -> float | None:
        """Wait until a line matches ``pattern`` (regex); return its time (None: not within ``seconds`` or
        the launcher ended)."""
        deadline = time.monotonic() + seconds
        seen = 0
        while time.monotonic() < deadline:
            for t, line in self.lines[seen:]:
                if re.search(pattern, line):
                    return t
            seen = len(self.lines)
            if self.proc.poll() is not None and self._reader is not None and not self._reader.is_alive():
                return None
            time.sleep(0.1)
        return None

    def events(self, what: str) -> list[tuple[float, float]]:
        try:
            rows = [json.loads(x) for x in self.timings.read_text().splitlines() if x.strip()]
        except OSError:
            return []
        return [(float(r["t0"]), float(r["t1"])) for r in rows if r.get("what") == what]

    def finish(self, timeout: float = 600) -> int:
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        if self._reader is not None:
            self._reader.join(timeout=10)
        return int(self.proc.returncode)

    def text(self) -> str:
        return "\n".join(line for _t, line in self.lines)


class Bench:
    def __init__(self, rig_id: int, work: Path, step_s: float, window: float) -> None:
        from mift_testsupport.cluster import Cluster  # noqa: PLC0415
        from mift_testsupport.image import IMAGE, SYSTEMD  # noqa: PLC0415
        from mift_testsupport.rig import Rig  # noqa: PLC0415

        self.rig = Rig(rig_id=rig_id, hosts=2, systemd=SYSTEMD, image=IMAGE)
        self.work = work
        self.step_s = step_s
        self.window = window
        self.cluster_cls = Cluster
        self.installed: set[int] = set()
        self.n = 0
        self.count = 0
        self.provision_from = REPO
        self.provisions = True
        self.model: Path | None = None

    # --- hosts --------------------------------------------------------------------------------------------
    def grow(self, n: int) -> float:
        """Hosts 1..n up (the new ones from the image, made non-builders); return the seconds it took."""
        from mift_testsupport.image import NOT_BUILDER  # noqa: PLC0415

        t0 = time.monotonic()
        self.rig.hosts = n
        self.rig.up(n)
        for host in range(max(2, self.n + 1), n + 1):
            self.rig.ssh(host, NOT_BUILDER)
        if self.provisions:  # only the provision row needs the hosts' records as of their own boot
            self.settle(range(self.n + 1, n + 1))
        self.n = n
        return time.monotonic() - t0

    def settle(self, hosts: range) -> None:
        """Record each new host's rocm fingerprint as of its own boot (SETTLE_PLAYBOOK)."""
        playbook = self.work / "settle.yml"
        playbook.write_text(json.dumps(SETTLE_PLAYBOOK, indent=1) + "\n")
        names = ",".join(f"host{h}" for h in hosts)
        out = self.rig.playbook(playbook, "-e", json.dumps({"settle_hosts": names}), timeout=900)
        if out.returncode != 0:
            raise RuntimeError(f"settle: {out.stdout[-3000:]}{out.stderr[-1000:]}")

    def install_double(self) -> None:
        """The trainer test double as each host's llamafactory-cli (its shebang: the node venv's python)."""
        body = DOUBLE.read_text()
        for host in range(1, self.n + 1):
            if host in self.installed:
                continue
            cmd = (
                f"head -1 {CLI} | grep -q '^#!' && shebang=$(head -1 {CLI}) && "
                f'{{ echo "$shebang"; printf %s {shlex.quote(body)}; }} > {CLI}.double && '
                f"chmod 755 {CLI}.double && mv {CLI}.double {CLI}"
            )
            self.rig.ssh(host, cmd)
            self.installed.add(host)

    # --- the launcher -------------------------------------------------------------------------------------
    def cluster(self) -> Any:  # noqa: ANN401 - mift_testsupport.cluster.Cluster
        return self.cluster_cls(self.rig, self.work, real_backend=True)

    def job(self, name: str) -> Path:
        return self.cluster().job(  # type: ignore[no-any-return]
            name,
            max_steps=100_000,
            save_steps=50,
            recovery={"max_restarts": 0},
            env={"OMP_NUM_THREADS": 1, "DS_ACCELERATOR": "cpu", "MIFT_TESTDOUBLE_STEP_S": self.step_s},
        )

    def launch(self, *args: str) -> Launch:
        self.count += 1
        timings = self.work / f"timings-{self.count}.jsonl"
        cpu = CpuGroup(f"scale{self.rig.rig_id}-{os.getpid()}-{self.count}")
        env = {
            **self.cluster().launcher.env(),
            TIMINGS_VAR: str(timings),
            CG_VAR: str(cpu.path),
            "PYTHONPATH": str(REPO / "python") + os.pathsep + os.environ.get("PYTHONPATH", ""),
        }
        proc = subprocess.Popen(
            [sys.executable, __file__, "launcher-timed", *args],
            env=env,
            cwd=REPO,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        launch = Launch(proc, timings, cpu)
        launch._reader = threading.Thread(target=launch.read, daemon=True)
        launch._reader.start()
        return launch

    def timed(self, *args: str, timeout: float = 600) -> tuple[float, Launch, int]:
        t0 = time.time()
        launch = self.launch(*args)
        rc = launch.finish(timeout)
        return time.time() - t0, launch, rc

    # --- one host count -----------------------------------------------------------------------------------
    def provision(self) -> dict[str, Any]:
        from mift_testsupport.provision import provision_argv, recap, tiny_model  # noqa: PLC0415

        # the image's hosts recorded the inputs digest of the checkout that provisioned them, and that digest
        # hashes the checkout's absolute paths (roles/mift_defaults/files/mift_fingerprint.py `tree`): a
        # no-change re-run must come from that checkout (--provision-from); Ansible's temp folders go to work
        tree = self.provision_from
        env = {
            **self.rig.env(),
            "ANSIBLE_CONFIG": str(tree / "ansible.cfg"),
            "ANSIBLE_LOCAL_TEMP": str(self.work / "ansible-tmp"),
            "ANSIBLE_SSH_CONTROL_PATH_DIR": str(self.work / "ansible-cp"),
        }
        model = self.model or tiny_model()
        load = load1()
        t0 = time.monotonic()
        out = subprocess.run(
            provision_argv(self.rig.inventory, model),
            env=env,
            cwd=tree,
            capture_output=True,
            text=True,
            timeout=1800,
            check=False,
        )
        took = time.monotonic() - t0
        (self.work / f"provision-{self.n}.log").write_text(out.stdout + out.stderr)
        hosts = recap(out.stdout)
        changed = sum(h["changed"] for h in hosts.values())
        bad = out.returncode != 0 or len(hosts) != self.n or changed
        return {
            "provision": took,
            "provision_load": load,
            "provision_ok": not bad,
            "provision_changed": changed,
        }

    def followed_run(self) -> dict[str, Any]:
        """run (followed) -> started; the follow's polls over the window; status; logs; stop."""
        row: dict[str, Any] = {}
        name = f"scale{self.n}a"
        job = self.job(name)
        row["run_load"] = load1()
        t0 = time.time()
        follow = self.launch("run", str(job), "-i", str(self.rig.inventory))
        started = follow.wait_line(rf"started on {self.n} nodes", 600)
        if started is None:
            follow.proc.kill()
            follow.finish(30)
            raise RuntimeError(f"{self.n} hosts: no 'started' line:\n{follow.text()[-4000:]}")
        row["started"] = started - t0
        # the window: from the first shown step on, self.window seconds of follow
        first = follow.wait_line(r"^host1\s.*\s\d+/\d+\s", 300)
        if first is None:
            raise RuntimeError(f"{self.n} hosts: no step shown:\n{follow.text()[-4000:]}")
        hosts_cpu = CG_ROOT / f"rig{self.rig.rig_id}" / "cpuacct.usage"  # every process of the rig's hosts
        cpu0, h0, w0 = follow.cpu.seconds(), cg_seconds(hosts_cpu), time.time()
        row["poll_load"] = load1()
        time.sleep(self.window)
        cpu1, h1, w1 = follow.cpu.seconds(), cg_seconds(hosts_cpu), time.time()
        polls = [(a, b) for a, b in follow.events("poll") if w0 <= b <= w1]
        row["polls"] = len(polls)
        row["poll_wall"] = statistics.median(b - a for a, b in polls) if polls else None
        row["poll_period"] = (w1 - w0) / len(polls) if polls else None
        row["poll_cpu"] = (cpu1 - cpu0) / len(polls) if polls else None
        row["poll_cpu_node"] = row["poll_cpu"] / self.n if polls else None
        row["hosts_cpu_node"] = (h1 - h0) / len(polls) / self.n if polls else None
        run_id = self.cluster().run_id_of(name)()
        # status and logs while it runs
        row["status_load"] = load1()
        row["status"], st, _ = self.timed("status", run_id)
        row["logs"], lg, _ = self.timed("logs", run_id)
        row["logs_ok"] = "Process rank: 0" in lg.text()
        # step seen: each step k logged on host1 -> the first table line showing step >= k
        shown = []
        for t, line in follow.lines:
            m = re.match(r"^host1\s.*?\s(\d+)/\d+\s", line)
            if m:
                shown.append((t, int(m.group(1))))
        # stop: launcher stop (stop playbook, then collect), from another process while the follow runs
        row["stop_load"] = load1()
        row["stop"], stop, stop_rc = self.timed("stop", run_id)
        row["stop_ok"] = stop_rc == 0 and "nothing left running" in stop.text()
        stops, collects = stop.events("stop"), stop.events("collect")
        row["stop_playbook"] = stops[0][1] - stops[0][0] if stops else None
        row["collect"] = collects[0][1] - collects[0][0] if collects else None
        follow.finish(300)
        steps_text = self.rig.ssh(
            1, f"cat /var/lib/mift/runs/{shlex.quote(run_id)}/output/testdouble_steps.tsv", check=False
        ).stdout
        logged = [
            (int(a), float(b)) for a, b in (x.split("\t") for x in steps_text.splitlines() if "\t" in x)
        ]
        seen = []
        for step, at in logged:
            if not w0 <= at <= w1:
                continue
            when = next((t for t, s in shown if s >= step and t >= at), None)
            if when is not None:
                seen.append(when - at)
        row["seen_median"] = statistics.median(seen) if seen else None
        row["seen_max"] = max(seen) if seen else None
        for launch in (follow, st, lg, stop):
            launch.cpu.remove()
        return row

    def lost_node_run(self) -> dict[str, Any]:
        """A run whose last node is cut off after the first shown step: seconds until the follow names it."""
        row: dict[str, Any] = {}
        name = f"scale{self.n}b"
        job = self.job(name)
        ns = self.rig.netns(self.n)
        t0 = time.time()
        follow = self.launch("run", str(job), "-i", str(self.rig.inventory))
        started = follow.wait_line(rf"started on {self.n} nodes", 600)
        row["started_warm"] = None if started is None else started - t0
        if follow.wait_line(r"^host1\s.*\s\d+/\d+\s", 300) is None:
            raise RuntimeError(f"{self.n} hosts: no step shown:\n{follow.text()[-4000:]}")
        row["lost_load"] = load1()
        cut = time.time()
        subprocess.run(["ip", "-n", ns, "link", "set", "eth0", "down"], check=True)
        try:
            named = follow.wait_line(rf"host{self.n}: unreachable for", 300)
            row["lost"] = None if named is None else named - cut
            follow.finish(300)
        finally:
            subprocess.run(["ip", "-n", ns, "link", "set", "eth0", "up"], check=True)
            subprocess.run(
                ["ip", "-n", ns, "route", "replace", "default", "via", f"{self.rig.net}.254", "dev", "eth0"],
                check=False,
            )
        run_id = self.cluster().run_id_of(name)()
        _took, cleanup, rc = self.timed("stop", run_id)
        if rc != 0:
            print(f"  cleanup stop of {run_id}: exit {rc}\n{cleanup.text()[-2000:]}", flush=True)
        for launch in (follow, cleanup):
            launch.cpu.remove()
        return row

    def measure(self, n: int, *, skip_provision: bool) -> dict[str, Any]:
        row: dict[str, Any] = {"hosts": n, "up": self.grow(n)}
        if not skip_provision:
            row.update(self.provision())  # before the double goes in (it is no input of provision.yml anyway)
        self.install_double()
        row.update(self.followed_run())
        row.update(self.lost_node_run())
        return row


# --- the report ----------------------------------------------------------------------------------------
FIGURES = [  # key, label, format
    ("provision", "provision no-change s", ".1f"),
    ("started", "run -> started s", ".1f"),
    ("started_warm", "run -> started (warm) s", ".1f"),
    ("seen_median", "step seen median s", ".1f"),
    ("seen_max", "step seen max s", ".1f"),
    ("poll_wall", "poll wait s (median)", ".2f"),
    ("poll_period", "poll period s", ".2f"),
    ("poll_cpu", "ctl CPU-s/poll", ".2f"),
    ("poll_cpu_node", "ctl CPU-s/node/poll", ".3f"),
    ("hosts_cpu_node", "hosts CPU-s/node/poll", ".3f"),
    ("status", "status s", ".1f"),
    ("logs", "logs s", ".1f"),
    ("stop", "stop s", ".1f"),
    ("stop_playbook", "(stop playbook) s", ".1f"),
    ("collect", "(collect) s", ".1f"),
    ("lost", "lost node named s", ".1f"),
]
LOADS = {
    "provision": "provision_load",
    "started": "run_load",
    "poll_cpu": "poll_load",
    "stop": "stop_load",
    "status": "status_load",
    "lost": "lost_load",
}


def fmt(value: Any, spec: str) -> str:  # noqa: ANN401
    return "-" if value is None else format(value, spec)


def slope(points: list[tuple[float, float]]) -> tuple[float, float] | None:
    """Least squares line y = a + b x through ``points``: (a, b)."""
    if len(points) < 2:
        return None
    mx = statistics.fmean(x for x, _ in points)
    my = statistics.fmean(y for _, y in points)
    sxx = sum((x - mx) ** 2 for x, _ in points)
    if not sxx:
        return None
    b = sum((x - mx) * (y - my) for x, y in points) / sxx
    return my - b * mx, b


def table(rows: list[dict[str, Any]], title: str) -> str:
    sizes = [r["hosts"] for r in rows]
    head = ["figure", *[f"{n} hosts" for n in sizes], "per added node", "128 (proj.)", "512 (proj.)"]
    out = [f"### {title}", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for key, label, spec in FIGURES:
        cells = []
        for r in rows:
            cell = fmt(r.get(key), spec)
            if key in LOADS and r.get(LOADS[key]) is not None:
                cell += f" (load {r[LOADS[key]]:.1f})"
            cells.append(cell)
        per_node = key.endswith("_node")  # fitted as a total per poll (a + b N), projected as (a + b N) / N
        line = slope(
            [(r["hosts"], r[key] * (r["hosts"] if per_node else 1)) for r in rows if r.get(key) is not None]
        )
        if line and per_node:
            a, b = line
            extra = [f"{b:+.4f} (total)", fmt((a + b * 128) / 128, spec), fmt((a + b * 512) / 512, spec)]
        elif line:
            a, b = line
            extra = [
                format(b, "+.4f" if abs(b) < 0.01 else "+.3f"),
                fmt(a + b * 128, spec),
                fmt(a + b * 512, spec),
            ]
        else:
            extra = ["-", "-", "-"]
        out.append("| " + " | ".join([label, *cells, *extra]) + " |")
    checks = [
        f"{r['hosts']} hosts: provision changed={r.get('provision_changed', '-')} "
        f"ok={r.get('provision_ok', '-')}, "
        f"polls in window {r.get('polls')}, logs ok={r.get('logs_ok')}, stop ok={r.get('stop_ok')}"
        for r in rows
    ]
    return "\n".join([*out, "", *checks])


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["launcher-timed"]:
        launcher_timed(argv[1:])
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rig-id", type=int, default=50)
    parser.add_argument("--sizes", type=int, nargs="+", default=[2, 8, 16, 32, 64])
    parser.add_argument("--step-s", type=float, default=1.0, help="the trainer double's seconds per step")
    parser.add_argument("--window", type=float, default=30.0, help="seconds of follow measured per size")
    parser.add_argument("--skip-provision", action="store_true")
    parser.add_argument(
        "--provision-from", type=Path, default=REPO, help="the checkout that made the image (no-change row)"
    )
    parser.add_argument("--model", type=Path, help="the tiny model the image was provisioned with")
    parser.add_argument("--json", type=Path, help="write the rows here (after each size)")
    parser.add_argument("--compare", type=Path, help="rows of an earlier run (--json) to print first")
    parser.add_argument("--title", default="this tree")
    parser.add_argument("--keep", action="store_true", help="leave the hosts up")
    parser.add_argument("--work", type=Path)
    args = parser.parse_args(argv)
    if args.sizes != sorted(args.sizes):
        parser.error("--sizes: in increasing order (hosts are added to one rig)")
    work = args.work or Path(tempfile.mkdtemp(prefix="control-plane-"))
    work.mkdir(parents=True, exist_ok=True)
    bench = Bench(args.rig_id, work, args.step_s, args.window)
    bench.provision_from = args.provision_from.resolve()
    bench.provisions = not args.skip_provision
    bench.model = args.model
    rows: list[dict[str, Any]] = []
    t0 = time.monotonic()
    bench.rig.down(purge=True)
    try:
        for n in args.sizes:
            print(f"[{time.monotonic() - t0:7.1f} s] {n} hosts (load {load1():.1f}) ...", flush=True)
            try:
                row = bench.measure(n, skip_provision=args.skip_provision)
            except (RuntimeError, subprocess.SubprocessError, AssertionError) as err:
                print(f"  {n} hosts: not measured: {str(err)[-3000:]}", flush=True)
                break
            rows.append(row)
            print("  " + json.dumps(row), flush=True)
            if args.json:
                args.json.write_text(json.dumps(rows, indent=1) + "\n")
    finally:
        if not args.keep:
            bench.rig.down(purge=True)
    if args.compare:
        print(table(json.loads(args.compare.read_text()), f"before ({args.compare.name})") + "\n")
    print(table(rows, args.title))
    print(f"\n[{time.monotonic() - t0:7.1f} s] work folder {work}")
    return 0 if rows else 1


if __name__ == "__main__":
    sys.exit(main())
