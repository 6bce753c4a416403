"""Test double for ``llamafactory-cli train``: logs steps to trainer_log.jsonl like LLaMA-Factory does.

Usage: fake_trainer.py OUTPUT_DIR [--steps N] [--step-s S] [--fail-at K] [--worker]
   or: fake_trainer.py train TRAIN_YAML   (as ``llamafactory-cli``: output_dir from the YAML, the rest from
       FAKE_STEPS, FAKE_STEP_S, FAKE_FAIL_AT; only rank 0 (NODE_RANK 0) logs and saves, like LLaMA-Factory)
FAKE_NCCL_LOG: a file of real RCCL/NCCL init lines (tests/fixtures/nccl) every rank prints after it joined, as
RCCL does when its communicator is set up with NCCL_DEBUG=INFO.
Like torchrun, it starts one "worker" child in a new session (so only the run marker finds it), writes one
trainer_log.jsonl line per step, and at the end writes adapter_model.safetensors and all_results.json.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path


def _as_cli(train_yaml: str) -> list[str]:
    """Translate ``train TRAIN_YAML`` into this script's options."""
    import yaml  # noqa: PLC0415 - only in the llamafactory-cli role

    cfg = yaml.safe_load(Path(train_yaml).read_text())
    args = [
        str(cfg["output_dir"]),
        "--steps",
        os.environ.get("FAKE_STEPS", "5"),
        "--step-s",
        os.environ.get("FAKE_STEP_S", "0.3"),
        "--fail-at",
        os.environ.get("FAKE_FAIL_AT", "0"),
    ]
    if os.environ.get("NODE_RANK", "0") != "0":
        args.append("--follower")
    return args


def main() -> int:
    argv = sys.argv[1:]
    if argv[:1] == ["train"]:
        argv = _as_cli(argv[1])
    parser = argparse.ArgumentParser()
    parser.add_argument("output_dir", type=Path)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--step-s", type=float, default=0.2)
    parser.add_argument("--fail-at", type=int, default=0)
    parser.add_argument("--worker", action="store_true")
    parser.add_argument("--follower", action="store_true", help="a non-zero node: no log, no outputs")
    args = parser.parse_args(argv)
    if args.worker:  # the detached "rank": just lives until killed
        time.sleep(3600)
        return 0
    worker = subprocess.Popen(
        [sys.executable, __file__, str(args.output_dir), "--worker"], start_new_session=True
    )
    rank = int(os.environ.get("NODE_RANK", "0"))
    print(f"Process rank: {rank}, world size: 2, device: cpu, distributed training: True", flush=True)
    if os.environ.get("FAKE_NCCL_LOG"):
        print(Path(os.environ["FAKE_NCCL_LOG"]).read_text(), end="", flush=True)
    args.output_dir.mkdir(parents=True, exist_ok=True)
    log = args.output_dir / ("follower.jsonl" if args.follower else "trainer_log.jsonl")
    t0 = time.time()
    for step in range(1, args.steps + 1):
        time.sleep(args.step_s)
        if step == args.fail_at:
            print("fake trainer: failing on purpose", flush=True)
            worker.kill()
            return 3
        entry = {
            "current_steps": step,
            "total_steps": args.steps,
            "loss": round(6.0 - 0.1 * step, 4),
            "lr": 1e-3,
            "epoch": step / args.steps,
            "percentage": 100 * step / args.steps,
            "elapsed_time": f"0:00:{int(time.time() - t0):02d}",
            "remaining_time": "0:00:01",
            "throughput": 100.0,
        }
        with log.open("a") as fh:
            fh.write(json.dumps(entry) + "\n")
        print(f"{{'loss': {entry['loss']}}}", flush=True)
    if args.follower:
        worker.kill()
        return 0
    (args.output_dir / "adapter_model.safetensors").write_bytes(b"fake")
    (args.output_dir / "all_results.json").write_text(
        json.dumps({"train_runtime": time.time() - t0, "train_loss": 5.8})
    )
    worker.kill()
    worker.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
