"""Issue #28's H200 point: a run killed at step k and recovered by the launcher, next to an uninterrupted one.

On the lent GPU machine (inventory/gpu-local: the launcher runs on the node it trains on), for the 8B LoRA
shape of bench/gpu/make_assets.py with the planner's strategy (``deepspeed: auto``):

1. the uninterrupted run: ``python -m launcher run JOB`` for STEPS steps, a checkpoint every SAVE steps;
2. the same job again; once the trainer logged step KILL_AT, its training rank gets SIGKILL (from outside, as
   a dead process would); the launcher's recovery policy (default, backoff 1 s) restarts it by itself from the
   last complete checkpoint;
3. the per-step losses of both runs side by side, the recovered run's attempts (from its record), the time the
   kill cost (wall of the recovered run minus the uninterrupted one's) and the checkpoint save times (the step
   intervals that hold a save, against the median step).

Usage (on the GPU machine, wheels installed as bench/gpu/run.sh does):
    python3 bench/gpu/recover.py ASSETS_DIR WORK_DIR [--steps 40] [--save 10] [--kill-at 15]
Prints ``RESULT {json}`` last. Not a test: a measurement whose numbers go to bench/gpu/results/.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "bench"))
from gpu_strategies import INVENTORY, RUN_LINE_RE, launcher_cmd, write_job  # noqa: E402

NODE_RUNS_ROOT = Path("/var/lib/mift/runs")  # the node agent's default runs root (launcher.merge)


def trainer_log(run_id: str) -> list[dict[str, Any]]:
    """The node's trainer_log.jsonl entries of ``run_id`` (every attempt appends), oldest first."""
    entries: list[dict[str, Any]] = []
    for path in sorted(NODE_RUNS_ROOT.glob(f"{run_id}/**/trainer_log.jsonl")):
        for line in path.read_text(errors="replace").splitlines():
            try:
                entry = json.loads(line)
            except ValueError:
                continue
            if isinstance(entry, dict) and "current_steps" in entry:
                entries.append(entry)
    return entries


def losses(entries: list[dict[str, Any]]) -> dict[int, float]:
    """Step -> loss, the last logged for a step (the resumed attempt's)."""
    return {
        int(e["current_steps"]): float(e["loss"]) for e in entries if isinstance(e.get("loss"), int | float)
    }


def trainer_pids(run_id: str) -> list[int]:
    """Training ranks of ``run_id`` (LLaMA-Factory's launcher.py under torchrun, with the agent's key)."""
    pgrep = ["pgrep", "-f", "llamafactory/launcher.py"]
    out = subprocess.run(pgrep, check=False, capture_output=True, text=True).stdout
    pids = []
    for pid in out.split():
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes()
        except OSError:
            continue
        if f"MIFT_AGENT_KEY={run_id}@".encode() in environ:
            pids.append(int(pid))
    return pids


def start(job: Path, runs: Path, log: Path) -> tuple[subprocess.Popen[str], Any]:
    env = {**os.environ, "MIFT_RUNS_DIR": str(runs)}
    fh = log.open("w")
    proc = subprocess.Popen(
        launcher_cmd(job, INVENTORY), cwd=REPO, env=env, stdout=fh, stderr=subprocess.STDOUT, text=True
    )
    return proc, fh


def run_id_of(log: Path, proc: subprocess.Popen[str], seconds: float = 600) -> tuple[str, Path]:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        found = RUN_LINE_RE.search(log.read_text(errors="replace"))
        if found:
            return found.group(1), Path(found.group(2))
        if proc.poll() is not None:
            raise SystemExit(
                f"recover: the launcher ended (rc={proc.returncode}) before its run existed:\n"
                + log.read_text()[-3000:]
            )
        time.sleep(0.2)
    raise SystemExit("recover: no run line from the launcher")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("assets", type=Path)
    parser.add_argument("work", type=Path)
    parser.add_argument("--shape", default="8b")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--save", type=int, default=10)
    parser.add_argument("--kill-at", type=int, default=15)
    args = parser.parse_args()
    results: dict[str, Any] = {"steps": args.steps, "save_steps": args.save, "kill_at": args.kill_at}
    runs = args.work / "runs"
    runs.mkdir(parents=True, exist_ok=True)
    jobs = {}
    for label in ("uninterrupted", "recovered"):
        job = write_job("auto", args.shape, args.assets, args.work / label, args.steps, 1800)
        train_path = job.parent / "train.yaml"
        train = yaml.safe_load(train_path.read_text())
        train.update(save_steps=args.save, seed=42)
        train_path.write_text(yaml.safe_dump(train, sort_keys=False))
        spec = yaml.safe_load(job.read_text())
        spec.update(name=f"recover-{label}", recovery={"backoff_s": 1})
        job.write_text(yaml.safe_dump(spec, sort_keys=False))
        jobs[label] = job

    runs_by_label: dict[str, dict[str, Any]] = {}
    for label, job in jobs.items():
        log = job.parent / "launcher.log"
        t0 = time.monotonic()
        proc, fh = start(job, runs, log)
        run_id, run_dir = run_id_of(log, proc)
        killed: dict[str, Any] = {}
        first_step_s: float | None = None
        while proc.poll() is None and (
            first_step_s is None or (label == "recovered" and "resumed_s" not in killed)
        ):
            entries = trainer_log(run_id)
            now = round(time.monotonic() - t0, 1)
            if entries and first_step_s is None:
                first_step_s = now
            if (
                label == "recovered"
                and not killed
                and entries
                and int(entries[-1]["current_steps"]) >= args.kill_at
            ):
                pids = trainer_pids(run_id)
                if pids:
                    os.kill(max(pids), 9)
                    killed = {
                        "at_step": int(entries[-1]["current_steps"]),
                        "pid": max(pids),
                        "at_s": now,
                        "entries": len(entries),
                    }
                    print(
                        f"[{now} s] SIGKILL to rank (pid {max(pids)}) after step {killed['at_step']}",
                        flush=True,
                    )
            elif killed and len(entries) > killed["entries"]:  # the resumed attempt's first logged step
                killed["resumed_s"] = now
                print(
                    f"[{now} s] first step of the resumed attempt logged: {entries[-1]['current_steps']}",
                    flush=True,
                )
            time.sleep(0.1)
        rc = proc.wait(timeout=1800)
        fh.close()
        wall = time.monotonic() - t0
        record = json.loads((run_dir / "record.json").read_text())
        entries = trainer_log(run_id)
        runs_by_label[label] = {
            "rc": rc,
            "status": record.get("status"),
            "wall_s": round(wall, 1),
            "deepspeed": record.get("deepspeed"),
            "attempts": [
                {
                    k: a.get(k)
                    for k in ("attempt", "state", "kind", "hosts", "resume_step", "started_at", "ended_at")
                }
                for a in record.get("attempts") or []
            ],
            "first_step_s": first_step_s,
            "killed": killed,
            "logged_steps": [int(e["current_steps"]) for e in entries],
            "losses": losses(entries),
            "launcher_tail": log.read_text(errors="replace")[-1500:],
        }
        print(
            f"{label}: rc {rc}, status {record.get('status')}, {wall:.1f} s, plan {record.get('deepspeed')}",
            flush=True,
        )
        for a in runs_by_label[label]["attempts"]:
            print(
                f"  attempt {a['attempt']}: {a['state']} kind={a['kind']} nodes={a['hosts']} "
                f"resume_step={a['resume_step']}",
                flush=True,
            )

    ref = runs_by_label["uninterrupted"]["losses"]
    rec = runs_by_label["recovered"]["losses"]
    attempts = runs_by_label["recovered"]["attempts"]
    resume = attempts[-1].get("resume_step") if attempts else None
    print("\nstep  uninterrupted  recovered  rel.diff")
    worst = 0.0
    for step in range(1, args.steps + 1):
        a, b = ref.get(step), rec.get(step)
        diff = abs(b - a) / abs(a) if a is not None and b is not None and a else None
        if diff is not None and isinstance(resume, int) and step > resume:
            worst = max(worst, diff)
        mark = "  <- resumed after this" if step == resume else ""
        print(
            f"{step:4d}  {'-' if a is None else f'{a:13.4f}'}  {'-' if b is None else f'{b:9.4f}'}  "
            f"{'-' if diff is None else f'{diff:.2e}'}{mark}"
        )
    results.update(
        runs=runs_by_label,
        resume_step=resume,
        max_rel_diff_after_resume=worst,
        kill_cost_s=round(runs_by_label["recovered"]["wall_s"] - runs_by_label["uninterrupted"]["wall_s"], 1),
    )
    print(
        f"\nresumed from step {resume}; max relative loss difference after the resume {worst:.2e}; "
        f"the kill cost {results['kill_cost_s']} s of wall time"
    )
    print("RESULT " + json.dumps(results, default=str))
    return 0 if runs_by_label["recovered"]["status"] == "succeeded" else 1


if __name__ == "__main__":
    sys.exit(main())
