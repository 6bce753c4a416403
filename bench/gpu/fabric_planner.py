"""The planner reading what ``launcher check`` measured on this machine (bench/gpu/fabric_check.sh, #42).

Builds the node facts preflight gives ``plan: auto`` for ``inventory/gpu-local`` (the host, its
``train_address``, this boot's ``boot_id``: the cache key), prints the GPU record's figures as the planner
reads them (:func:`launcher.fabric.gpulinks.intra_node`, ``inter_node``), then the accelerator and the notes
that :func:`launcher.engine.split.measured_links` gives at this machine's GPU count, and again as if the node
had 8 GPUs (the record measured one: the planner must fall back to the preset and say why).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from launcher.engine.split import measured_links
from launcher.fabric import gpulinks, links
from launcher.planning.hardware import MI300X, accelerator_named
from launcher.preflight.checks import NodeFacts

HOST, ADDRESS = "gpu-local", "127.0.0.1"


def main() -> int:
    """Print the record's figures and the planner's reading of them."""
    boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    probe = {HOST: {"net": {"boot_id": boot}}}
    key = links.cache_key([HOST], {HOST: ADDRESS}, probe)
    record = gpulinks.load(str(key)) if key else None
    print(f"cache key {key}: {gpulinks.cache_path(str(key)) if key else '-'}")
    if record is None:
        print("no GPU record for this node and boot")
        return 1
    gpus = max(record.get("gpus", {}).values() or [1])
    print(f"record: {record['library']}, GPUs {record['gpus']}, transport {record['transport']}")
    print(f"intra_node(record) = {gpulinks.intra_node(record)}")
    print(f"inter_node(record) = {gpulinks.inter_node(record)}")
    names = [n for ns in (record.get("gpu_names") or {}).values() for n in ns]
    name = names[0] if names else ""
    for nproc in (gpus, 8):
        facts = NodeFacts(
            hosts=[HOST],
            train_address={HOST: ADDRESS},
            stack={},
            gpus={},
            probe=probe,
            nproc_per_node=nproc,
        )
        base = accelerator_named(name, default=MI300X)
        used = measured_links(base, facts)
        print(f"\n--- plan: auto on this node with nproc_per_node {nproc} (accelerator model {base.name})")
        print(
            json.dumps(
                {
                    "intra_node_gbs": used.intra_node_gbs,
                    "inter_node_gbs": used.inter_node_gbs,
                    "changed": (used.intra_node_gbs, used.inter_node_gbs)
                    != (base.intra_node_gbs, base.inter_node_gbs),
                }
            )
        )
        for note in facts.notes or ["(no note: one node of one GPU has no collective between GPUs)"]:
            print(f"note: {note}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
