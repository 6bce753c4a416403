"""The planner's whole training plan against a measured grid, every run through ``python -m launcher run``.

For one bench shape (bench/gpu/make_assets.py) at a global batch of ``--global-batch`` sequences x 1024 tokens
(the YAML as written: micro-batch 2 x accumulation 8, gradient checkpointing on), runs one job spec per
configuration with ``inventory/gpu-local`` and prints, next to the planner's prediction for the same
configuration: steady-state tokens/s (optimizer steps 2..N, timed by bench/gpu/memhook), LLaMA-Factory's
``effective_tokens_per_sec`` (all steps), MFU against the bf16 peak measured in the same session, and the
highest ``nvidia-smi memory.used`` next to the memory estimate.

Configurations (positional): ``auto`` (job spec ``plan: auto`` with ``deepspeed: auto``: the planner picks
strategy and split; the record's ``plan`` says what it chose), or ``STRATEGY:MBxACC:ck|nock`` (job spec
``plan: as_written``, the training YAML written with that split, ``deepspeed`` the planner's JSON for the
strategy or ``none``), e.g. ``none:2x8:ck`` (the YAML's own split) or ``zero2:8x2:nock``.

Usage (on the GPU machine): bench/gpu/run.sh is for gpu_strategies.py; this one runs as
``bash bench/gpu/run_grid.sh SHAPE CONFIG ... --steps N --deadline-s S``. ``--dry-run`` writes and validates
the job specs and prints the plan without a GPU.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "python"))
sys.path.insert(0, str(REPO / "bench"))
sys.path.insert(0, str(REPO / "bench" / "gpu"))

from gpu_strategies import TRAIN, dry_assets, host_mem_gib, run_launcher, smi  # noqa: E402
from launcher.planning.dsconfig import deepspeed_config  # noqa: E402
from launcher.planning.hardware import H200, NODE_PRESETS  # noqa: E402
from launcher.planning.memory import Cluster, Strategy, Workload  # noqa: E402
from launcher.planning.model import load_shape  # noqa: E402
from launcher.planning.speed import model_flops_per_token  # noqa: E402
from launcher.planning.training import Candidate, Split, TrainingPlan  # noqa: E402
from launcher.planning.training_yaml import plan_training_from_yaml  # noqa: E402

MEMHOOK = REPO / "bench" / "gpu" / "memhook"
PEAK_CODE = (
    "import torch,time\n"
    "a=torch.randn(8192,8192,device='cuda',dtype=torch.bfloat16);b=torch.randn_like(a)\n"
    "for _ in range(3): a@b\n"
    "torch.cuda.synchronize();t=time.time()\n"
    "for _ in range(20): a@b\n"
    "torch.cuda.synchronize();print(20*2*8192**3/(time.time()-t)/1e12)\n"
)


PLANNED = ("auto", "probe", "planprobe")  # configs the planner picks (job spec plan: auto / probe; the CLI)


def parse_config(text: str) -> tuple[Strategy, Split] | None:
    """Return the strategy and split of ``STRATEGY:MBxACC:ck|nock[:liger]`` (None for a planned config)."""
    if text.removesuffix(":liger") in PLANNED:
        return None
    strategy, split, ck = text.removesuffix(":liger").split(":")
    micro, accumulation = (int(x) for x in split.split("x"))
    if ck not in ("ck", "nock"):
        raise SystemExit(f"{text}: expected ck or nock after the split")
    return Strategy(strategy), Split(micro, accumulation, ck == "ck", text.endswith(":liger"))


def safe(text: str) -> str:
    """Return a config name usable in file and job names."""
    return text.replace(":", "_")


def write_job(
    config: str,
    shape: str,
    assets: Path,
    jdir: Path,
    steps: int,
    job_s: float,
    port: int,
    base: dict[str, Any],
) -> Path:
    """Write one job spec, its training YAML and (explicit DeepSpeed strategies) the planner's JSON."""
    jdir.mkdir(parents=True, exist_ok=True)
    (jdir / "memhook").mkdir(exist_ok=True)
    parsed = parse_config(config)
    train = {**base, "model_name_or_path": str(assets / "model"), "dataset_dir": str(assets / "data")}
    train["max_steps"] = steps
    job: dict[str, Any] = {"name": f"grid-{shape}-{safe(config)}", "train_config": "train.yaml"}
    if parsed is None:
        planned = config.removesuffix(":liger")
        job.update(plan="auto" if planned == "auto" else "probe", deepspeed="auto")
        if config.endswith(":liger"):
            job["plan_liger"] = True  # the plan may switch liger on (the YAML leaves it off)
    else:
        strategy, split = parsed
        if split.liger:
            train["enable_liger_kernel"] = True
        train.update(
            per_device_train_batch_size=split.micro_batch,
            gradient_accumulation_steps=split.accumulation,
            disable_gradient_checkpointing=not split.checkpointing,
        )
        ds = deepspeed_config(strategy)
        if ds is not None:
            (jdir / "ds.json").write_text(json.dumps(ds, indent=1) + "\n")
        job.update(plan="as_written", deepspeed="ds.json" if ds is not None else "none")
    (jdir / "train.yaml").write_text(yaml.safe_dump(train, sort_keys=False))
    job.update(
        poll_interval_s=1,
        master_port=port,
        env={
            "PYTHONPATH": f"/tmp/site:{MEMHOOK}",
            "MIFT_MEMHOOK_DIR": str(jdir / "memhook"),
            "MIFT_STEP_TIMES": "1",
        },
        timeouts={"start_s": 300, "job_s": max(30, int(job_s))},
    )
    path = jdir / "job.yaml"
    path.write_text(yaml.safe_dump(job, sort_keys=False))
    return path


def candidate_of(plan: TrainingPlan, strategy: Strategy, split: Split) -> Candidate | None:
    """Return the planner's candidate for one strategy and split (None: not a split of the global batch)."""
    return next((c for c in plan.candidates if c.strategy is strategy and c.split == split), None)


def hook_numbers(jdir: Path) -> dict[str, Any]:
    """Return the trainer process's torch peaks and its steady-state step time (steps 2..N)."""
    found = [json.loads(p.read_text()) for p in (jdir / "memhook").glob("*.json")]
    worker = max(found, key=lambda d: d.get("allocated", 0), default={})
    step_files = [[float(x) for x in p.read_text().split()] for p in (jdir / "memhook").glob("*.steps")]
    times = max(step_files, key=len, default=[])
    steady = (times[-1] - times[0]) / (len(times) - 1) if len(times) >= 3 else None
    return {
        "torch_alloc_mib": round(worker.get("allocated", 0) / 2**20) or None,
        "torch_reserved_mib": round(worker.get("reserved", 0) / 2**20) or None,
        "hook_steps": len(times),
        "steady_step_s": round(steady, 4) if steady else None,
    }


def measure_peak_tflops() -> float:
    """Return the bf16 matmul TFLOP/s this GPU reaches now (8192^3, mean of 20 after 3 warm-ups)."""
    r = subprocess.run([sys.executable, "-c", PEAK_CODE], capture_output=True, text=True, check=True)
    return float(r.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("shape", choices=("tiny", "3b", "8b"))
    ap.add_argument("configs", nargs="+")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--global-batch", type=int, default=16)
    ap.add_argument("--work", type=Path, default=Path("/tmp/mift-grid"))
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "/tmp/mift-grid/out")))
    ap.add_argument("--deadline-s", type=float, default=540.0, help="start no run after this")
    ap.add_argument("--run-timeout-s", type=float, default=200.0)
    ap.add_argument("--dry-run", action="store_true")
    args = ap.parse_args()
    t_start = time.time()
    args.out.mkdir(parents=True, exist_ok=True)
    assets = args.work / f"assets-{args.shape}"
    base = {**TRAIN, "per_device_train_batch_size": 2, "gradient_accumulation_steps": args.global_batch // 2}
    if args.dry_run:
        dry_assets(assets, args.shape)
        gpu, gpu_mem, peak = "(dry run)", NODE_PRESETS["h200"].gpu_mem_gib, H200.peak_bf16_tflops
    else:
        if not (assets / "model" / "config.json").exists():
            t0 = time.time()
            subprocess.run(
                [sys.executable, str(REPO / "bench/gpu/make_assets.py"), str(assets), args.shape, "128"],
                check=True,
            )
            print(f"assets {args.shape}: {time.time() - t0:.0f}s", flush=True)
        gpu = smi("name,memory.total,driver_version")
        gpu_mem = float(gpu.split(",")[1]) / 1024
        peak = measure_peak_tflops()
    cluster = Cluster(nodes=1, gpus_per_node=1, gpu_mem_gib=gpu_mem, host_mem_gib=host_mem_gib())
    shape = load_shape(assets / "model")
    plan = plan_training_from_yaml(shape, base, cluster, accelerator=H200, liger=True)
    tokens_per_step = args.global_batch * int(base["cutoff_len"])
    print(
        f"shape {args.shape} ({shape.total_params() / 1e9:.2f} B params), global batch {args.global_batch} x "
        f"{base['cutoff_len']}; GPU {gpu}; measured bf16 peak {peak:.0f} TFLOP/s\nplanner: {plan.reason()}",
        flush=True,
    )
    rows: list[dict[str, Any]] = []
    for index, config in enumerate(args.configs):
        jdir = args.work / f"grid-{args.shape}" / safe(config)
        left = args.deadline_s - (time.time() - t_start)
        job = write_job(config, args.shape, assets, jdir, args.steps, left - 20, 29500 + index, base)
        if args.dry_run:
            check = subprocess.run(
                [sys.executable, "-m", "launcher", "validate", str(job)],
                cwd=REPO,
                capture_output=True,
                text=True,
                check=False,
                env={**os.environ, "PYTHONPATH": str(REPO / "python")},
            )
            print(f"== {config}: validate rc {check.returncode}", flush=True)
            continue
        if left < 70:
            print(f"== {config}: NOT RUN ({left:.0f}s left before the deadline)", flush=True)
            rows.append({"config": config, "not_run": True})
            continue
        if config.startswith("planprobe"):
            rows.append(plan_probe_cli(job, jdir, gpu_mem, min(args.run_timeout_s, left - 10)))
            continue
        row = run_launcher(config, job, jdir / "runs", args.steps, min(args.run_timeout_s, left - 10))
        row.update(hook_numbers(jdir))
        row["config"] = config
        record = {}
        if row.get("run_id"):
            record = json.loads((jdir / "runs" / row["run_id"] / "record.json").read_text())
        row["plan_record"] = record.get("plan")
        row["probe_s"] = probe_seconds(record)
        row["probe_phases"] = probe_phases(jdir / "runs", record.get("plan"))
        parsed = parse_config(config)
        if parsed is None and record.get("plan", {}).get("choice"):
            ch = record["plan"]["choice"]
            parsed = (
                Strategy(ch["strategy"]),
                Split(
                    ch["micro_batch"],
                    ch["gradient_accumulation_steps"],
                    ch["gradient_checkpointing"],
                    bool(ch.get("liger")),
                ),
            )
        cand = candidate_of(plan, *parsed) if parsed else None
        row["ran"] = (
            f"{parsed[0].value} mb{parsed[1].micro_batch}x{parsed[1].accumulation} "
            f"{'ck' if parsed[1].checkpointing else 'nock'}{' liger' if parsed[1].liger else ''}"
            if parsed
            else "-"
        )
        row["est_gpu_mib"] = round(cand.estimate.gpu_total / 2**20) if cand else None
        row["pred_tokens_per_s"] = round(cand.tokens_per_s) if cand else None
        row["planner_fits"] = cand.fits if cand else None
        if row["steady_step_s"]:
            row["steady_tokens_per_s"] = round(tokens_per_step / row["steady_step_s"])
            flops = model_flops_per_token(_workload(plan, parsed))
            row["mfu"] = round(row["steady_tokens_per_s"] * flops / (peak * 1e12), 4) if parsed else None
        rows.append(row)
        brief = {
            k: v for k, v in row.items() if not k.endswith("_tail") and k not in ("summary", "plan_record")
        }
        print(f"== {args.shape} {config}: {json.dumps(brief)}", flush=True)
        if row["rc"] != 0:
            print(row["launcher_out_tail"][-1200:], "\n--- trainer ---\n", row["trainer_log_tail"][-1500:])
    if args.dry_run:
        return
    text = report(args, plan, rows, peak, gpu, shape.total_params())
    print(text, flush=True)
    stem = args.out / f"plan_grid_{args.shape}"
    stem.with_suffix(".md").write_text(text + "\n")
    plan_json = plan.as_json()
    stem.with_suffix(".json").write_text(
        json.dumps(
            {"shape": args.shape, "gpu": gpu, "peak_tflops": peak, "plan": plan_json, "runs": rows}, indent=1
        )
    )


def probe_seconds(record: dict[str, Any]) -> float | None:
    """Return the seconds a run spent probing (its timeline's ``probing`` entry to the next one)."""
    timeline = record.get("timeline") or []
    for i, entry in enumerate(timeline[:-1]):
        if entry.get("status") == "probing":
            return round(float(timeline[i + 1]["t"]) - float(entry["t"]), 1)
    return None


def plan_probe_cli(job: Path, jdir: Path, gpu_mem: float, timeout: float) -> dict[str, Any]:
    """Run ``python -m launcher plan JOB --probe`` (H200 preset, this GPU's memory); time it, keep output."""
    cmd = [
        sys.executable, "-m", "launcher", "plan", str(job), "--probe", "--json", "--hardware", "h200",
        "--gpu-mem-gib", f"{gpu_mem:.1f}", "-i", str(REPO / "inventory" / "gpu-local"),
    ]  # fmt: skip
    env = {**os.environ, "MIFT_RUNS_DIR": str(jdir / "runs")}
    t0 = time.time()
    proc = subprocess.run(
        cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )
    wall = time.time() - t0
    (jdir / "plan_probe.json").write_text(proc.stdout)
    (jdir / "plan_probe.err").write_text(proc.stderr)
    try:
        probe = json.loads(proc.stdout)["training_plan"]["probe"]
    except (ValueError, KeyError, TypeError):
        probe = None
    pick = (probe or {}).get("pick") or {}
    ran = (
        f"{pick['strategy']} mb{pick['micro_batch']}x{pick['gradient_accumulation_steps']} "
        f"{'ck' if pick['gradient_checkpointing'] else 'nock'}"
        if pick
        else "-"
    )
    print(f"== planprobe: rc {proc.returncode}, {wall:.0f} s, pick {ran}\n{proc.stderr[-3000:]}", flush=True)
    if probe:
        print(json.dumps(probe["runs"], indent=1), flush=True)
    phases = probe_phases(jdir / "runs", {"probe": probe} if probe else None)
    return {
        "config": "planprobe",
        "rc": proc.returncode,
        "wall_s": wall,
        "pick": ran,
        "probe": probe,
        "probe_phases": phases,
    }


def probe_phases(runs: Path, plan_record: dict[str, Any] | None) -> list[dict[str, Any]]:
    """Print and return where each probe run's wall time went, from its record's timeline and metrics.

    preflight = created -> starting (0 when it reused the first one's), start = starting -> running,
    trainer = running -> the end status; of that, ``steps_s`` is the trainer's own seconds from its first
    to its last step (LLaMA-Factory's tokens / throughput) and the rest is start-up, saving and collect.
    """
    out: list[dict[str, Any]] = []
    for run in ((plan_record or {}).get("probe") or {}).get("runs") or []:
        rdir = runs / str(run.get("note", ""))
        try:
            timeline = json.loads((rdir / "record.json").read_text())["timeline"]
        except (OSError, ValueError, KeyError):
            continue
        at = {e["status"]: float(e["t"]) for e in timeline}
        end = float(timeline[-1]["t"])
        seconds = []
        for line in (
            (rdir / "metrics.jsonl").read_text().splitlines() if (rdir / "metrics.jsonl").exists() else []
        ):
            entry = json.loads(line)
            if entry.get("throughput") and entry.get("total_tokens"):
                seconds.append(entry["total_tokens"] / entry["throughput"])
        phase = {
            "run": rdir.name,
            "wall_s": run.get("wall_s"),
            "preflight_s": round(at.get("starting", end) - at.get("created", end), 1),
            "start_s": round(at.get("running", end) - at.get("starting", end), 1),
            "trainer_s": round(end - at.get("running", end), 1),
            "steps_s": round(seconds[-1] - seconds[0], 1) if len(seconds) >= 2 else None,
        }
        print(f"probe phases: {json.dumps(phase)}", flush=True)
        out.append(phase)
    return out


def _workload(plan: TrainingPlan, parsed: tuple[Strategy, Split] | None) -> Workload:

    split = parsed[1] if parsed else plan.as_written
    return replace(plan.workload, micro_batch=split.micro_batch, gradient_checkpointing=split.checkpointing)


def report(
    args: argparse.Namespace,
    plan: TrainingPlan,
    rows: list[dict[str, Any]],
    peak: float,
    gpu: str,
    params: int,
) -> str:
    """Return the table and the checks against issue #16's targets."""
    head = (
        "| config | ran | planner fits | est GPU MiB | peak nvidia-smi MiB | est/measured | "
        "predicted tokens/s | steady tokens/s | MFU | effective tokens/s (all steps) | status |"
    )
    lines = [head, "|" + "---|" * 11]
    done = [r for r in rows if r.get("steady_tokens_per_s") and r.get("status") == "succeeded"]
    for r in rows:
        if r.get("not_run"):
            lines.append(f"| {r['config']} | NOT RUN (deadline) |" + " |" * 9)
            continue
        est, peak_mib = r.get("est_gpu_mib"), r.get("peak_smi_mib")
        ratio = f"{est / peak_mib:.2f}" if est and peak_mib else "-"
        if r["config"].startswith("planprobe"):
            lines.append(
                f"| launcher plan --probe | {r['pick']} | wall {r['wall_s']:.0f} s, rc {r['rc']} |" + " |" * 8
            )
            continue
        label = {
            "auto": "auto (plan: auto)",
            "probe": f"probe (plan: probe, probe {r.get('probe_s')} s)",
            "probe:liger": f"probe (plan: probe, plan_liger, probe {r.get('probe_s')} s)",
            "auto:liger": "auto (plan: auto, plan_liger)",
        }.get(r["config"], r["config"])
        eff = r.get("tokens_per_s")
        cells = [
            label,
            r["ran"],
            {True: "yes", False: "no", None: "-"}[r.get("planner_fits")],
            str(est or "-"),
            str(peak_mib or "-"),
            ratio,
            str(r.get("pred_tokens_per_s") or "-"),
            str(r.get("steady_tokens_per_s") or "-"),
            f"{r['mfu']:.1%}" if r.get("mfu") else "-",
            str(round(eff)) if eff else "-",
            f"{r.get('status')} rc {r['rc']}{' OOM' if r.get('oom') else ''}",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    by = {r["config"]: r for r in done}
    checks = []
    best = max(done, key=lambda r: r["steady_tokens_per_s"], default=None)
    yaml_split = by.get("none:2x8:ck")
    # the two targets, for the probe's pick and for the automatic plan (labels as printed before)
    for row, name, split_name in (
        (by.get("probe"), "plan: probe (-> {ran})", "plan: probe vs the YAML's split"),
        (
            by.get("probe:liger"),
            "plan: probe, plan_liger (-> {ran})",
            "plan: probe, plan_liger vs the YAML's split",
        ),
        (by.get("auto"), "plan (auto -> {ran})", "plan vs the YAML's split (none:2x8:ck)"),
        (by.get("auto:liger"), "plan (auto, plan_liger -> {ran})", "plan, plan_liger vs the YAML's split"),
    ):
        if row and best:
            share = row["steady_tokens_per_s"] / best["steady_tokens_per_s"]
            checks.append(
                f"{name.format(ran=row['ran'])} vs best measured ({best['config']}): {share:.0%} "
                f"({'meets' if share >= 0.9 else 'MISSES'} >= 90%)"
            )
        if row and yaml_split:
            x = row["steady_tokens_per_s"] / yaml_split["steady_tokens_per_s"]
            checks.append(f"{split_name}: {x:.2f}x ({'meets' if x >= 2 else 'MISSES'} >= 2x)")
    ratios = [
        r["est_gpu_mib"] / r["peak_smi_mib"] for r in done if r.get("est_gpu_mib") and r.get("peak_smi_mib")
    ]
    if ratios:
        ok = all(0.85 <= x <= 1.15 for x in ratios)
        checks.append(
            f"estimate / measured peak: {min(ratios):.2f}-{max(ratios):.2f} "
            f"({'all within' if ok else 'NOT all within'} +-15%)"
        )
    ooms = [r["config"] for r in rows if r.get("oom")]
    checks.append(f"OOM: {', '.join(ooms) if ooms else 'none'}")
    return (
        f"shape {args.shape} ({params / 1e9:.2f} B params), LoRA r8 all, global batch {args.global_batch} x "
        f"1024 tokens, {args.steps} optimizer steps per run, through `python -m launcher run JOB -i "
        f"inventory/gpu-local`\nGPU: {gpu}; measured bf16 peak {peak:.0f} TFLOP/s (MFU below is against it)\n"
        f"planner: {plan.reason()}\n\n" + "\n".join(lines) + "\n\n" + "\n".join(checks)
    )


if __name__ == "__main__":
    main()
