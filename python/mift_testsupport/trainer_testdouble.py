"""TEST DOUBLE of ``llamafactory-cli train`` for control-plane benchmarks only (bench/control_plane_scale.py).

The launcher's own cost (start, follow, stop, collect on many nodes) is what those benchmarks measure; a real
trainer on this 2-core machine would take the cores from it (a rank's start alone is about 19 CPU-s,
docs/measurements.md "Where a test run's CPU goes"). This program writes what LLaMA-Factory writes and the
launcher reads, at a set step time, and obeys the same signals; it computes nothing.

Installed by the benchmark on each test host in place of ``<node venv>/bin/llamafactory-cli`` (the host's
own overlay: nothing of the product changes, and a host taken down with ``rig down --purge`` forgets it).
Called as the launcher calls LLaMA-Factory, ``llamafactory-cli train TRAIN_YAML`` with torchrun's environment
(``NNODES``, ``NODE_RANK``, ``NPROC_PER_NODE``), it:

* starts ``NPROC_PER_NODE`` rank processes in their own sessions (as torchrun's workers are found: by the
  run's marker), each with ``RANK``, ``LOCAL_RANK`` and ``WORLD_SIZE``, each printing LLaMA-Factory's
  ``Process rank: R, world size: W, ...`` line;
* global rank 0 appends one ``trainer_log.jsonl`` entry per step (LLaMA-Factory's keys) to ``output_dir``,
  every ``save_steps`` a ``checkpoint-N/`` (``trainer_state.json`` last, as the Trainer saves), and at the end
  ``adapter_model.safetensors`` and ``all_results.json``; beside them ``testdouble_steps.tsv``: each step's
  number and wall time (``time.time()``), which only the benchmark reads (test hosts share the controller's
  clock);
* every rank sleeps ``MIFT_TESTDOUBLE_STEP_S`` seconds (default 1) per step, ``max_steps`` steps;
* SIGTERM or SIGINT to the parent is passed on to every rank, and the parent exits 128 + the signal when they
  are gone (torchrun's way); a rank exits on SIGTERM at once.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

STEP_S_VAR = "MIFT_TESTDOUBLE_STEP_S"
STEPS_FILE = "testdouble_steps.tsv"


def read_train_yaml(path: Path) -> dict[str, str]:
    """Return the top-level ``key: value`` pairs of a training YAML (the launcher writes it flat)."""
    found: dict[str, str] = {}
    for line in path.read_text().splitlines():
        m = re.match(r"^([A-Za-z_][A-Za-z0-9_]*):\s*(.*?)\s*(#.*)?$", line)
        if m:
            found[m.group(1)] = m.group(2).strip("'\"")
    return found


def _int(value: str | None, default: int) -> int:
    try:
        return int(str(value))
    except (TypeError, ValueError):
        return default


def log_entry(step: int, total: int, t0: float) -> dict[str, Any]:
    """One ``trainer_log.jsonl`` line as LLaMA-Factory's LogCallback writes it."""
    elapsed = int(time.time() - t0)
    return {
        "current_steps": step,
        "total_steps": total,
        "loss": round(6.0 - 5.0 * step / max(total, 1), 4),
        "lr": 1e-3,
        "epoch": round(step / max(total, 1), 2),
        "percentage": round(100 * step / max(total, 1), 2),
        "elapsed_time": f"{elapsed // 3600}:{elapsed // 60 % 60:02d}:{elapsed % 60:02d}",
        "remaining_time": "0:00:00",
        "throughput": 100.0,
        "total_tokens": 64 * step,
    }


def save_checkpoint(output_dir: Path, step: int) -> None:
    """``checkpoint-N/``: the adapter first, ``trainer_state.json`` last (what makes it complete)."""
    folder = output_dir / f"checkpoint-{step}"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "adapter_model.safetensors").write_bytes(b"testdouble")
    (folder / "trainer_state.json").write_text(json.dumps({"global_step": step}))


def rank_main(rank: int, output_dir: Path, steps: int, save_steps: int, step_s: float) -> int:
    """One rank: its join line, then ``steps`` steps; rank 0 logs and saves."""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    world = os.environ.get("WORLD_SIZE", "1")
    print(f"Process rank: {rank}, world size: {world}, device: cpu, distributed training: True", flush=True)
    t0 = time.time()
    if rank == 0:
        output_dir.mkdir(parents=True, exist_ok=True)
    for step in range(1, steps + 1):
        time.sleep(step_s)
        if rank != 0:
            continue
        entry = log_entry(step, steps, t0)
        with (output_dir / "trainer_log.jsonl").open("a") as fh:
            fh.write(json.dumps(entry) + "\n")
        with (output_dir / STEPS_FILE).open("a") as fh:
            fh.write(f"{step}\t{time.time():.3f}\n")
        print(f"{{'loss': {entry['loss']}, 'epoch': {entry['epoch']}}}", flush=True)
        if save_steps and step % save_steps == 0:
            save_checkpoint(output_dir, step)
    if rank == 0:
        (output_dir / "adapter_model.safetensors").write_bytes(b"testdouble")
        (output_dir / "all_results.json").write_text(json.dumps({"train_runtime": time.time() - t0}))
    return 0


def parent_main(train_yaml: Path) -> int:
    """torchrun's part: start the ranks, pass signals on, exit with the first failure (or 0)."""
    cfg = read_train_yaml(train_yaml)
    output_dir = Path(cfg.get("output_dir") or "output")
    if not output_dir.is_absolute():
        output_dir = Path.cwd() / output_dir
    steps = _int(cfg.get("max_steps"), 8)
    save_steps = _int(cfg.get("save_steps"), 0)
    step_s = float(os.environ.get(STEP_S_VAR, "1"))
    nproc = _int(os.environ.get("NPROC_PER_NODE"), 1)
    node_rank = _int(os.environ.get("NODE_RANK"), 0)
    world = _int(os.environ.get("NNODES"), 1) * nproc
    ranks = []
    for local in range(nproc):
        rank = node_rank * nproc + local
        env = {**os.environ, "RANK": str(rank), "LOCAL_RANK": str(local), "WORLD_SIZE": str(world)}
        argv = [sys.executable, __file__, "--rank", str(rank), str(output_dir), str(steps), str(save_steps)]
        ranks.append(subprocess.Popen([*argv, str(step_s)], env=env, start_new_session=True))

    got: list[int] = []

    def forward(signum: int, _frame: object) -> None:
        # no wait here: the main thread's wait holds the Popen lock; it sees the ranks end
        got.append(signum)
        for proc in ranks:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGTERM)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    codes = [proc.wait() for proc in ranks]
    if got:
        return 128 + got[0]
    return next((c for c in codes if c != 0), 0)


def main(argv: list[str]) -> int:
    if argv[:1] == ["--rank"]:
        rank, output_dir, steps, save_steps, step_s = argv[1:6]
        return rank_main(int(rank), Path(output_dir), int(steps), int(save_steps), float(step_s))
    if argv[:1] != ["train"] or len(argv) != 2:
        print("trainer test double: usage: llamafactory-cli train TRAIN_YAML", file=sys.stderr)
        return 2
    return parent_main(Path(argv[1]))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
