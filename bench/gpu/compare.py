"""Re-estimate recorded GPU runs with the current planner and print estimate vs measured side by side.

Usage: python bench/gpu/compare.py bench/gpu/results/results_3b.json [...]
(the bench models are make_assets.py's shapes with its 4004-token vocabulary, untied embeddings).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "python"))

from launcher.planning.memory import GIB, Cluster, Workload  # noqa: E402
from launcher.planning.model import ModelShape  # noqa: E402
from launcher.planning.training import plan_training  # noqa: E402

SHAPES = {
    "3b": ModelShape(hidden=3072, intermediate=8192, layers=28, heads=24, kv_heads=8, vocab=4004),
    "8b": ModelShape(hidden=4096, intermediate=14336, layers=32, heads=32, kv_heads=8, vocab=4004),
}


def main() -> None:
    for arg in sys.argv[1:]:
        data = json.loads(Path(arg).read_text())
        inputs = data["plan"]["inputs"]
        shape = SHAPES[data["shape"]]
        work = Workload(shape, "lora", micro_batch=inputs["micro_batch"], cutoff_len=inputs["cutoff_len"])
        cluster = Cluster(1, 1, inputs["gpu_mem_gib"], inputs["host_mem_gib"])
        plan = plan_training(work, cluster, accumulation=1, fixed_split=True)
        est = {c.strategy.value: c.estimate for c in plan.candidates}
        best = max((r["tokens_per_s"] or 0) for r in data["runs"])
        pick = plan.choice.strategy.value if plan.choice else None
        print(f"\n{data['shape']}: {shape.total_params() / 1e9:.2f} B params; planner pick now: {pick}")
        print(
            "| strategy | est GPU MiB | peak nvidia-smi MiB | est/measured | tokens/s | vs best "
            "| start-up s |"
        )
        print("|---|---|---|---|---|---|---|")
        for r in data["runs"]:
            e = est[r["strategy"].partition("@")[0]]
            mib = e.gpu_total / GIB * 1024
            tps = r["tokens_per_s"] or 0
            print(
                f"| {r['strategy']} | {mib:.0f} | {r['peak_smi_mib']} | {mib / r['peak_smi_mib']:.2f} | "
                f"{tps:.0f} | {tps / best:.0%} | {r['startup_s']} |"
            )


if __name__ == "__main__":
    main()
