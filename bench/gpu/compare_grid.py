"""Re-estimate every run of bench/gpu/plan_grid.py with the planner as it is now, next to what was measured.

usage: python bench/gpu/compare_grid.py bench/gpu/results/grid*/plan_grid_*.json

Prints one table per shape: each run's configuration, the current planner's memory estimate and predicted
tokens/s for it, the measured nvidia-smi peak, steady-state tokens/s (optimizer steps 2..N), MFU against the
session's measured bf16 peak, LLaMA-Factory's effective tokens/s (all steps), and the checks of issue #16.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "python"))

from launcher.planning.calibration import H200_CLUSTER, SHAPES  # noqa: E402
from launcher.planning.hardware import H200  # noqa: E402
from launcher.planning.memory import Strategy  # noqa: E402
from launcher.planning.training import Split  # noqa: E402
from launcher.planning.training_yaml import plan_training_from_yaml  # noqa: E402

TRAIN = {
    "per_device_train_batch_size": 2,
    "gradient_accumulation_steps": 8,
    "cutoff_len": 1024,
    "flash_attn": "sdpa",
}


def parse(ran: str) -> tuple[Strategy, Split]:
    """Return the strategy and split of a row's ``ran`` (``none mb16x1 nock``)."""
    strategy, split, ck = ran.split()
    micro, accumulation = (int(x) for x in split.removeprefix("mb").split("x"))
    return Strategy(strategy), Split(micro, accumulation, ck == "ck")


def main() -> None:
    rows: dict[str, list[dict[str, Any]]] = {}
    for name in sys.argv[1:]:
        data = json.loads(Path(name).read_text())
        for run in data["runs"]:
            if run.get("not_run"):
                continue
            run["session"] = Path(name).parent.name
            run["peak_tflops"] = data["peak_tflops"]
            rows.setdefault(data["shape"], []).append(run)
    for shape, runs in rows.items():
        plan = plan_training_from_yaml(SHAPES[shape], TRAIN, H200_CLUSTER, accelerator=H200)
        choice = plan.choice
        assert choice is not None
        print(f"\n{shape}: planner now: {choice.describe()}")
        print(
            "| session | config | ran | est GPU MiB (now) | peak nvidia-smi MiB | est/measured | "
            "predicted tokens/s (now) | steady tokens/s | MFU | effective tokens/s | status |"
        )
        print("|" + "---|" * 11)
        for r in runs:
            strategy, split = parse(r["ran"])
            cand = next(c for c in plan.candidates if c.strategy is strategy and c.split == split)
            est = cand.estimate.gpu_total / 2**20
            peak = r.get("peak_smi_mib")
            steady = r.get("steady_tokens_per_s")
            eff = r.get("tokens_per_s")
            mark = " **(plan)**" if (strategy, split) == (choice.strategy, choice.split) else ""
            cells = [
                r["session"],
                r["config"],
                r["ran"] + mark,
                f"{est:.0f}",
                str(peak),
                f"{est / peak:.2f}" if peak else "-",
                f"{cand.tokens_per_s:.0f}",
                str(steady or "-"),
                f"{r['mfu']:.1%}" if r.get("mfu") else "-",
                f"{eff:.0f}" if eff else "-",
                f"{r.get('status')} rc {r['rc']}",
            ]
            print("| " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
