"""Run every training strategy side by side on this GPU machine and compare with the planner.

For a random-init model of a given shape (made offline by bench/gpu/make_assets.py), runs LLaMA-Factory LoRA
SFT once per strategy (no DeepSpeed, ZeRO-2, ZeRO-3, ZeRO-3 + optimizer offload, ZeRO-3 + optimizer + param
offload), samples nvidia-smi memory, reads LLaMA-Factory's train metrics and the torch peak of every process
(bench/gpu/memhook), and prints tokens/s, step time, peak GPU memory and start-up time next to the planner's
estimate and choice. The DeepSpeed JSONs are the planner's own (launcher.planning.dsconfig); the
``deepspeed: auto`` choice comes from launcher.plan.choose_deepspeed_config.

Runs LLaMA-Factory directly (``llamafactory-cli train``, FORCE_TORCHRUN=1 for DeepSpeed), not through
``python -m launcher run``: see docs/gpu-results.md.

Usage (on the GPU machine, after the wheels are installed): bench/gpu/run.sh SHAPE [STRATEGY ...]
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

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "python"))

from launcher.plan import choose_deepspeed_config, make_plan, workload_from_train  # noqa: E402
from launcher.planning.dsconfig import deepspeed_config  # noqa: E402
from launcher.planning.memory import Cluster, Strategy  # noqa: E402
from launcher.planning.model import load_shape  # noqa: E402

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
    args = ap.parse_args()
    t_start = time.time()
    args.out.mkdir(parents=True, exist_ok=True)
    assets = args.work / f"assets-{args.shape}"
    if not (assets / "model" / "config.json").exists():
        t0 = time.time()
        subprocess.run(
            [sys.executable, str(REPO / "bench/gpu/make_assets.py"), str(assets), args.shape], check=True
        )
        print(f"assets {args.shape}: {time.time() - t0:.0f}s", flush=True)
    versions = subprocess.run(
        [
            sys.executable,
            "-c",
            "import torch, transformers, deepspeed, llamafactory, peft; print('torch', "
            "torch.__version__, 'cuda', torch.version.cuda, '| transformers', transformers.__version__, "
            "'| deepspeed',"
            " deepspeed.__version__, '| llamafactory', llamafactory.__version__, '| peft', peft.__version__)",
        ],
        capture_output=True,
        text=True,
        check=False,
    ).stdout.strip()
    gpu = smi("name,memory.total,driver_version")
    gpu_mem_gib = float(gpu.split(",")[1]) / 1024
    cluster = Cluster(nodes=1, gpus_per_node=1, gpu_mem_gib=gpu_mem_gib, host_mem_gib=host_mem_gib())
    train = {**TRAIN, "max_steps": args.steps}
    shape = load_shape(assets / "model")
    plan = make_plan(workload_from_train(shape, train), cluster)
    plan_json = plan.as_json()
    auto_name, _auto_cfg = choose_deepspeed_config(
        assets / "model", train, 1, 1, gpu_mem_gib, cluster.host_mem_gib
    )
    print(
        f"{versions}\nGPU: {gpu}; host RAM {cluster.host_mem_gib:.0f} GiB\n"
        f"planner: {plan.reason()} (deepspeed: auto -> {auto_name})",
        flush=True,
    )
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
    (args.out / f"results_{args.shape}.json").write_text(
        json.dumps(
            {
                "shape": args.shape,
                "versions": versions,
                "gpu": gpu,
                "plan": plan_json,
                "auto": auto_name,
                "cpu_adam": probe,
                "runs": rows,
            },
            indent=1,
        )
    )
    (args.out / f"results_{args.shape}.md").write_text(text + "\n")


if __name__ == "__main__":
    main()
