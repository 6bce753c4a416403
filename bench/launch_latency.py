"""Launch latency: ``python -m launcher run`` versus the same commands started by hand over ssh.

For N test hosts (default 2 and 4, rig 8), it measures

* ``started``: from the command to every node's trainer process running
  (launcher: ``run --detach`` returned, which includes validation, preflight and the start playbook;
  by hand: every parallel ``ssh host 'setsid -f env ... llamafactory-cli train ...'`` returned);
* ``first step``: from the command to the first line of trainer_log.jsonl on the first node.

The by-hand variant reuses the files the launcher copied (train.yaml, ds_config.json) and the same
environment, so both start the same trainer; only the orchestration differs. Each run is stopped at its
first logged step.

    python bench/launch_latency.py --hosts 2 4 [--rig-id 8] [--provision] [--repeat 1]

``--provision`` brings the rig up and runs ``provision.yml`` on it first (slow: the node venv is installed on
every host); without it the hosts must already be provisioned (``-i`` an inventory instead of the rig).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
RIG = REPO / "tools" / "testhosts" / "rig"
JOB = REPO / "configs" / "jobs" / "tiny-lora-z3.yaml"
TEST_DOUBLE_VARS = {
    "rocm_repo_base_url": "http://controller:8080/amd",
    "rocm_manage_kernel": False,
    "host_tuning_apply": False,
    "pytorch_backend": "cpu",
}


def sh(argv: list[str], **kw: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, check=False, **kw)  # type: ignore[call-overload]


class Hosts:
    """The bench's nodes: addresses and ssh options from an inventory made by ``rig up``."""

    def __init__(self, inventory: Path) -> None:
        data = yaml.safe_load(inventory.read_text())
        group = data["all"]["children"]["trainers"]["hosts"]
        self.inventory = inventory
        self.names = list(group)
        self.addr = {h: group[h]["ansible_host"] for h in self.names}
        gvars = data["all"]["vars"]
        self.ssh_opts = [
            "-i",
            gvars["ansible_ssh_private_key_file"],
            *shlex.split(gvars["ansible_ssh_common_args"]),
            "-o",
            "BatchMode=yes",
        ]

    def ssh(self, host: str, command: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return sh(["ssh", *self.ssh_opts, f"root@{self.addr[host]}", command], timeout=timeout)


def wait_first_step(hosts: Hosts, log: str, t0: float, timeout: float = 900) -> float:
    master = hosts.names[0]
    while time.monotonic() - t0 < timeout:
        if hosts.ssh(master, f"test -s {shlex.quote(log)}").returncode == 0:
            return time.monotonic() - t0
        time.sleep(0.5)
    raise TimeoutError("no logged step")


def bench_launcher(hosts: Hosts, runs: Path, work: Path) -> tuple[float, float, str]:
    spec = yaml.safe_load(JOB.read_text())
    cfg = yaml.safe_load((REPO / "configs" / "train" / "tiny_cpu_lora_sft.yaml").read_text())
    cfg.update(max_steps=2000, save_steps=100000)
    train = work / "configs" / "train" / "bench.yaml"
    train.parent.mkdir(parents=True, exist_ok=True)
    if not (work / "configs" / "data").exists():
        (work / "configs" / "data").symlink_to(REPO / "configs" / "data")
    train.write_text(yaml.safe_dump(cfg))
    spec.update(
        name="bench", train_config=str(train), deepspeed=str(REPO / "configs" / "deepspeed" / "ds_z3.json")
    )
    job = work / "bench-job.yaml"
    job.write_text(yaml.safe_dump(spec))
    env = {**os.environ, "MIFT_RUNS_DIR": str(runs)}
    t0 = time.monotonic()
    out = sh(
        [sys.executable, "-m", "launcher", "run", str(job), "-i", str(hosts.inventory), "--detach"],
        env=env,
        cwd=REPO,
        timeout=900,
    )
    started = time.monotonic() - t0
    if out.returncode != 0:
        raise RuntimeError(out.stdout + out.stderr)
    run_id = next(line.split()[1].rstrip(":") for line in out.stdout.splitlines() if line.startswith("run "))
    first = wait_first_step(hosts, f"/var/lib/mift/runs/{run_id}/output/trainer_log.jsonl", t0)
    sh([sys.executable, "-m", "launcher", "stop", run_id], env=env, cwd=REPO, timeout=300)
    return started, first, run_id


def bench_by_hand(hosts: Hosts, run_id: str) -> tuple[float, float]:
    """Start the launcher run's trainer again by hand: parallel ssh, setsid -f, env on the command line."""
    src = f"/var/lib/mift/runs/{run_id}"
    dst = f"/var/lib/mift/byhand-{run_id}"
    for host in hosts.names:
        env = json.loads(hosts.ssh(host, f"cat {src}/env.json").stdout)
        env.pop("MIFT_RUN_ID", None)
        hosts.ssh(
            host,
            f"rm -rf {dst} && mkdir -p {dst} && cp {src}/train.yaml {src}/ds_config.json {dst}/ && "
            f"printf %s {shlex.quote(json.dumps(env))} > {dst}/env.json",
        )
    commands = {}
    for host in hosts.names:
        env = json.loads(hosts.ssh(host, f"cat {dst}/env.json").stdout)
        assigns = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())
        commands[host] = (
            f"cd {dst} && setsid -f env PATH=/opt/mift/venv/bin:$PATH {assigns} "
            "/opt/mift/venv/bin/llamafactory-cli train train.yaml >trainer.log 2>&1 </dev/null"
        )
    t0 = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(len(hosts.names)) as pool:
        results = list(pool.map(lambda h: hosts.ssh(h, commands[h]), hosts.names))
    started = time.monotonic() - t0
    if any(r.returncode for r in results):
        raise RuntimeError([r.stderr for r in results])
    first = wait_first_step(hosts, f"{dst}/output/trainer_log.jsonl", t0)
    for host in hosts.names:  # by hand, stopping is by hand too
        hosts.ssh(
            host,
            f"pkill -TERM -f 'llamafactory|torchrun' ; sleep 3; pkill -KILL -f 'llamafactory|torchrun'; "
            f"rm -rf {dst}",
        )
    return started, first


def provision(inventory: Path) -> None:
    model = REPO / ".cache" / "tiny-llama"
    if not (model / "config.json").exists():
        sh([sys.executable, str(REPO / "tools" / "make_tiny_model.py"), str(model)], check=True)
    extra = {**TEST_DOUBLE_VARS, "train_configs_model_src": str(model)}
    out = sh(
        [
            str(Path(sys.executable).parent / "ansible-playbook"),
            "provision.yml",
            "-i",
            str(inventory),
            "-e",
            json.dumps(extra),
        ],
        cwd=REPO,
        timeout=7200,
    )
    if out.returncode != 0:
        raise RuntimeError(out.stdout[-4000:])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--rig-id", type=int, default=8)
    parser.add_argument("--provision", action="store_true", help="rig up + provision.yml first")
    parser.add_argument("-i", "--inventory", type=Path, help="use these provisioned hosts instead of the rig")
    parser.add_argument("--repeat", type=int, default=1)
    args = parser.parse_args()
    rows = []
    env = {**os.environ, "RIG_ID": str(args.rig_id)}
    for n in args.hosts:
        if args.inventory:
            inventory = args.inventory
        else:
            up = sh([str(RIG), "up", str(n)], env=env, timeout=600)
            if up.returncode:
                raise RuntimeError(up.stderr)
            inventory = Path(sh([str(RIG), "inventory"], env=env).stdout.strip())
            if args.provision:
                provision(inventory)
        hosts = Hosts(inventory)
        for _ in range(args.repeat):
            with tempfile.TemporaryDirectory() as tmp:
                runs = Path(tmp) / "runs"
                runs.mkdir()
                l_start, l_first, run_id = bench_launcher(hosts, runs, Path(tmp))
                h_start, h_first = bench_by_hand(hosts, run_id)
            rows.append((len(hosts.names), l_start, l_first, h_start, h_first))
            print(
                f"{len(hosts.names)} hosts: launcher started {l_start:.1f} s first step {l_first:.1f} s | "
                f"by hand started {h_start:.1f} s first step {h_first:.1f} s",
                flush=True,
            )
    header = ("hosts", "launcher: started", "launcher: first step", "by hand: started", "by hand: first step")
    print("\n| " + " | ".join(header) + " |")
    print("|---|---|---|---|---|")
    for n, ls, lf, hs, hf in rows:
        print(f"| {n} | {ls:.1f} s | {lf:.1f} s | {hs:.1f} s | {hf:.1f} s |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
