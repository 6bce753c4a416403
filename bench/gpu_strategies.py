"""Run every training strategy side by side on this GPU machine and compare with the planner.

For a random-init model of a given shape (made offline by bench/gpu/make_assets.py), runs LLaMA-Factory LoRA
SFT once per strategy (no DeepSpeed, ZeRO-2, ZeRO-3, ZeRO-3 + optimizer offload, ZeRO-3 + optimizer + param
offload), samples nvidia-smi memory, reads LLaMA-Factory's train metrics and the torch peak of every process
(bench/gpu/memhook), and prints tokens/s, step time, peak GPU memory and start-up time next to the planner's
estimate and choice. The DeepSpeed JSONs are the planner's own (launcher.planning.dsconfig); the
``deepspeed: auto`` choice comes from launcher.planning.training_yaml.choose_deepspeed_config.

Two ways to start each run:

* default: LLaMA-Factory directly (``llamafactory-cli train``, FORCE_TORCHRUN=1 for DeepSpeed);
* ``--launcher``: through the job engine, ``python -m launcher run JOB -i inventory/gpu-local``, with a job
  spec written per strategy: ``deepspeed: auto`` (the planner's pick, strategy name ``auto``), ``deepspeed:
  none``, or the planner's JSON for an explicit strategy (launcher.planning.dsconfig). Tokens/s and
  train_runtime come from the run directory (``nodes/<host>/train_results.json``, ``metrics.jsonl``), the
  trainer's wall time from the node agent's ``state.json``, the pick from ``record.json``. ``--dry-run``
  writes the job specs, validates them (``python -m launcher validate``) and prints the plan and the commands
  without a GPU.

Usage (on the GPU machine, after the wheels are installed): bench/gpu/run.sh SHAPE [STRATEGY ...] [--launcher]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "python"))

from launcher.planning.dsconfig import deepspeed_config  # noqa: E402
from launcher.planning.hardware import NODE_PRESETS  # noqa: E402
from launcher.planning.memory import Cluster, Strategy  # noqa: E402
from launcher.planning.model import load_shape  # noqa: E402
from launcher.planning.training_yaml import choose_deepspeed_config, plan_as_written  # noqa: E402

sys.path.insert(0, str(REPO / "bench" / "gpu"))
from make_assets import SHAPES  # noqa: E402

INVENTORY = REPO / "inventory" / "gpu-local"
RUN_LINE_RE = re.compile(r"^run (\S+): (\S+)$", re.MULTILINE)

MIB = 1024**2
TRAIN = {
    "stage": "sft",
    "do_train": True,
    "finetuning_type": "lora",
    "lora_rank": 8,
    "lora_target": "all",
    "dataset": "synth",
    "template": "default",
    "cutoff_len": 1024,
    "overwrite_cache": True,
    "preprocessing_num_workers": 4,
    "logging_steps": 1,
    "save_steps": 100000,
    "overwrite_output_dir": True,
    "report_to": "none",
    "per_device_train_batch_size": 2,
    "gradient_accumulation_steps": 1,
    "learning_rate": 1.0e-4,
    "bf16": True,
    "flash_attn": "sdpa",
    "include_effective_tokens_per_second": True,
}
VERSIONS_CODE = (
    "import torch, transformers, deepspeed, llamafactory, peft; print('torch', torch.__version__, 'cuda', "
    "torch.version.cuda, '| transformers', transformers.__version__, '| deepspeed', deepspeed.__version__, "
    "'| llamafactory', llamafactory.__version__, '| peft', peft.__version__)"
)
SAFE_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


def smi(query: str) -> str:
    return (
        subprocess.run(
            ["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            check=True,
        )
        .stdout.strip()
        .splitlines()[0]
    )


def host_mem_gib() -> float:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) / 1024**2
    return 0.0


def probe_cpu_adam(ext_dir: Path) -> dict[str, float]:
    """Time DeepSpeedCPUAdam's op load with an empty extension cache (JIT build) and again (prebuilt)."""
    code = (
        "import time; t=time.time(); from deepspeed.ops.op_builder import CPUAdamBuilder; "
        "CPUAdamBuilder().load(); print(time.time()-t)"
    )
    out: dict[str, float] = {}
    for label in ("jit_build_s", "prebuilt_load_s"):
        env = {**os.environ, "TORCH_EXTENSIONS_DIR": str(ext_dir)}
        r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=False)
        lines = r.stdout.strip().splitlines()
        out[label] = float(lines[-1]) if r.returncode == 0 and lines else -1.0
        if r.returncode:
            print(r.stderr[-2000:], flush=True)
    return out


def run_one(name: str, assets: Path, work: Path, steps: int, timeout: float, ext_dir: Path) -> dict[str, Any]:
    """Train once with one strategy (``NAME[@live,reuse]`` overrides ZeRO-3's live/reuse knobs)."""
    base, _, knobs = name.partition("@")
    strategy = Strategy(base)
    rdir = work / name.replace("@", "_").replace(",", "_")
    rdir.mkdir(parents=True, exist_ok=True)
    train = {
        **TRAIN,
        "model_name_or_path": str(assets / "model"),
        "dataset_dir": str(assets / "data"),
        "max_steps": steps,
        "output_dir": str(rdir / "out"),
    }
    env = {**os.environ, **SAFE_ENV, "TORCH_EXTENSIONS_DIR": str(ext_dir)}
    ds = deepspeed_config(strategy)
    if ds is not None and knobs:
        live, reuse = (int(float(k)) for k in knobs.split(","))
        ds["zero_optimization"].update(stage3_max_live_parameters=live, stage3_max_reuse_distance=reuse)
    if ds is not None:
        (rdir / "ds.json").write_text(json.dumps(ds, indent=1))
        train["deepspeed"] = str(rdir / "ds.json")
        env["FORCE_TORCHRUN"] = "1"
    (rdir / "train.yaml").write_text(yaml.safe_dump(train))
    memdir = rdir / "memhook"
    memdir.mkdir(exist_ok=True)
    env["MIFT_MEMHOOK_DIR"] = str(memdir)
    env["PYTHONPATH"] = f"{REPO / 'bench' / 'gpu' / 'memhook'}:{env.get('PYTHONPATH', '')}"
    sampler = subprocess.Popen(
        ["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits", "-lms", "200"],
        stdout=subprocess.PIPE,
        text=True,
    )
    t0 = time.time()
    with (rdir / "train.log").open("w") as log:
        try:
            rc = subprocess.run(
                ["llamafactory-cli", "train", str(rdir / "train.yaml")],
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                timeout=timeout,
                check=False,
            ).returncode
        except subprocess.TimeoutExpired:
            rc = 124
    wall = time.time() - t0
    sampler.terminate()
    samples = [int(x) for x in (sampler.communicate()[0] or "").split() if x.isdigit()]
    metrics: dict[str, Any] = {}
    results = rdir / "out" / "train_results.json"
    if results.exists():
        metrics = json.loads(results.read_text())
    torch_peaks = [json.loads(p.read_text()) for p in memdir.glob("*.json")]
    log_text = (rdir / "train.log").read_text(errors="replace")
    runtime = float(metrics.get("train_runtime", 0.0))
    return {
        "strategy": name,
        "rc": rc,
        "oom": "out of memory" in log_text.lower(),
        "wall_s": round(wall, 1),
        "train_runtime_s": runtime,
        "startup_s": round(wall - runtime, 1) if runtime else None,
        "step_s": round(runtime / steps, 3) if runtime else None,
        "tokens_per_s": metrics.get("effective_tokens_per_sec"),
        "peak_smi_mib": max(samples) if samples else None,
        "peak_torch_alloc_mib": round(max((p["allocated"] for p in torch_peaks), default=0) / MIB),
        "peak_torch_reserved_mib": round(max((p["reserved"] for p in torch_peaks), default=0) / MIB),
        "log_tail": "" if rc == 0 else log_text[-1500:],
    }


def safe_name(name: str) -> str:
    """Return a strategy name usable in file and job names (``zero3@1e8,1e8`` -> ``zero3_1e8_1e8``)."""
    return name.replace("@", "_").replace(",", "_")


def write_job(
    name: str, shape: str, assets: Path, jdir: Path, steps: int, job_s: float, port: int = 29500
) -> Path:
    """Write the job spec, training YAML and (explicit strategies) DeepSpeed JSON of one launcher run."""
    base, _, knobs = name.partition("@")
    jdir.mkdir(parents=True, exist_ok=True)
    train = {
        **TRAIN,
        "model_name_or_path": str(assets / "model"),
        "dataset_dir": str(assets / "data"),
        "max_steps": steps,
    }
    (jdir / "train.yaml").write_text(yaml.safe_dump(train, sort_keys=False))
    deepspeed = base if base in ("auto", "none") else f"{safe_name(name)}.json"
    if base not in ("auto", "none"):
        ds = deepspeed_config(Strategy(base))
        assert ds is not None
        if knobs:
            live, reuse = (int(float(k)) for k in knobs.split(","))
            ds["zero_optimization"].update(stage3_max_live_parameters=live, stage3_max_reuse_distance=reuse)
        (jdir / deepspeed).write_text(json.dumps(ds, indent=1) + "\n")
    job = {
        "name": f"bench-{shape}-{safe_name(name)}",
        "train_config": "train.yaml",
        "deepspeed": deepspeed,
        "poll_interval_s": 2,
        "master_port": port,
        # nproc_per_node, node_venv and the trainer env are left to the inventory and the node's torch
        "timeouts": {"start_s": 300, "job_s": max(30, int(job_s))},
    }
    path = jdir / "job.yaml"
    path.write_text(yaml.safe_dump(job, sort_keys=False))
    return path


def launcher_cmd(job: Path, inventory: Path = INVENTORY) -> list[str]:
    """Return the command line that runs one job through the launcher."""
    return [sys.executable, "-m", "launcher", "run", str(job), "-i", str(inventory)]


def write_results(stem: Path, text: str, payload: dict[str, Any]) -> None:
    """Write one bench's results: ``STEM.json`` (raw) and ``STEM.md`` (the printed table)."""
    stem.with_suffix(".json").write_text(json.dumps(payload, indent=1))
    stem.with_suffix(".md").write_text(text + "\n")


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def run_launcher(
    name: str, job: Path, runs_dir: Path, steps: int, timeout: float, inventory: Path = INVENTORY
) -> dict[str, Any]:
    """Run one job spec with ``python -m launcher run`` while sampling nvidia-smi; read its run directory."""
    env = {**os.environ, "MIFT_RUNS_DIR": str(runs_dir)}
    smi_cmd = ["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits", "-lms", "200"]
    sampler = subprocess.Popen(  # no nvidia-smi (a CPU test of this function): no peak
        smi_cmd if shutil.which("nvidia-smi") else ["true"], stdout=subprocess.PIPE, text=True
    )
    log_path = job.parent / "launcher.log"
    t0 = time.time()
    with log_path.open("w") as log:
        proc = subprocess.Popen(
            launcher_cmd(job, inventory), cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, text=True
        )
        try:
            rc = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:  # Ctrl-C: the launcher stops the trainer and collects what there is
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            rc = 124
    wall = time.time() - t0
    sampler.terminate()
    samples = [int(x) for x in (sampler.communicate()[0] or "").split() if x.isdigit()]
    out = log_path.read_text(errors="replace")
    found = RUN_LINE_RE.search(out)
    run_dir = Path(found.group(2)) if found else None
    record = _read_json(run_dir / "record.json") if run_dir else {}
    hosts = record.get("hosts") or []
    node = run_dir / "nodes" / str(hosts[0]) if run_dir and hosts else None
    results = (
        (_read_json(node / "train_results.json") or _read_json(node / "all_results.json")) if node else {}
    )
    state = _read_json(node / "state.json") if node else {}
    trainer_log = (
        (node / "trainer.log").read_text(errors="replace") if node and (node / "trainer.log").exists() else ""
    )
    metrics_lines = (
        (run_dir / "metrics.jsonl").read_text().splitlines()
        if run_dir and (run_dir / "metrics.jsonl").exists()
        else []
    )
    runtime = float(results.get("train_runtime", 0.0))
    trainer_wall = (
        float(state["ended_at"]) - float(state["started_at"])
        if state.get("ended_at") and state.get("started_at")
        else None
    )
    return {
        "strategy": name,
        "rc": rc,
        "status": record.get("status"),
        "run_id": run_dir.name if run_dir else None,
        "deepspeed": record.get("deepspeed"),
        "nproc_per_node": record.get("nproc_per_node"),
        "notes": record.get("notes"),
        "warnings": record.get("warnings"),
        "oom": "out of memory" in trainer_log.lower(),
        "launcher_wall_s": round(wall, 1),
        "trainer_wall_s": round(trainer_wall, 1) if trainer_wall else None,
        "launch_s": record.get("start_s"),
        "train_runtime_s": runtime,
        "startup_s": round(trainer_wall - runtime, 1) if runtime and trainer_wall else None,
        "launcher_overhead_s": round(wall - trainer_wall, 1) if trainer_wall else None,
        "step_s": round(runtime / steps, 3) if runtime else None,
        # LLaMA-Factory's effective tokens/s (include_effective_tokens_per_second), as in the direct mode
        "tokens_per_s": results.get("effective_tokens_per_sec"),
        "metrics_steps": len(metrics_lines),
        "summary": record.get("summary"),
        "peak_smi_mib": max(samples) if samples else None,
        "launcher_out_tail": out[-2500:],
        "trainer_log_tail": "" if rc == 0 else trainer_log[-2500:],
    }


def launcher_table(rows: list[dict[str, Any]], plan_json: dict[str, Any]) -> tuple[str, list[str]]:
    """Return the side-by-side table of launcher runs and the lines that check the issue's claims."""
    est = {s["name"]: s for s in plan_json["strategies"]}
    head = (
        "| strategy (job spec deepspeed) | launcher ran | fits (plan) | est GPU MiB | peak nvidia-smi MiB | "
        "est/measured | tokens/s | vs best | step s | start-up s | launcher s | status |"
    )
    lines = [head, "|" + "---|" * 12]
    done = [r for r in rows if r["tokens_per_s"]]
    best = max((r["tokens_per_s"] for r in done), default=0.0)
    ratios = []
    for r in rows:
        ran = str(r["deepspeed"] or "-")  # the launcher's record: the planner's pick, or the JSON's file name
        base = ran if r["strategy"] == "auto" else r["strategy"].partition("@")[0]
        e = est.get(base)
        est_mib = e["gpu_mem_gib"] * 1024 if e else None
        peak = r["peak_smi_mib"]
        ratio = est_mib / peak if est_mib and peak else None
        if ratio and r["status"] == "succeeded":
            ratios.append(ratio)
        tps = r["tokens_per_s"]
        label = f"auto -> **{ran}** (pick)" if r["strategy"] == "auto" else r["strategy"]
        fits = ("yes" if e["fits"] else "no") if e else "-"
        cells = [
            label,
            ran,
            fits,
            f"{est_mib:.0f}" if est_mib else "-",
            str(peak),
            f"{ratio:.2f}" if ratio else "-",
            str(round(tps)) if tps else "-",
            f"{tps / best:.0%}" if tps and best else "-",
            str(r["step_s"]),
            str(r["startup_s"]),
            str(r["launcher_overhead_s"]),
            f"{r['status']} rc {r['rc']}{' OOM' if r['oom'] else ''}",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    by = {r["strategy"]: r for r in rows}
    checks = []
    pick = by.get("auto")
    if pick and pick["tokens_per_s"]:
        off = by.get("zero3_offload_all")
        if off and off["tokens_per_s"]:
            x = pick["tokens_per_s"] / off["tokens_per_s"]
            checks.append(
                f"pick ({pick['deepspeed']}) vs ZeRO-3 + offload (zero3_offload_all): {x:.1f}x tokens/s "
                f"({'meets' if x >= 4 else 'MISSES'} >= 4x)"
            )
        share = pick["tokens_per_s"] / best
        checks.append(f"pick vs best measured: {share:.0%} ({'meets' if share >= 0.9 else 'MISSES'} >= 90%)")
    ooms = [r["strategy"] for r in rows if r["oom"]]
    checks.append(f"OOM: {', '.join(ooms) if ooms else 'none'}")
    if ratios:
        ok = all(0.8 <= x <= 1.2 for x in ratios)
        checks.append(
            f"estimate / measured peak: {min(ratios):.2f}-{max(ratios):.2f} "
            f"({'all within' if ok else 'NOT all within'} +-20%)"
        )
    return "\n".join(lines), checks


def start_cpu_adam_build() -> subprocess.Popen[str]:
    """Build DeepSpeedCPUAdam into the default extension dir (what the deepspeed role's prebuild does)."""
    code = "from deepspeed.ops.op_builder import CPUAdamBuilder; CPUAdamBuilder().load()"
    return subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )


def dry_assets(assets: Path, shape: str) -> None:
    """Write what --dry-run needs without torch: the model's config.json and a one-sample dataset."""
    (assets / "model").mkdir(parents=True, exist_ok=True)
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": 4004,
        "max_position_embeddings": 4096,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        **SHAPES[shape],
    }
    (assets / "model" / "config.json").write_text(json.dumps(config, indent=1))
    (assets / "data").mkdir(parents=True, exist_ok=True)
    (assets / "data" / "synth.json").write_text(
        json.dumps([{"instruction": "a", "input": "", "output": "b"}])
    )
    (assets / "data" / "dataset_info.json").write_text(json.dumps({"synth": {"file_name": "synth.json"}}))


def table(rows: list[dict[str, Any]], plan_json: dict[str, Any], choice: str) -> str:
    est = {s["name"]: s for s in plan_json["strategies"]}
    head = (
        "| strategy | fits (plan) | est GPU MiB | peak nvidia-smi MiB | est/measured | torch alloc MiB | "
        "tokens/s | step s | start-up s | rc |"
    )
    lines = [head, "|" + "---|" * 10]
    for r in rows:
        e = est[r["strategy"].partition("@")[0]]
        est_mib = e["gpu_mem_gib"] * 1024
        ratio = f"{est_mib / r['peak_smi_mib']:.2f}" if r["peak_smi_mib"] else "-"
        mark = " (**pick**)" if r["strategy"] == choice else ""
        lines.append(
            f"| {r['strategy']}{mark} | {'yes' if e['fits'] else 'no'} | {est_mib:.0f} | {r['peak_smi_mib']} "
            f"| {ratio} | {r['peak_torch_alloc_mib']} | {r['tokens_per_s'] and round(r['tokens_per_s'])} "
            f"| {r['step_s']} | "
            f"{r['startup_s']} | {r['rc']}{' OOM' if r['oom'] else ''} |"
        )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("shape", choices=("tiny", "3b", "8b"))
    ap.add_argument("strategies", nargs="*", default=[s.value for s in Strategy])
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--work", type=Path, default=Path("/tmp/mift-bench"))
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "/tmp/mift-bench/out")))
    ap.add_argument("--deadline-s", type=float, default=540.0, help="stop starting runs after this")
    ap.add_argument("--run-timeout-s", type=float, default=240.0)
    ap.add_argument("--probe-cpu-adam", action="store_true", help="time CPUAdam JIT build vs prebuilt load")
    ap.add_argument(
        "--launcher", action="store_true", help="run each strategy through `python -m launcher run`"
    )
    ap.add_argument(
        "--prebuild-cpu-adam",
        action="store_true",
        help="--launcher: build DeepSpeedCPUAdam while the model is made (the deepspeed role prebuilds it)",
    )
    ap.add_argument(
        "--dry-run", action="store_true", help="--launcher: write and validate the job specs, print the plan"
    )
    ap.add_argument(
        "--inventory", type=Path, default=INVENTORY, help="--launcher: the GPU machine's inventory"
    )
    ap.add_argument(
        "--gpu-mem-gib",
        type=float,
        default=NODE_PRESETS["h200"].gpu_mem_gib,
        help="--dry-run: memory per GPU (default: the H200 preset's)",
    )
    args = ap.parse_args()
    t_start = time.time()
    args.out.mkdir(parents=True, exist_ok=True)
    assets = args.work / f"assets-{args.shape}"
    builder = start_cpu_adam_build() if args.prebuild_cpu_adam and not args.dry_run else None
    if args.dry_run:
        dry_assets(assets, args.shape)
    elif not (assets / "model" / "config.json").exists():
        t0 = time.time()
        subprocess.run(
            [sys.executable, str(REPO / "bench/gpu/make_assets.py"), str(assets), args.shape], check=True
        )
        print(f"assets {args.shape}: {time.time() - t0:.0f}s", flush=True)
    if args.dry_run:
        versions, gpu, gpu_mem_gib = (
            "(dry run)",
            f"(dry run: {args.gpu_mem_gib} GiB per GPU)",
            args.gpu_mem_gib,
        )
    else:
        versions = subprocess.run(
            [sys.executable, "-c", VERSIONS_CODE],
            capture_output=True,
            text=True,
            check=False,
        ).stdout.strip()
        gpu = smi("name,memory.total,driver_version")
        gpu_mem_gib = float(gpu.split(",")[1]) / 1024
    cluster = Cluster(nodes=1, gpus_per_node=1, gpu_mem_gib=gpu_mem_gib, host_mem_gib=host_mem_gib())
    train = {**TRAIN, "max_steps": args.steps}
    shape = load_shape(assets / "model")
    plan = plan_as_written(shape, train, cluster)
    plan_json = plan.as_json()
    auto_name, _auto_cfg = choose_deepspeed_config(
        assets / "model", train, 1, 1, gpu_mem_gib, cluster.host_mem_gib
    )
    print(
        f"{versions}\nGPU: {gpu}; host RAM {cluster.host_mem_gib:.0f} GiB\n"
        f"planner: {plan.reason()} (deepspeed: auto -> {auto_name})",
        flush=True,
    )
    if args.launcher:
        launcher_main(
            args, assets, shape.total_params(), plan_json, auto_name, versions, gpu, builder, t_start
        )
        return
    ext_dir = args.work / "torch_extensions"
    probe = probe_cpu_adam(ext_dir) if args.probe_cpu_adam else {}
    if probe:
        print(
            f"DeepSpeedCPUAdam op: JIT build {probe['jit_build_s']:.1f}s, prebuilt load "
            f"{probe['prebuilt_load_s']:.1f}s",
            flush=True,
        )
    rows = []
    for name in args.strategies:
        left = args.deadline_s - (time.time() - t_start)
        if left < 45:
            print(f"== {name}: skipped, {left:.0f}s left", flush=True)
            continue
        row = run_one(
            name, assets, args.work / args.shape, args.steps, min(args.run_timeout_s, left - 10), ext_dir
        )
        rows.append(row)
        print(
            f"== {args.shape} {name}: " + json.dumps({k: v for k, v in row.items() if k != "log_tail"}),
            flush=True,
        )
        if row["log_tail"]:
            print(row["log_tail"], flush=True)
    text = (
        f"shape {args.shape} ({shape.total_params() / 1e9:.2f} B params), LoRA r8 all, micro-batch 2, "
        f"cutoff 1024, {args.steps} steps\n{versions}\nGPU: {gpu}\nplanner pick: {auto_name}\n\n"
        f"{table(rows, plan_json, auto_name)}"
    )
    print(text, flush=True)
    write_results(
        args.out / f"results_{args.shape}",
        text,
        {
            "shape": args.shape,
            "versions": versions,
            "gpu": gpu,
            "plan": plan_json,
            "auto": auto_name,
            "cpu_adam": probe,
            "runs": rows,
        },
    )


def launcher_main(
    args: argparse.Namespace,
    assets: Path,
    params: float,
    plan_json: dict[str, Any],
    auto_name: str,
    versions: str,
    gpu: str,
    builder: subprocess.Popen[str] | None,
    t_start: float,
) -> None:
    """Run (or with --dry-run, write and validate) one job spec per strategy through the launcher."""
    work = args.work / f"launcher-{args.shape}"
    runs_dir = work / "runs"
    rows: list[dict[str, Any]] = []
    build: dict[str, Any] = {}
    for index, name in enumerate(args.strategies):
        jdir = work / "jobs" / safe_name(name)
        left = args.deadline_s - (time.time() - t_start)
        job_s = min(args.run_timeout_s, left - 20)
        job = write_job(name, args.shape, assets, jdir, args.steps, job_s, 29500 + index)
        if args.dry_run:
            check = subprocess.run(
                [sys.executable, "-m", "launcher", "validate", str(job)],
                cwd=REPO,
                capture_output=True,
                text=True,
                check=False,
            )
            print(
                f"== {name}: {job}\n   {' '.join(launcher_cmd(job))}\n   validate rc {check.returncode}: "
                f"{(check.stdout + check.stderr).strip().splitlines()[-1:]}",
                flush=True,
            )
            continue
        if builder is not None:  # the op build overlaps model creation, never a measured run
            t0 = time.time()
            build_out = builder.communicate()[0]
            build = {
                "rc": builder.returncode,
                "waited_s": round(time.time() - t0, 1),
                "tail": build_out[-800:],
            }
            print(f"DeepSpeedCPUAdam prebuild: {build}", flush=True)
            builder = None
        left = args.deadline_s - (time.time() - t_start)
        if left < 60:
            print(f"== {name}: skipped, {left:.0f}s left", flush=True)
            continue
        row = run_launcher(
            name, job, runs_dir, args.steps, min(args.run_timeout_s, left - 15), args.inventory
        )
        rows.append(row)
        brief = {k: v for k, v in row.items() if not k.endswith("_tail") and k != "summary"}
        print(f"== {args.shape} {name}: " + json.dumps(brief), flush=True)
        if row["rc"] != 0:
            print(row["launcher_out_tail"], "\n--- trainer.log ---\n", row["trainer_log_tail"], flush=True)
            if len(rows) == 1 or row["status"] in (None, "rejected"):
                print("the first run through the launcher failed: skipping the other strategies", flush=True)
                break
    if args.dry_run:
        return
    tbl, checks = launcher_table(rows, plan_json)
    notes = sorted({n for r in rows for n in (r.get("notes") or [])})
    text = (
        f"shape {args.shape} ({params / 1e9:.2f} B params), LoRA r8 all, micro-batch 2, cutoff 1024, "
        f"{args.steps} steps, through `python -m launcher run JOB -i inventory/gpu-local`\n{versions}\n"
        f"GPU: {gpu}\nplanner (bench): deepspeed: auto -> {auto_name}\n"
        + "".join(f"launcher note: {n}\n" for n in notes)
        + f"\n{tbl}\n\n"
        + "\n".join(checks)
    )
    print(text, flush=True)
    write_results(
        args.out / f"results_launcher_{args.shape}",
        text,
        {
            "shape": args.shape,
            "versions": versions,
            "gpu": gpu,
            "plan": plan_json,
            "auto": auto_name,
            "cpu_adam_prebuild": build,
            "runs": rows,
            "checks": checks,
        },
    )


if __name__ == "__main__":
    main()
