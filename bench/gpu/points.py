"""H200 measurements of four issues' "Must show" points, one subcommand each (bench/gpu/points.sh runs them
all in one device call; results in bench/gpu/results/points/):

* ``train``   -- #27 + #28: a plain torch/peft LoRA loop of a random-init Llama (bench/gpu/make_assets.py's
  shapes, LoRA r8 on every linear, micro-batch 2 x 1024 tokens, gradient checkpointing, bf16 autocast, fp32
  adapter as LLaMA-Factory keeps it): tokens/s in phases with the node agent's GPU sampler
  (launcher.node.gpu.Sampler in a process of its own, as the agent runs it) off, every 30 s and every
  1 s; then a checkpoint saved as transformers' Trainer saves one (adapter, optimizer.pt, scheduler.pt,
  rng_state.pth, trainer_state.json) and loaded back, timed. Saves the base model first (the merge's input).
* ``sampler`` -- the sampler process ``train`` starts per phase.
* ``stacks``  -- #27: stack dumps of processes stuck in a CUDA kernel, in a gloo collective waiting for a peer
  and in NCCL with a collective queued behind a long kernel: py-spy (--nonblocking, blocking, --native), the
  kernel's view the agent writes (node/stop.py _kernel_view), faulthandler on SIGUSR1, the NCCL flight
  recorder's pipe.
* ``merge``   -- #31: base + adapter -> merged model (peft merge_and_unload, then save_pretrained in 5 GB
  shards as ``llamafactory-cli export`` does) on cuda or cpu: time per stage and peak memory.

Every subcommand prints lines ``RESULT {json}`` that the markdown quotes.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch
    from transformers import LlamaForCausalLM

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from make_assets import SHAPES  # noqa: E402

VOCAB = 4000  # make_assets.py's tokenizer: the 8B shape is then 7.01 B parameters, as in results_launcher_8b
LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def _agent() -> SimpleNamespace:
    """Return the node agent's parts this bench calls (launcher/node: watch, stop) as one namespace."""
    from launcher.node import stop, watch  # noqa: PLC0415

    return SimpleNamespace(**vars(watch), **{k: v for k, v in vars(stop).items() if k not in vars(watch)})


def result(name: str, **fields: object) -> None:
    print("RESULT " + json.dumps({"point": name, **fields}), flush=True)


def _gpu_used_mib() -> float | None:
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout
        return float(out.split()[0])
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return None


# --- #27 / #28: the training loop ---------------------------------------------------------------------------


def cmd_sampler(args: argparse.Namespace) -> None:
    """Run the node agent's sampler until SIGTERM (as the agent does, in a process beside the trainer)."""
    from launcher.node import gpu as mift_gpu  # noqa: PLC0415

    run_dir = Path(args.dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    sampler = mift_gpu.Sampler.for_job(run_dir, {"telemetry_period_s": args.period})
    assert sampler is not None and sampler.tool is not None
    tool, calls, spans = sampler.tool, [], []
    plain_call = tool.call

    def timed_call() -> list[dict[str, Any]]:  # the tool's own time per call, measured around it
        began, wall = time.perf_counter(), time.time()
        try:
            return plain_call()
        finally:
            calls.append(time.perf_counter() - began)
            spans.append([wall, time.time()])

    tool.call = timed_call  # type: ignore[method-assign]
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    cpu0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    sampler.start()
    print("sampling", flush=True)
    signal.sigwait({signal.SIGTERM})
    sampler.stop()
    cpu1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    state = mift_gpu.read_json(run_dir / mift_gpu.TELEMETRY_STATE)
    cpu_s = cpu1.ru_utime + cpu1.ru_stime - cpu0.ru_utime - cpu0.ru_stime
    state["call_ms"] = {
        "n": len(calls),
        "mean": round(1000 * statistics.mean(calls), 1) if calls else None,
        "max": round(1000 * max(calls), 1) if calls else None,
        "tool_cpu_ms_per_call": round(1000 * cpu_s / len(calls), 1) if calls else None,
    }
    state["call_spans"] = spans
    print(json.dumps(state), flush=True)


def _make_model(shape: str, device: str) -> LlamaForCausalLM:
    import torch  # noqa: PLC0415
    from transformers import LlamaConfig, LlamaForCausalLM  # noqa: PLC0415

    cfg = LlamaConfig(
        vocab_size=VOCAB,
        max_position_embeddings=4096,
        rope_theta=500000.0,
        tie_word_embeddings=False,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=3,
        **SHAPES[shape],
    )
    torch.manual_seed(0)
    torch.set_default_dtype(torch.bfloat16)
    with torch.device(device):
        model = LlamaForCausalLM(cfg)
    torch.set_default_dtype(torch.float32)
    return model


def _save_checkpoint(
    model: torch.nn.Module,
    opt: torch.optim.Optimizer,
    sched: torch.optim.lr_scheduler.LRScheduler,
    folder: Path,
    step: int,
) -> dict[str, Any]:
    """Save as transformers' Trainer saves a LoRA checkpoint (no DeepSpeed: the plan's pick for 8B on one
    H200); return the seconds (written, then synced to disk) and the sizes."""
    import torch  # noqa: PLC0415

    folder.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    model.save_pretrained(folder)  # adapter_model.safetensors + adapter_config.json
    t_adapter = time.perf_counter()
    torch.save(opt.state_dict(), folder / "optimizer.pt")
    t_opt = time.perf_counter()
    torch.save(sched.state_dict(), folder / "scheduler.pt")
    torch.save(
        {
            "cpu": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
        },
        folder / "rng_state.pth",
    )
    (folder / "trainer_state.json").write_text(json.dumps({"global_step": step}))
    t_written = time.perf_counter()
    os.sync()
    t_synced = time.perf_counter()
    sizes = {p.name: p.stat().st_size for p in sorted(folder.iterdir())}
    return {
        "adapter_s": round(t_adapter - t0, 3),
        "optimizer_s": round(t_opt - t_adapter, 3),
        "written_s": round(t_written - t0, 3),
        "synced_s": round(t_synced - t0, 3),
        "mib": {k: round(v / 2**20, 1) for k, v in sizes.items()},
        "total_mib": round(sum(sizes.values()) / 2**20, 1),
    }


def _drop_page_cache() -> bool:
    """Drop the kernel's page cache (for a cold read) where POINTS_DROP_CACHES=1 and the kernel lets us."""
    if os.environ.get("POINTS_DROP_CACHES") != "1":
        return False
    try:
        os.sync()
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
    except OSError:
        return False
    return True


def _load_checkpoint(
    model: torch.nn.Module,
    opt: torch.optim.Optimizer,
    sched: torch.optim.lr_scheduler.LRScheduler,
    folder: Path,
    device: torch.device,
) -> dict[str, Any]:
    """Load as the Trainer resumes: the adapter into the model, the optimizer state onto the device."""
    import torch  # noqa: PLC0415
    from peft import set_peft_model_state_dict  # noqa: PLC0415
    from safetensors.torch import load_file  # noqa: PLC0415

    dropped = _drop_page_cache()
    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
    sync()
    t0 = time.perf_counter()
    state = load_file(str(folder / "adapter_model.safetensors"), device=str(device))
    set_peft_model_state_dict(model, state)
    t_adapter = time.perf_counter()
    opt.load_state_dict(torch.load(folder / "optimizer.pt", map_location=device, weights_only=True))
    sched.load_state_dict(torch.load(folder / "scheduler.pt", weights_only=True))
    torch.load(folder / "rng_state.pth", weights_only=False)
    sync()
    t_done = time.perf_counter()
    return {
        "adapter_s": round(t_adapter - t0, 3),
        "total_s": round(t_done - t0, 3),
        "page_cache_dropped": dropped,
    }


def _overlap(steps: list[tuple[float, float]], calls: list[list[float]], period: float) -> dict[str, Any]:
    """Compare the steps that overlap a tool call with the others of the same phase (interleaved, so a slow
    drift of the GPU's speed hits both alike): the extra step time per call, and that as a share of the
    period (the sampler's cost at this period, and at 30 s)."""
    hit = [b - a for a, b in steps if any(a < ce and cs < b for cs, ce in calls)]
    clear = [b - a for a, b in steps if not any(a < ce and cs < b for cs, ce in calls)]
    if not hit or len(clear) < 2 or not calls:
        return {"hit": len(hit), "clear": len(clear)}
    extra = (statistics.mean(hit) - statistics.mean(clear)) * len(hit) / len(calls)
    return {
        "hit": len(hit),
        "clear": len(clear),
        "hit_mean_s": round(statistics.mean(hit), 4),
        "clear_mean_s": round(statistics.mean(clear), 4),
        "hit_median_s": round(statistics.median(hit), 4),
        "clear_median_s": round(statistics.median(clear), 4),
        "extra_ms_per_call": round(1000 * extra, 2),
        "cost_pct_at_this_period": round(100 * extra / period, 3),
        "cost_pct_at_30s": round(100 * extra / 30.0, 4),
    }


def cmd_train(args: argparse.Namespace) -> None:
    import torch  # noqa: PLC0415
    from peft import LoraConfig, get_peft_model  # noqa: PLC0415

    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    t0 = time.perf_counter()
    model = _make_model(args.shape, str(device))
    n_params = sum(p.numel() for p in model.parameters())
    t_made = time.perf_counter()
    if args.save_base:
        model.save_pretrained(work / "base", safe_serialization=True)
        os.sync()
    t_saved = time.perf_counter()
    result(
        "base",
        shape=args.shape,
        params_b=round(n_params / 1e9, 3),
        made_s=round(t_made - t0, 1),
        saved_synced_s=round(t_saved - t_made, 1) if args.save_base else None,
        base_gib=round(sum(p.stat().st_size for p in (work / "base").iterdir()) / 2**30, 2)
        if args.save_base
        else None,
    )
    model.config.use_cache = False
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.enable_input_require_grads()
    lora = LoraConfig(
        r=8, lora_alpha=16, lora_dropout=0.0, target_modules=LORA_TARGETS, task_type="CAUSAL_LM"
    )
    model = get_peft_model(model, lora)
    for p in model.parameters():  # LLaMA-Factory keeps the trainable (LoRA) weights in fp32
        if p.requires_grad:
            p.data = p.data.float()
    trainable = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(trainable, lr=1e-4, weight_decay=0.0, fused=device.type == "cuda")
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda _s: 1.0)
    gen = torch.Generator(device="cpu").manual_seed(0)
    tokens_per_step = args.micro * args.cutoff
    # inputs made once, on the GPU: no host work in the timed steps but the model's
    pool = torch.randint(0, VOCAB, (16, args.micro, args.cutoff), generator=gen).to(device)
    count = [0]

    def step() -> tuple[float, float]:
        ids = pool[count[0] % len(pool)]
        count[0] += 1
        start = time.perf_counter()
        with torch.autocast(device.type, dtype=torch.bfloat16):
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(trainable, 1.0)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        value = float(loss.item())  # synchronizes: the step's time is on the clock
        return time.perf_counter() - start, value

    for _ in range(args.warmup):
        step()
    result(
        "lora",
        trainable_m=round(sum(p.numel() for p in trainable) / 1e6, 2),
        warmup_steps=args.warmup,
        gpu_used_mib=_gpu_used_mib(),
    )
    phases: list[dict[str, Any]] = []
    steps_done = args.warmup
    for label in args.phases.split(","):
        sampler = None
        tele_dir = work / f"tele-{len(phases)}-{label}"
        if label != "off":
            sampler = subprocess.Popen(
                [sys.executable, __file__, "sampler", label, str(tele_dir)],
                stdout=subprocess.PIPE,
                text=True,
            )
            assert sampler.stdout is not None
            sampler.stdout.readline()  # "sampling": the baseline is taken
        times, losses, step_spans = [], [], []
        began = time.perf_counter()
        while time.perf_counter() - began < args.phase_s:
            wall = time.time()
            took, loss = step()
            step_spans.append((wall, wall + took))
            times.append(took)
            losses.append(loss)
        steps_done += len(times)
        samples = None
        if sampler is not None:
            sampler.send_signal(signal.SIGTERM)
            out, _ = sampler.communicate(timeout=30)
            state = json.loads(out.strip().splitlines()[-1] or "{}")
            samples = state.get("samples")
            latest = state.get("latest")
            call_ms = state.get("call_ms")
            overlap = _overlap(step_spans, state.get("call_spans") or [], float(label))
        else:
            latest = call_ms = overlap = None
        phase = {
            "sampling": label,
            "steps": len(times),
            "tokens_per_s": round(tokens_per_step * len(times) / sum(times), 1),
            "median_step_s": round(statistics.median(times), 4),
            "tokens_per_s_median": round(tokens_per_step / statistics.median(times), 1),
            "max_step_s": round(max(times), 4),
            "tool_calls": samples,
            "call_ms": call_ms,
            "steps_during_a_call": overlap,
            "latest_sample": latest,
            "last_loss": round(losses[-1], 4),
        }
        phases.append(phase)
        result("telemetry_phase", **phase)
    for key in ("tokens_per_s", "tokens_per_s_median"):
        by_mode: dict[str, list[float]] = {}
        for phase in phases:
            by_mode.setdefault(phase["sampling"], []).append(phase[key])
        off = statistics.mean(by_mode.get("off", [0.0])) or None
        result(
            "telemetry",
            of=key,
            phases=len(phases),
            mean={k: round(statistics.mean(v), 1) for k, v in by_mode.items()},
            stdev_pct={
                k: round(100 * statistics.stdev(v) / statistics.mean(v), 2)
                for k, v in by_mode.items()
                if len(v) > 1
            },
            cost_pct={
                k: round(100 * (1 - statistics.mean(v) / off), 2)
                for k, v in by_mode.items()
                if off and k != "off"
            },
        )
    # #28: the checkpoint as the Trainer writes it, twice (the first save includes first-touch costs)
    folder = work / "out" / f"checkpoint-{steps_done}"
    saves = [_save_checkpoint(model, opt, sched, folder, steps_done) for _ in range(2)]
    result("checkpoint_save", first=saves[0], second=saves[1])
    loaded = _load_checkpoint(model, opt, sched, folder, device)
    took, loss = step()
    result("checkpoint_load", **loaded, step_after_load_s=round(took, 3), loss_after_load=round(loss, 4))
    shutil.copytree(folder, work / "adapter", dirs_exist_ok=True)  # the merge's adapter


# --- #27: stack dumps ---------------------------------------------------------------------------------------

KERNEL_CHILD = """
import faulthandler, signal, sys, torch
faulthandler.register(signal.SIGUSR1, file=open(sys.argv[1], "w"), all_threads=True)
x = torch.ones(1, device="cuda")
torch.cuda.synchronize()
torch.cuda._sleep(int(float(sys.argv[2])))  # one kernel spinning for that many GPU cycles
print("ready", flush=True)
torch.cuda.synchronize()  # the host waits here, in cudaDeviceSynchronize
"""

GLOO_CHILD = """
import datetime, faulthandler, os, signal, sys, time, torch, torch.distributed as dist
faulthandler.register(signal.SIGUSR1, file=open(sys.argv[1], "w"), all_threads=True)
rank = int(os.environ["RANK"])
dist.init_process_group("gloo", rank=rank, world_size=2, timeout=datetime.timedelta(seconds=300))
print("ready", flush=True)
if rank == 1:
    dist.all_reduce(torch.ones(1024))  # rank 0 never joins: waits for the peer
else:
    time.sleep(300)
"""

NCCL_CHILD = """
import datetime, faulthandler, signal, sys, torch, torch.distributed as dist
faulthandler.register(signal.SIGUSR1, file=open(sys.argv[1], "w"), all_threads=True)
dist.init_process_group("nccl", rank=0, world_size=1, device_id=torch.device("cuda", 0),
                        timeout=datetime.timedelta(seconds=300))
t = torch.ones(1 << 20, device="cuda")
for _ in range(3):
    dist.all_reduce(t)
torch.cuda.synchronize()
torch.cuda._sleep(int(float(sys.argv[2])))  # a long kernel ...
dist.all_reduce(t)  # ... with a collective queued behind it
print("ready", flush=True)
torch.cuda.synchronize()
"""


def _run(argv: list[str], timeout: float = 30.0) -> str:
    began = time.perf_counter()
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
        text = f"rc {out.returncode}\n{out.stdout}{out.stderr}"
    except (OSError, subprocess.TimeoutExpired) as err:
        text = f"failed: {err}"
    return f"$ {' '.join(argv)}   ({time.perf_counter() - began:.2f} s)\n{text}"


def _dump(name: str, pid: int, fault_file: Path, spy: str | None) -> dict[str, Any]:
    """Every way of seeing the stuck process's stack; print each, return which worked."""
    mift_agent = _agent()
    print(f"===== {name}: pid {pid} state {mift_agent._proc_state(pid)}", flush=True)
    worked: dict[str, Any] = {}
    if spy:
        for extra in (["--nonblocking"], [], ["--native"]):
            text = _run([spy, "dump", "--pid", str(pid), *extra])
            print(text, flush=True)
            worked["py-spy " + (" ".join(extra) or "(blocking)")] = text.split("\n")[1].strip() == "rc 0"
    else:
        print("py-spy: not found", flush=True)
    view = mift_agent._kernel_view(pid)
    print("--- kernel view (launcher/node/stop.py _kernel_view)\n" + view, flush=True)
    worked["kernel view"] = bool(view)
    os.kill(pid, signal.SIGUSR1)
    time.sleep(1.0)
    text = fault_file.read_text() if fault_file.exists() else ""
    print("--- faulthandler (SIGUSR1)\n" + text, flush=True)
    worked["faulthandler"] = "File " in text
    return worked


def _start(code: str, *argv: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, "-c", code, *argv],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, **(env or {})},
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if line.strip() != "ready":
        raise RuntimeError(f"child did not start: {line!r} rc {proc.poll()}")
    time.sleep(3.0)  # well inside the wait
    return proc


def _end(*procs: subprocess.Popen[str]) -> None:
    for proc in procs:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        proc.wait(timeout=30)


def cmd_stacks(args: argparse.Namespace) -> None:
    mift_agent = _agent()

    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    spy = shutil.which("py-spy")
    print(_run([spy, "--version"]) if spy else "py-spy: not on PATH", flush=True)
    summary: dict[str, Any] = {}
    # 1. a CUDA kernel: the host thread waits in cudaDeviceSynchronize
    proc = _start(KERNEL_CHILD, str(work / "fault-kernel.txt"), args.cycles)
    try:
        summary["cuda_kernel"] = _dump("cuda kernel", proc.pid, work / "fault-kernel.txt", spy)
    finally:
        _end(proc)
    # 2. gloo: rank 1 in all_reduce, its peer never comes
    env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29561", "WORLD_SIZE": "2"}
    peer = subprocess.Popen(
        [sys.executable, "-c", GLOO_CHILD, str(work / "fault-gloo0.txt")],
        stdout=subprocess.DEVNULL,
        env={**os.environ, **env, "RANK": "0"},
    )
    try:
        proc = _start(GLOO_CHILD, str(work / "fault-gloo1.txt"), env={**env, "RANK": "1"})
        try:
            summary["gloo_collective"] = _dump("gloo all_reduce", proc.pid, work / "fault-gloo1.txt", spy)
        finally:
            _end(proc)
    finally:
        with contextlib.suppress(ProcessLookupError):
            peer.kill()
        peer.wait(timeout=30)
    # 3. NCCL (one rank: one GPU) with the flight recorder as the agent sets it up, a collective queued
    fr_env = {
        "TORCH_NCCL_TRACE_BUFFER_SIZE": "2000",
        "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": "29562",
    }
    mift_agent.flight_recorder_env(fr_env, work)
    proc = _start(NCCL_CHILD, str(work / "fault-nccl.txt"), args.cycles, env=fr_env)
    try:
        summary["nccl_queued"] = _dump(
            "nccl, collective queued behind a kernel", proc.pid, work / "fault-nccl.txt", spy
        )
        time.sleep(2.0)
        poked = mift_agent.poke_flight_recorder(work)
        print(f"--- flight recorder: poked {poked}", flush=True)
        dumps: list[Path] = []
        for _ in range(20):
            dumps = sorted(work.glob(mift_agent.FLIGHT_RECORDER_DUMP + "*"))
            if dumps:
                break
            time.sleep(0.5)
        time.sleep(1.0)
        summary["nccl_queued"]["flight recorder dump"] = [f"{p.name} {p.stat().st_size} B" for p in dumps]
        for path in dumps:
            print(f"--- {path.name}: {path.stat().st_size} bytes", flush=True)
            _print_trace(path)
    finally:
        _end(proc)
    print("--- files: " + ", ".join(sorted(p.name for p in work.iterdir())), flush=True)
    result("stacks", **summary)


def _print_trace(path: Path) -> None:
    import pickle  # noqa: PLC0415

    try:
        data = pickle.loads(path.read_bytes())
    except Exception as err:
        print(f"unpickle failed: {err}", flush=True)
        return
    print(f"keys: {sorted(data) if isinstance(data, dict) else type(data)}", flush=True)
    for entry in (data.get("entries") or [])[-3:] if isinstance(data, dict) else []:
        print(
            {
                k: entry.get(k)
                for k in ("collective_seq_id", "profiling_name", "state", "time_discovered_started_ns")
            },
            flush=True,
        )


# --- #31: merge ---------------------------------------------------------------------------------------------


def cmd_merge(args: argparse.Namespace) -> None:
    import torch  # noqa: PLC0415
    from peft import PeftModel  # noqa: PLC0415
    from transformers import AutoModelForCausalLM  # noqa: PLC0415

    device = args.device
    out = Path(args.out)
    shutil.rmtree(out, ignore_errors=True)
    dropped = _drop_page_cache()
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    stages: dict[str, float] = {}
    t0 = time.perf_counter()
    base = AutoModelForCausalLM.from_pretrained(args.base, dtype=torch.bfloat16, device_map=device)
    stages["load_base_s"] = time.perf_counter() - t0
    t = time.perf_counter()
    model = PeftModel.from_pretrained(base, args.adapter)
    stages["load_adapter_s"] = time.perf_counter() - t
    ids = torch.randint(0, VOCAB, (1, 8), generator=torch.Generator().manual_seed(1)).to(device)
    with torch.no_grad():
        before = model(input_ids=ids).logits.float()
    t = time.perf_counter()
    merged = model.merge_and_unload()
    if device == "cuda":
        torch.cuda.synchronize()
    stages["merge_s"] = time.perf_counter() - t
    with torch.no_grad():
        after = merged(input_ids=ids).logits.float()
    t = time.perf_counter()
    merged.save_pretrained(out, max_shard_size="5GB", safe_serialization=True)
    os.sync()
    stages["save_synced_s"] = time.perf_counter() - t
    fields: dict[str, Any] = {k: round(v, 2) for k, v in stages.items()}
    fields["total_s"] = round(sum(stages.values()), 2)  # the smoke forwards are not counted
    fields["wall_with_smoke_s"] = round(time.perf_counter() - t0, 2)
    fields["page_cache_dropped"] = dropped
    fields["peak_rss_gib"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 2)
    if device == "cuda":
        fields["peak_gpu_allocated_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
        fields["peak_gpu_reserved_gib"] = round(torch.cuda.max_memory_reserved() / 2**30, 2)
        fields["nvidia_smi_used_mib_end"] = _gpu_used_mib()
    fields["merged_gib"] = round(sum(p.stat().st_size for p in out.iterdir()) / 2**30, 2)
    fields["shards"] = len(list(out.glob("*.safetensors")))
    fields["max_abs_logit_diff"] = round(float((before - after).abs().max()), 4)
    fields["same_argmax"] = bool((before.argmax(-1) == after.argmax(-1)).all())
    result(f"merge_{device}", **fields)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("train")
    p.add_argument("--work", required=True)
    p.add_argument("--shape", default="8b", choices=sorted(SHAPES))
    p.add_argument("--micro", type=int, default=2)
    p.add_argument("--cutoff", type=int, default=1024)
    p.add_argument("--warmup", type=int, default=8)
    p.add_argument("--phases", default="off,30,1,off,30,1")
    p.add_argument("--phase-s", type=float, default=30.0)
    p.add_argument("--save-base", action="store_true")
    p.set_defaults(func=cmd_train)
    p = sub.add_parser("sampler")
    p.add_argument("period", type=float)
    p.add_argument("dir")
    p.set_defaults(func=cmd_sampler)
    p = sub.add_parser("stacks")
    p.add_argument("--work", required=True)
    p.add_argument("--cycles", default="2e11", help="GPU cycles of the spinning kernel (~100 s at 1.98 GHz)")
    p.set_defaults(func=cmd_stacks)
    p = sub.add_parser("merge")
    p.add_argument("--base", required=True)
    p.add_argument("--adapter", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--device", choices=["cuda", "cpu"], required=True)
    p.set_defaults(func=cmd_merge)
    args = parser.parse_args()
    args.func(args)


if __name__ == "__main__":
    main()
