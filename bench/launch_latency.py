"""Launch latency: ``python -m launcher run`` versus the same commands started by hand over ssh.

For each host count N (default 2 and 4, on rig instance 8), it measures

* ``started``: from the command to every node's trainer process running (launcher: ``run --detach``
  printed ``started on N nodes``, after validation, preflight and the start playbook; the start playbook alone
  and the moment the command returned are shown too; by hand: every parallel
  ``ssh host 'setsid -f env ... llamafactory-cli train ...'`` returned);
* ``first step``: from the command to the first line of trainer_log.jsonl on the first node.

The by-hand variant reuses the files the launcher copied (train.yaml, ds_config.json) and the same
environment, so both start the same trainer; only the orchestration differs. Each run is stopped at its
first logged step. The hosts are brought up (and provisioned) once, for the largest N; a smaller N uses the
first N hosts (job spec ``hosts:`` list). Every wait has a deadline and fails with the reason; whatever
happens, the bench stops what it started and checks that no trainer process is left on any host.

    python bench/launch_latency.py --hosts 2 4 [--rig-id 8] [--provision] [--repeat 1] [--down]
    python bench/launch_latency.py --hosts 2 -i inventory/demo/hosts.yml     # already provisioned hosts
    python bench/launch_latency.py --hosts 2 -i .rig/5/inventory.yml --until started --repeat 5 \
        --compare /tmp/old-checkout   # `run` -> started only; another checkout's launcher side by side

``--until started`` stops each launcher run as soon as it printed ``started on N nodes`` (no first step, no
by-hand run) and prints the median of the repeats; ``--compare DIR`` runs the launcher of the checkout
``DIR`` (its ``python/`` and playbooks, this venv) the same way, alternating with this one, so before/after
are measured under the same load.

``--provision`` brings the rig up and runs ``provision.yml`` on it first (slow: the node venv is installed on
every host); without it the hosts must already be provisioned (the rig's, or ``-i`` an inventory).
Needs root for the rig (tools/testhosts/rig setup).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import re
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from mift_testsupport.launcher import launcher_argv
from mift_testsupport.paths import REPO_ROOT as REPO
from mift_testsupport.paths import RIG
from mift_testsupport.provision import provision_argv, tiny_model
from mift_testsupport.rig import Rig
from mift_testsupport.trainers import TRAINER_PROBE, parse_probe

JOB = REPO / "configs" / "jobs" / "tiny-lora-z3.yaml"
NODE_VENV = "/opt/mift/venv"
NODE_MODEL = "/opt/mift/models/tiny-llama"
BENCH_MARKER = "MIFT_BENCH_KEY"
AGENT_MARKER = "MIFT_AGENT_KEY"  # python/launcher/node/contract.py MARKER
T0 = time.monotonic()

# Fed to `python3 -` on a node (so its command line never matches what it looks for). Commands:
#   wait LOG NEEDLE TIMEOUT: until LOG is non-empty -> {"state": "step"}; no process with NEEDLE in its
#                            environment for 5 s -> "died"; TIMEOUT -> "timeout"
#   kill NEEDLE GRACE:       SIGTERM the processes with NEEDLE in their environment, SIGKILL after GRACE s
REMOTE = r"""
import json, os, signal, sys, time
from pathlib import Path

def pids(test):
    me = {os.getpid(), os.getppid()}
    out = []
    for e in Path("/proc").iterdir():
        if not e.name.isdigit() or int(e.name) in me:
            continue
        try:
            if (e / "stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                continue
            if test(e):
                out.append(int(e.name))
        except OSError:
            pass
    return out

def marked(needle):
    n = needle.encode()
    return pids(lambda e: n in (e / "environ").read_bytes().split(b"\0"))

cmd = sys.argv[1]
if cmd == "wait":
    log, needle, timeout = Path(sys.argv[2]), sys.argv[3], float(sys.argv[4])
    start = time.monotonic()
    last_alive = start
    state = "timeout"
    while time.monotonic() - start < timeout:
        try:
            if log.stat().st_size > 0:
                state = "step"
                break
        except OSError:
            pass
        now = time.monotonic()
        if marked(needle):
            last_alive = now
        elif now - last_alive > 5:
            state = "died"
            break
        time.sleep(0.1)
    print(json.dumps({"state": state, "waited_s": round(time.monotonic() - start, 2)}))
elif cmd == "kill":
    needle, grace = sys.argv[2], float(sys.argv[3])
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 3.0)):
        for pid in marked(needle):
            try:
                os.kill(pid, sig)
            except OSError:
                pass
        deadline = time.monotonic() + wait
        while marked(needle) and time.monotonic() < deadline:
            time.sleep(0.2)
    print(json.dumps({"left": marked(needle)}))
"""


def say(msg: str) -> None:
    """Print a progress line with the time since the bench started."""
    print(f"[{time.monotonic() - T0:7.1f} s] {msg}", flush=True)


class BenchError(RuntimeError):
    """A step of the bench failed or ran past its deadline."""


def run_logged(argv: list[str], log: Path, timeout: float, what: str, **kw: Any) -> int:  # noqa: ANN401
    """Run ``argv`` with stdout+stderr into ``log`` (never a pipe: a lingering child cannot block us).

    Prints the last TASK line every 60 s; raises BenchError after ``timeout`` s (the process is killed).
    """
    with log.open("w") as out:
        proc = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, start_new_session=True, **kw
        )
        start = time.monotonic()
        next_note = start + 60
        while True:
            try:
                return proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
            now = time.monotonic()
            if now - start > timeout:
                os.killpg(proc.pid, 15)
                try:
                    proc.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, 9)
                    proc.wait(timeout=20)
                raise BenchError(f"{what}: no result after {timeout:.0f} s (killed); see {log}")
            if now >= next_note:
                tasks = re.findall(r"^TASK \[(.*?)\]", log.read_text(errors="replace"), re.MULTILINE)
                say(f"  {what}: {now - start:.0f} s, at: {tasks[-1] if tasks else '(starting)'}")
                next_note = now + 60


class Hosts:
    """The bench's nodes: addresses and ssh options from an Ansible inventory (the rig's, the demo's)."""

    def __init__(self, inventory: Path) -> None:
        text = inventory.read_text()
        # the demo inventory names its key and ssh config relative to the inventory
        text = re.sub(r"\{\{\s*inventory_dir\s*\}\}", str(inventory.resolve().parent), text)
        if "{{" in text:
            raise BenchError(
                f"{inventory}: only {{{{ inventory_dir }}}} is resolved here; other templating is not"
            )
        data = yaml.safe_load(text)
        try:
            group = data["all"]["children"]["trainers"]["hosts"]
            gvars = data["all"].get("vars", {})
        except (KeyError, TypeError) as err:
            raise BenchError(f"{inventory}: no all.children.trainers.hosts group") from err
        self.inventory = inventory
        self.names = list(group)
        self.addr = {h: (group[h] or {}).get("ansible_host", h) for h in self.names}
        self.user = gvars.get("ansible_user", "root")
        self.ssh_opts = [
            *(
                ["-i", gvars["ansible_ssh_private_key_file"]]
                if "ansible_ssh_private_key_file" in gvars
                else []
            ),
            *shlex.split(gvars.get("ansible_ssh_common_args", "")),
            "-o",
            "BatchMode=yes",
            "-o",
            "ConnectTimeout=10",
        ]

    def ssh(
        self, host: str, command: str, *, timeout: float = 60, stdin: str | None = None
    ) -> subprocess.CompletedProcess[str]:
        """Run ``command`` on ``host``; stdin is /dev/null unless given; BenchError after ``timeout`` s."""
        argv = ["ssh", *self.ssh_opts, f"{self.user}@{self.addr[host]}", command]
        try:
            return subprocess.run(
                argv,
                input=stdin if stdin is not None else "",
                capture_output=True,
                text=True,
                timeout=timeout,
                check=False,
            )
        except subprocess.TimeoutExpired as err:
            raise BenchError(f"{host}: ssh {command[:60]!r}: no answer after {timeout:.0f} s") from err

    def remote(self, host: str, *args: str, timeout: float = 60) -> Any:  # noqa: ANN401 - JSON from the node
        """Run the REMOTE helper on ``host`` and return its JSON answer."""
        out = self.ssh(host, "python3 - " + shlex.join(args), timeout=timeout, stdin=REMOTE)
        if out.returncode != 0:
            raise BenchError(
                f"{host}: remote {args[0]} failed (rc={out.returncode}): {out.stderr.strip()[-300:]}"
            )
        return json.loads(out.stdout)

    def check_ready(self, names: list[str]) -> None:
        """Fail with the reason unless every host answers and has the node venv and the tiny model."""
        probe = f"test -x {NODE_VENV}/bin/llamafactory-cli && test -f {NODE_MODEL}/config.json"

        def one(host: str) -> str:
            out = self.ssh(host, f"{probe} && echo ready || echo not-provisioned", timeout=40)
            if out.returncode != 0:
                return f"{host} ({self.addr[host]}): unreachable: {out.stderr.strip()[-200:]}"
            return "" if out.stdout.strip() == "ready" else f"{host}: not provisioned (use --provision)"

        with concurrent.futures.ThreadPoolExecutor(len(names)) as pool:
            problems = [p for p in pool.map(one, names) if p]
        if problems:
            raise BenchError("hosts not ready: " + "; ".join(problems))

    def trainer_procs(self, names: list[str]) -> dict[str, list[str]]:
        """Return host -> the training processes still running there ("PID COMMAND" lines)."""

        def one(host: str) -> list[str]:
            out = self.ssh(host, TRAINER_PROBE, timeout=40)
            if out.returncode != 0:
                raise BenchError(f"{host}: probing for trainers failed: {out.stderr.strip()[-300:]}")
            return parse_probe(out.stdout)

        with concurrent.futures.ThreadPoolExecutor(len(names)) as pool:
            found = dict(zip(names, pool.map(one, names), strict=True))
        return {h: p for h, p in found.items() if p}

    def kill_marked(self, names: list[str], needle: str, grace: float = 10) -> dict[str, list[int]]:
        """SIGTERM/SIGKILL the processes carrying ``needle``; return host -> pids still alive."""
        with concurrent.futures.ThreadPoolExecutor(len(names)) as pool:
            answers = list(pool.map(lambda h: self.remote(h, "kill", needle, str(grace), timeout=60), names))
        return {h: a["left"] for h, a in zip(names, answers, strict=True) if a["left"]}


def wait_first_step(hosts: Hosts, master: str, log: str, needle: str, t0: float, timeout: float) -> float:
    """Wait (on the node, one ssh) until ``log`` has a line; return seconds since ``t0``."""
    answer = hosts.remote(master, "wait", log, needle, str(timeout), timeout=timeout + 60)
    if answer["state"] == "step":
        return time.monotonic() - t0
    tail = hosts.ssh(master, f"tail -n 15 {shlex.quote(str(Path(log).parents[1]))}/trainer.log").stdout
    reason = "the trainer exited" if answer["state"] == "died" else f"no logged step after {timeout:.0f} s"
    raise BenchError(f"{master}: {reason} ({log}); trainer.log ends:\n{tail}")


class Bench:
    """One host count: the launcher run, then the same trainer by hand; cleans up what it started."""

    def __init__(
        self, hosts: Hosts, names: list[str], work: Path, args: argparse.Namespace, repo: Path = REPO
    ) -> None:
        self.repo = repo
        self.hosts = hosts
        self.names = names
        self.work = work
        self.args = args
        self.runs = work / "runs"
        self.runs.mkdir(parents=True, exist_ok=True)
        self.env = {**os.environ, "MIFT_RUNS_DIR": str(self.runs)}
        if repo != REPO:  # the launcher of another checkout: its package first on the path
            self.env["PYTHONPATH"] = os.pathsep.join(
                [str(repo / "python"), *filter(None, [os.environ.get("PYTHONPATH")])]
            )
        self.launcher_runs: list[str] = []
        self.bench_keys: list[str] = []

    def _job(self, tag: str) -> Path:
        spec = yaml.safe_load(JOB.read_text())
        cfg = yaml.safe_load((REPO / "configs" / "train" / "tiny_cpu_lora_sft.yaml").read_text())
        cfg.update(max_steps=2000, save_steps=100000)
        train = self.work / "configs" / "train" / f"bench-{tag}.yaml"
        train.parent.mkdir(parents=True, exist_ok=True)
        if not (self.work / "configs" / "data").exists():
            (self.work / "configs" / "data").symlink_to(REPO / "configs" / "data")
        train.write_text(yaml.safe_dump(cfg))
        spec.update(
            name="bench",
            train_config=str(train),
            deepspeed=str(REPO / "configs" / "deepspeed" / "ds_z3.json"),
            hosts=self.names,
        )
        job = self.work / f"bench-job-{tag}.yaml"
        job.write_text(yaml.safe_dump(spec))
        return job

    def launcher(self, tag: str) -> tuple[float, float, float, float, str]:
        """Return (started, returned, start playbook, first step, run_id) of ``launcher run --detach``."""
        job = self._job(tag)
        log = self.work / f"launcher-{tag}.log"
        argv = launcher_argv("run", str(job), "-i", str(self.hosts.inventory), "--detach")
        say(f"  launcher: {' '.join(argv[1:])}")
        t0, t0_wall = time.monotonic(), time.time()
        rc = run_logged(argv, log, self.args.start_timeout, "launcher run", env=self.env, cwd=self.repo)
        returned = time.monotonic() - t0
        # the launcher's last lines ("started on N nodes ...", "detached; ...") are written once every trainer
        # runs; the interpreter then still has to exit: the log's mtime is when the trainers were started
        started = log.stat().st_mtime - t0_wall
        text = log.read_text(errors="replace")
        run_id = next((m for m in re.findall(r"^run (\S+):", text, re.MULTILINE)), None)
        if run_id:
            self.launcher_runs.append(run_id)
        if rc != 0 or run_id is None:
            raise BenchError(f"launcher run failed (rc={rc}):\n{text[-3000:]}")
        m = re.search(r"^started on \d+ nodes in ([\d.]+) s", text, re.MULTILINE)
        playbook = float(m.group(1)) if m else float("nan")
        say(
            f"  launcher: all {len(self.names)} trainers started after {started:.1f} s, `run --detach` "
            f"returned after {returned:.1f} s (run {run_id})"
        )
        if self.args.until == "started":
            self.stop_launcher(run_id)
            return started, returned, playbook, float("nan"), run_id
        run_dir = f"/var/lib/mift/runs/{run_id}"
        first = wait_first_step(
            self.hosts,
            self.names[0],
            f"{run_dir}/output/trainer_log.jsonl",
            f"{AGENT_MARKER}={run_id}@{run_dir}",
            t0,
            self.args.step_timeout,
        )
        say(f"  launcher: first logged step after {first:.1f} s; stopping")
        self.stop_launcher(run_id)
        return started, returned, playbook, first, run_id

    def stop_launcher(self, run_id: str) -> None:
        out = self.work / f"stop-{run_id}.log"
        argv = launcher_argv("stop", run_id)
        rc = run_logged(argv, out, 300, "launcher stop", env=self.env, cwd=self.repo)
        if rc != 0:
            raise BenchError(f"launcher stop {run_id} failed (rc={rc}):\n{out.read_text()[-2000:]}")
        self.launcher_runs.remove(run_id)

    def by_hand(self, run_id: str, tag: str) -> tuple[float, float]:
        """Start the launcher run's trainer again by hand: parallel ssh, setsid -f, env on the command line.

        Returns (started, first step) in seconds.
        """
        src = f"/var/lib/mift/runs/{run_id}"
        dst = f"/var/lib/mift/byhand-{run_id}"
        key = f"byhand-{run_id}"
        commands = {}
        for host in self.names:  # setup, not timed: the files a person would have copied before
            env_json = self.hosts.ssh(host, f"cat {src}/env.json")
            if env_json.returncode != 0:
                raise BenchError(f"{host}: {src}/env.json: {env_json.stderr.strip()}")
            env = json.loads(env_json.stdout)
            env.pop("MIFT_RUN_ID", None)
            env[BENCH_MARKER] = key  # so that the bench finds (and stops) exactly these processes
            prep = self.hosts.ssh(
                host, f"rm -rf {dst} && mkdir -p {dst} && cp {src}/train.yaml {src}/ds_config.json {dst}/"
            )
            if prep.returncode != 0:
                raise BenchError(f"{host}: copying the run files: {prep.stderr.strip()}")
            assigns = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())
            commands[host] = (
                f"cd {dst} && setsid -f env PATH={NODE_VENV}/bin:$PATH {assigns} "
                f"{NODE_VENV}/bin/llamafactory-cli train train.yaml >trainer.log 2>&1 </dev/null"
            )
        say(f"  by hand: {len(self.names)} x ssh HOST 'cd {dst} && setsid -f env ... llamafactory-cli train'")
        self.bench_keys.append(key)
        t0 = time.monotonic()
        with concurrent.futures.ThreadPoolExecutor(len(self.names)) as pool:
            results = list(pool.map(lambda h: self.hosts.ssh(h, commands[h], timeout=60), self.names))
        started = time.monotonic() - t0
        failed = {h: r.stderr.strip() for h, r in zip(self.names, results, strict=True) if r.returncode}
        if failed:
            raise BenchError(f"by hand: start failed: {failed}")
        say(f"  by hand: all {len(self.names)} ssh commands returned after {started:.1f} s")
        first = wait_first_step(
            self.hosts,
            self.names[0],
            f"{dst}/output/trainer_log.jsonl",
            f"{BENCH_MARKER}={key}",
            t0,
            self.args.step_timeout,
        )
        say(f"  by hand: first logged step after {first:.1f} s; stopping")
        left = self.hosts.kill_marked(self.names, f"{BENCH_MARKER}={key}")
        if left:
            raise BenchError(f"by hand: processes left after SIGKILL: {left}")
        self.bench_keys.remove(key)
        for host in self.names:
            self.hosts.ssh(host, f"rm -rf {dst}")
        return started, first

    def cleanup(self) -> None:
        """Stop whatever this bench started and is still running (after an error or Ctrl-C)."""
        for run_id in list(self.launcher_runs):
            say(f"  cleanup: launcher stop {run_id}")
            try:
                self.stop_launcher(run_id)
            except BenchError as err:
                say(f"  cleanup: {err}")
        for key in list(self.bench_keys):
            say(f"  cleanup: stopping the by-hand trainers {key}")
            left = self.hosts.kill_marked(self.names, f"{BENCH_MARKER}={key}")
            if left:
                say(f"  cleanup: still alive: {left}")


def provision(inventory: Path, work: Path, timeout: float) -> None:
    """Run provision.yml (test-double switches, the tiny model) on the inventory's hosts."""
    try:
        model = tiny_model()
    except AssertionError as err:
        raise BenchError(f"making the tiny model failed: {err}") from err
    argv = provision_argv(inventory, model)
    log = work / "provision.log"
    say(f"provisioning: ansible-playbook provision.yml -i {inventory} (log {log})")
    start = time.monotonic()
    env = {**os.environ, "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1"}
    rc = run_logged(argv, log, timeout, "provision.yml", cwd=REPO, env=env)
    recap = log.read_text(errors="replace").rsplit("PLAY RECAP", 1)[-1].strip()
    if rc != 0:
        raise BenchError(f"provision.yml failed (rc={rc}); see {log}:\n{recap[-2000:]}")
    say(f"provisioned in {time.monotonic() - start:.0f} s:\n{recap}")


def rig_inventory(rig_id: int, count: int) -> Path:
    """``rig up COUNT`` on instance ``rig_id`` (running hosts are kept); return its inventory."""
    say(f"rig {rig_id}: up {count}")
    rig = Rig(rig_id=rig_id, hosts=count)
    try:
        rig.up()
    except (AssertionError, subprocess.TimeoutExpired) as err:
        raise BenchError(f"rig {rig_id}: up {count} failed: {str(err)[-2000:]}") from err
    return rig.inventory


def measure(hosts: Hosts, args: argparse.Namespace, work: Path) -> list[tuple[Any, ...]]:
    rows = []
    repos = [("this", REPO)] + ([("compare", args.compare.resolve())] if args.compare else [])
    for n in args.hosts:
        names = hosts.names[:n]
        for i in range(args.repeat):
            for label, repo in repos:  # alternating: both see the same load
                tag = f"{n}h-{label}-{i + 1}"
                say(f"{n} hosts ({', '.join(names)}), {label} ({repo}), run {i + 1}/{args.repeat}")
                bench = Bench(hosts, names, work / tag, args, repo)
                try:
                    l_start, l_ret, l_play, l_first, run_id = bench.launcher(tag)
                    if args.until == "started":
                        h_start = h_first = float("nan")
                    else:
                        h_start, h_first = bench.by_hand(run_id, tag)
                finally:
                    bench.cleanup()
                rows.append((label, n, l_start, l_ret, l_play, l_first, h_start, h_first))
                say(
                    f"{n} hosts, {label}: launcher started {l_start:.1f} s (returned {l_ret:.1f} s, start "
                    f"playbook {l_play:.1f} s), first step {l_first:.1f} s | by hand started "
                    f"{h_start:.1f} s, first step {h_first:.1f} s"
                )
    return rows


def open_hosts(args: argparse.Namespace) -> Hosts:
    """The rig's hosts (brought up for the largest count) or those of ``-i``."""
    inventory = (args.inventory or rig_inventory(args.rig_id, max(args.hosts))).resolve()
    if not inventory.exists():
        raise BenchError(f"{inventory}: inventory not found")
    hosts = Hosts(inventory)
    if len(hosts.names) < max(args.hosts):
        raise BenchError(f"{inventory}: {len(hosts.names)} trainers, --hosts needs {max(args.hosts)}")
    return hosts


def run_bench(hosts: Hosts, args: argparse.Namespace, work: Path) -> list[tuple[Any, ...]]:
    """Provision if asked, check the hosts, measure every host count."""
    names = hosts.names[: max(args.hosts)]
    if args.provision:
        provision(hosts.inventory, work, args.provision_timeout)
    say(f"checking {', '.join(names)}: reachable, provisioned, no trainer running")
    hosts.check_ready(names)
    stray = hosts.trainer_procs(names)
    if stray:
        raise BenchError(f"trainer processes already running (the master port would clash): {stray}")
    return measure(hosts, args, work)


def print_table(rows: list[tuple[Any, ...]]) -> None:
    """Print the results as a Markdown table, then the median per checkout and host count."""
    header = (
        "launcher",
        "hosts",
        "launcher: started",
        "(`run` returned)",
        "(start playbook)",
        "launcher: first step",
        "by hand: started",
        "by hand: first step",
    )
    print("\n| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for label, n, ls, lr, lp, lf, hs, hf in rows:
        print(
            f"| {label} | {n} | {ls:.1f} s | {lr:.1f} s | {lp:.1f} s | {lf:.1f} s | {hs:.1f} s | {hf:.1f} s |"
        )
    print("\n| launcher | hosts | runs | median started | median `run` returned | median start playbook |")
    print("|---|---|---|---|---|---|")
    for label, n in dict.fromkeys((r[0], r[1]) for r in rows):
        mine = [r for r in rows if r[0] == label and r[1] == n]
        medians = [statistics.median(r[k] for r in mine) for k in (2, 3, 4)]
        print(f"| {label} | {n} | {len(mine)} | " + " | ".join(f"{m:.1f} s" for m in medians) + " |")


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--hosts", type=int, nargs="+", default=[2, 4], help="host counts (default 2 4)")
    parser.add_argument("--rig-id", type=int, default=8)
    parser.add_argument("--provision", action="store_true", help="run provision.yml on the hosts first")
    parser.add_argument("-i", "--inventory", type=Path, help="use these provisioned hosts instead of the rig")
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--down", action="store_true", help="rig down --purge at the end (rig hosts only)")
    parser.add_argument("--start-timeout", type=float, default=900, help="deadline of `run --detach`, s")
    parser.add_argument("--step-timeout", type=float, default=900, help="deadline of the first step, s")
    parser.add_argument("--provision-timeout", type=float, default=7200)
    parser.add_argument(
        "--until",
        choices=("first-step", "started"),
        default="first-step",
        help="started: stop each run once every trainer started (no first step, no by-hand run)",
    )
    parser.add_argument("--compare", type=Path, help="also time the launcher of this checkout (before/after)")
    args = parser.parse_args()
    if min(args.hosts) < 1:
        parser.error("--hosts: counts must be >= 1")
    work = Path(tempfile.mkdtemp(prefix="mift-launch-bench-"))
    say(f"work dir {work}")
    hosts: Hosts | None = None
    rc = 0
    try:
        hosts = open_hosts(args)
        print_table(run_bench(hosts, args, work))
    except (BenchError, KeyboardInterrupt) as err:
        say(f"error: {err}" if isinstance(err, BenchError) else "interrupted")
        rc = 1
    finally:
        if hosts is not None:
            rc = max(rc, final_check(hosts, hosts.names[: max(args.hosts)]))
        if args.down and args.inventory is None:
            subprocess.run(
                [str(RIG), "down", "--purge"],
                env={**os.environ, "RIG_ID": str(args.rig_id)},
                stdin=subprocess.DEVNULL,
                timeout=300,
                check=False,
            )
            say(f"rig {args.rig_id}: down --purge")
    say(f"logs: {work}")
    return rc


def final_check(hosts: Hosts, names: list[str]) -> int:
    """Say whether any trainer process is left on the hosts (0: none)."""
    try:
        left = hosts.trainer_procs(names)
    except BenchError as err:
        say(f"final check failed: {err}")
        return 1
    if left:
        say(f"error: trainer processes left: {json.dumps(left)}")
        return 1
    say(f"no trainer process left on {', '.join(names)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
