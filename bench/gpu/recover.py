"""Issue #28's H200 point: a run killed at step k and recovered by the launcher, next to an uninterrupted one.

On the lent GPU machine (inventory/gpu-local: the launcher runs on the node it trains on), for the 8B LoRA
shape of bench/gpu/make_assets.py with the planner's strategy (``deepspeed: auto``):

1. the uninterrupted run: ``python -m launcher run JOB`` for STEPS steps, a checkpoint every SAVE steps;
2. the same job again; once the trainer logged step KILL_AT, its training rank gets SIGKILL (from outside, as
   a dead process would); the launcher's recovery policy (default, backoff 1 s) restarts it by itself from the
   last complete checkpoint;
3. the per-step losses of both runs side by side, with the seconds between one step's log entry and the
   previous one's (as this script saw them, polling every 0.1 s), the recovered run's attempts (from its
   record), the time the kill cost (wall of the recovered run minus the uninterrupted one's), the checkpoint
   saves (size; seconds from the saved step's log entry to the newest file of ``checkpoint-N``; the step
   interval that holds the save, against the median step) and the resume (the trainer log's lines about the
   checkpoint, with their time stamps; seconds from the kill to the first step of the resumed attempt).

Usage (on the GPU machine, wheels installed: bench/gpu/recover.sh):
    python3 bench/gpu/recover.py ASSETS_DIR WORK_DIR [--shape 8b] [--steps 40] [--save 10] [--kill-at 15]
Prints ``RESULT {json}`` last. Not a test: a measurement whose numbers go to bench/gpu/results/.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "bench"))
from gpu_strategies import INVENTORY, RUN_LINE_RE, launcher_cmd, write_job  # noqa: E402
from launcher.spec.nodelayout import layout  # noqa: E402 - gpu_strategies puts python/ on sys.path

TRAINER_MARK = "llamafactory/launcher.py"  # the script torchrun runs for each rank (LLaMA-Factory's launcher)
AGENT_KEY = "MIFT_AGENT_KEY"  # every process of a run carries MIFT_AGENT_KEY=<run_id>@<run_dir> (mift_agent)
# the trainer.log lines that tell when the resumed attempt loaded its checkpoint
RESUME_LINE_RE = re.compile(r"checkpoint|resum|skip", re.IGNORECASE)
POLL_S = 0.1


def node_run_dir(run_id: str) -> Path:
    """The node run directory of ``run_id`` (the controller is the node here)."""
    return Path(layout().run_dir(run_id))


def trainer_log(run_id: str) -> list[dict[str, Any]]:
    """The node's trainer_log.jsonl entries of ``run_id`` (every attempt appends), oldest first."""
    entries: list[dict[str, Any]] = []
    for path in sorted(node_run_dir(run_id).glob("**/trainer_log.jsonl")):
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


def trainer_pids(run_id: str, proc_root: Path = Path("/proc")) -> list[int]:
    """Training processes of ``run_id``: LLaMA-Factory's launcher.py under torchrun (torchrun's own command
    line names it too), with the agent's key in their environment. Read from /proc: no pgrep needed."""
    pids = []
    for entry in proc_root.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
            environ = (entry / "environ").read_bytes()
        except OSError:
            continue
        if TRAINER_MARK.encode() in cmdline and f"{AGENT_KEY}={run_id}@".encode() in environ:
            pids.append(int(entry.name))
    return sorted(pids)


def wait_gone(pid: int, seconds: float = 30.0) -> bool:
    """Wait until process ``pid`` is gone (reaped by its parent, or a zombie); True when it is."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            return True
        if state in ("Z", "X"):
            return True
        time.sleep(0.05)
    return False


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


def step_times(
    entries: list[dict[str, Any]], seen: list[tuple[float, float]]
) -> dict[int, tuple[float, float]]:
    """Step -> (seconds since the launcher started, wall time) at which its entry was first seen; the last
    attempt's where a step was logged twice (``seen`` is parallel to ``entries``; the trainer's closing entry,
    without a loss, is left out)."""
    return {int(e["current_steps"]): s for e, s in zip(entries, seen, strict=False) if "loss" in e}


def intervals(times: dict[int, tuple[float, float]]) -> dict[int, float]:
    """Step -> seconds since the previous step's entry was seen (steps with both seen)."""
    return {s: round(times[s][0] - times[s - 1][0], 2) for s in sorted(times) if s - 1 in times}


def checkpoint_saves(
    run_id: str, times: dict[int, tuple[float, float]], steps_dt: dict[int, float]
) -> list[dict[str, Any]]:
    """Every ``checkpoint-N`` of the run: its size, the seconds from step N's log entry (seen) to its newest
    file, and the interval of step N+1 (which holds the save) against the median interval without a save."""
    found = sorted(
        (int(p.name.rsplit("-", 1)[1]), p)
        for p in node_run_dir(run_id).glob("**/checkpoint-*")
        if p.is_dir() and p.name.rsplit("-", 1)[1].isdigit()
    )
    plain = [dt for s, dt in steps_dt.items() if not any(s - 1 == n for n, _ in found)]
    median = statistics.median(plain) if plain else None
    saves = []
    for step, path in found:
        files = [f for f in path.rglob("*") if f.is_file()]
        newest = max((f.stat().st_mtime for f in files), default=None)
        seen = times.get(step)
        after = steps_dt.get(step + 1)
        saves.append(
            {
                "step": step,
                "files": len(files),
                "mib": round(sum(f.stat().st_size for f in files) / 2**20, 1),
                "written_s": round(newest - seen[1], 2) if newest and seen else None,
                "next_step_dt_s": after,
                "over_median_s": round(after - median, 2) if after is not None and median else None,
            }
        )
    return saves


def resume_lines(run_id: str, limit: int = 40) -> list[str]:
    """The node trainer.log's lines about checkpoints and resuming (both attempts append to it)."""
    path = node_run_dir(run_id) / "trainer.log"
    if not path.exists():
        return []
    text = path.read_text(errors="replace").replace("\r", "\n")
    lines = [ln.strip() for ln in text.splitlines() if RESUME_LINE_RE.search(ln)]
    return lines[-limit:]


def follow(
    label: str, proc: subprocess.Popen[str], run_id: str, kill_at: int, t0: float
) -> tuple[dict[str, Any], list[tuple[float, float]]]:
    """Poll the run's trainer log until the launcher ends; in the ``recovered`` run, SIGKILL the training rank
    once step ``kill_at`` is logged. Return what the kill did and when each entry was first seen."""
    killed: dict[str, Any] = {}
    seen: list[tuple[float, float]] = []
    while proc.poll() is None:
        entries = trainer_log(run_id)
        now = round(time.monotonic() - t0, 2)
        seen.extend((now, time.time()) for _ in range(len(entries) - len(seen)))
        step = int(entries[-1]["current_steps"]) if entries else 0
        if label == "recovered" and not killed and step >= kill_at:
            pids = trainer_pids(run_id)
            if pids:
                rank = max(pids)  # torchrun's worker, started after torchrun
                os.kill(rank, signal.SIGKILL)
                gone = wait_gone(rank)
                # the rank's writer thread is dead: every entry of the first attempt is on disk now
                after = trainer_log(run_id)
                seen.extend((now, time.time()) for _ in range(len(after) - len(seen)))
                killed = {"at_step": step, "pid": rank, "at_s": now, "gone": gone, "entries": len(after)}
                last = after[-1]["current_steps"] if after else "-"
                print(
                    f"[{now} s] SIGKILL to rank (pid {rank}) after step {step} (last logged {last})",
                    flush=True,
                )
        elif killed and "resumed_s" not in killed and len(entries) > killed["entries"]:
            killed["resumed_s"] = seen[killed["entries"]][0]
            killed["resumed_step"] = int(entries[killed["entries"]]["current_steps"])
            print(
                f"[{killed['resumed_s']} s] first step of the resumed attempt logged: "
                f"{killed['resumed_step']} ({killed['resumed_s'] - killed['at_s']:.1f} s after the kill)",
                flush=True,
            )
        time.sleep(POLL_S)
    return killed, seen


def run_one(label: str, job: Path, runs: Path, kill_at: int) -> dict[str, Any]:
    """Run one job through the launcher and read its record and the node's trainer log."""
    log = job.parent / "launcher.log"
    t0 = time.monotonic()
    proc, fh = start(job, runs, log)
    run_id, run_dir = run_id_of(log, proc)
    killed, seen = follow(label, proc, run_id, kill_at, t0)
    rc = proc.wait()
    fh.close()
    wall = time.monotonic() - t0
    record = json.loads((run_dir / "record.json").read_text())
    entries = trainer_log(run_id)
    seen.extend((round(wall, 2), time.time()) for _ in range(len(entries) - len(seen)))  # logged at the end
    times = step_times(entries, seen)
    steps_dt = intervals(times)
    node_log = node_run_dir(run_id) / "trainer.log"
    if node_log.exists():  # recover.sh brings it back
        shutil.copyfile(node_log, job.parent / "trainer.log")
    result = {
        "run_id": run_id,
        "rc": rc,
        "status": record.get("status"),
        "wall_s": round(wall, 1),
        "deepspeed": record.get("deepspeed"),
        "attempts": [
            {
                k: a.get(k)
                for k in (
                    "attempt",
                    "state",
                    "kind",
                    "hosts",
                    "resume_step",
                    "started_at",
                    "ended_at",
                    "reason",
                    "decision",
                )
            }
            for a in record.get("attempts") or []
        ],
        "first_step_s": seen[0][0] if seen else None,
        "killed": killed,
        "logged_steps": [int(e["current_steps"]) for e in entries],
        "losses": losses(entries),
        "step_dt_s": steps_dt,
        "saves": checkpoint_saves(run_id, times, steps_dt),
        "resume_lines": resume_lines(run_id) if killed else [],
        "launcher_tail": log.read_text(errors="replace")[-1500:],
    }
    print(
        f"{label}: rc {rc}, status {record.get('status')}, {wall:.1f} s, plan {record.get('deepspeed')}, "
        f"first step logged at {result['first_step_s']} s",
        flush=True,
    )
    for a in result["attempts"]:
        took = (
            f", {a['ended_at'] - a['started_at']:.1f} s"
            if isinstance(a["ended_at"], int | float) and isinstance(a["started_at"], int | float)
            else ""
        )
        print(
            f"  attempt {a['attempt']}: {a['state']} kind={a['kind']} nodes={a['hosts']} "
            f"resume_step={a['resume_step']}{took}"
            + (f"\n    reason: {a['reason']}" if a["reason"] else "")
            + (f"\n    decision: {a['decision']}" if a["decision"] else ""),
            flush=True,
        )
    for s in result["saves"]:
        print(
            f"  checkpoint-{s['step']}: {s['files']} files, {s['mib']} MiB, newest file {s['written_s']} s "
            f"after step {s['step']} was logged; step {s['step'] + 1} took {s['next_step_dt_s']} s "
            f"({s['over_median_s']} s over the median step)",
            flush=True,
        )
    for line in result["resume_lines"]:
        print(f"  trainer.log: {line[:300]}", flush=True)
    return result


def report(steps: int, runs: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Print both runs' losses and step intervals side by side; return the comparison's numbers."""
    ref, rec = runs["uninterrupted"], runs["recovered"]
    attempts = rec["attempts"]
    resume = attempts[-1].get("resume_step") if attempts else None
    print("\nstep  uninterrupted  recovered  rel.diff  dt unint.  dt recov.")
    worst = 0.0
    compared = 0
    for step in range(1, steps + 1):
        a, b = ref["losses"].get(step), rec["losses"].get(step)
        diff = abs(b - a) / abs(a) if a is not None and b is not None and a else None
        if diff is not None and isinstance(resume, int) and step > resume:
            worst = max(worst, diff)
            compared += 1
        mark = "  <- resumed after this" if step == resume else ""
        da, db = ref["step_dt_s"].get(step), rec["step_dt_s"].get(step)
        print(
            f"{step:4d}  {'-' if a is None else f'{a:13.4f}'}  {'-' if b is None else f'{b:9.4f}'}  "
            f"{'-' if diff is None else f'{diff:8.2e}'}  {'-' if da is None else f'{da:9.2f}'}  "
            f"{'-' if db is None else f'{db:9.2f}'}{mark}"
        )
    kill_cost = round(rec["wall_s"] - ref["wall_s"], 1)
    print(
        f"\nresumed from step {resume}; max relative loss difference after the resume {worst:.2e} over "
        f"{compared} steps ({'within' if compared and worst <= 0.01 else 'NOT within'} 1%); the kill cost "
        f"{kill_cost} s of wall time"
    )
    return {
        "resume_step": resume,
        "compared_steps": compared,
        "max_rel_diff_after_resume": worst,
        "kill_cost_s": kill_cost,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("assets", type=Path)
    parser.add_argument("work", type=Path)
    parser.add_argument("--shape", default="8b")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--save", type=int, default=10)
    parser.add_argument("--kill-at", type=int, default=15)
    args = parser.parse_args()
    if not args.save <= args.kill_at < args.steps:
        parser.error("--kill-at must be at least --save (a checkpoint to resume from) and below --steps")
    results: dict[str, Any] = {
        "shape": args.shape,
        "steps": args.steps,
        "save_steps": args.save,
        "kill_at": args.kill_at,
    }
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

    runs_by_label = {label: run_one(label, job, runs, args.kill_at) for label, job in jobs.items()}
    results.update(runs=runs_by_label, **report(args.steps, runs_by_label))
    print("RESULT " + json.dumps(results, default=str))
    return 0 if runs_by_label["recovered"]["status"] == "succeeded" else 1


if __name__ == "__main__":
    sys.exit(main())
