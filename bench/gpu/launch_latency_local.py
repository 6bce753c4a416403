"""Launch latency where the controller is the node (the lent GPU machine, ``inventory/gpu-local``).

Times ``python -m launcher run JOB -i inventory/gpu-local --detach`` from the command to its
``started on N nodes`` line, for this tree and another (``--compare DIR``: e.g. a ``git archive`` of an older
main), alternating, ``--repeat`` times each, each run stopped with ``launcher stop`` once started. The
job: LoRA SFT of the tiny model (``tools/make_tiny_model.py``, made once into ``--work``) with ``max_steps``
high enough to be still running, no DeepSpeed, one process. Prints one line per run and a table of medians.
The ssh-based bench (``bench/launch_latency.py``) cannot run here: the node is this machine
(``ansible_connection: local``).

    python bench/gpu/launch_latency_local.py --compare /tmp/old --repeat 3 --work /tmp/latency
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
STARTED = re.compile(r"^started on \d+ nodes")
RUN_ID = re.compile(r"^run (\S+): ")


def write_job(work: Path) -> Path:
    """Write the tiny model, dataset, training YAML and job spec under ``work``; return the spec."""
    model, data = work / "tiny-llama", work / "data"
    if not (model / "config.json").exists():
        subprocess.run(
            [
                sys.executable,
                str(REPO / "tools" / "make_tiny_model.py"),
                str(model),
                "--dataset-dir",
                str(data),
            ],
            check=True,
        )
    train = (REPO / "configs" / "train" / "tiny_cpu_lora_sft.yaml").read_text()
    train = train.replace("/opt/mift/models/tiny-llama", str(model)).replace(
        "/opt/mift/data/tiny_alpaca", str(data)
    )
    train = train.replace("max_steps: 8", "max_steps: 100000").replace("save_steps: 4", "save_steps: 100000")
    (work / "train.yaml").write_text(train)
    job = work / "job.yaml"
    job.write_text(
        "name: latency\ntrain_config: train.yaml\ndeepspeed: none\nnproc_per_node: 1\nmaster_port: 29517\n"
        f"output_dir: {work}/out/{{run_id}}\n"
    )
    return job


def one_run(tree: Path, job: Path, runs: Path, inventory: Path) -> tuple[float, float, str]:
    """Return (seconds to `started on`, seconds to exit, run id) of one `run --detach` of ``tree``."""
    env = {**os.environ, "MIFT_RUNS_DIR": str(runs)}
    env["PYTHONPATH"] = os.pathsep.join([str(tree / "python"), *filter(None, [os.environ.get("PYTHONPATH")])])
    argv = [sys.executable, "-m", "launcher", "run", str(job), "-i", str(inventory), "--detach"]
    t0 = time.monotonic()
    proc = subprocess.Popen(
        argv, cwd=tree, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    started, run_id, lines = float("nan"), "", []
    assert proc.stdout is not None
    for line in proc.stdout:
        lines.append(line)
        if m := RUN_ID.match(line):
            run_id = m.group(1)
        if STARTED.match(line) and started != started:  # first time only (nan != nan)
            started = time.monotonic() - t0
    rc = proc.wait(timeout=600)
    ended = time.monotonic() - t0
    if rc != 0 or not run_id:
        raise SystemExit(f"{tree}: launcher run failed (rc={rc}):\n{''.join(lines)[-3000:]}")
    stop = subprocess.run(
        [sys.executable, "-m", "launcher", "stop", run_id],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    if stop.returncode not in (0, 1):
        raise SystemExit(
            f"{tree}: launcher stop {run_id} failed (rc={stop.returncode}): {stop.stderr[-1000:]}"
        )
    return started, ended, run_id


def main() -> int:
    """Run the comparison and print it."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--compare", type=Path, required=True, help="the other tree (its python/ is used)")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--work", type=Path, default=Path("/tmp/mift-latency-local"))
    parser.add_argument(
        "-i", "--inventory", type=Path, default=REPO / "inventory" / "gpu-local" / "hosts.yml"
    )
    args = parser.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    job = write_job(args.work)
    results: dict[str, list[float]] = {"this": [], "compare": []}
    for i in range(args.repeat):
        for tag, tree in (("this", REPO), ("compare", args.compare.resolve())):
            started, ended, run_id = one_run(tree, job, args.work / f"runs-{tag}", args.inventory)
            results[tag].append(started)
            print(
                f"run {i + 1}/{args.repeat} {tag}: started on 1 node after {started:.1f} s, "
                f"`run --detach` returned after {ended:.1f} s ({run_id})",
                flush=True,
            )
    print("\n| launcher | runs | started (each, s) | median started |\n|---|---|---|---|")
    for tag, values in results.items():
        each = ", ".join(f"{v:.1f}" for v in values)
        print(f"| {tag} | {len(values)} | {each} | {statistics.median(values):.1f} s |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
