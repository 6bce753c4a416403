#!/usr/bin/env python3
"""All-reduce bandwidth between this node and the others, round by round (``launcher check``).

Run by ``playbooks/check_allreduce.yml`` on every node at once, with the trainer's interpreter (torch, gloo on
CPU) and the job's derived ``GLOO_SOCKET_IFNAME``. Every node walks the same list of rounds (each pair, then
the ring of all nodes) and takes part in those that name it; rounds run one after the other, so no two
measurements share a link, and no round waits forever (the lowest unfinished round always has all its nodes
at it). Prints one JSON object: ``{"results": [{"hosts", "seconds", "busbw_gbs"} | {"hosts", "error"}]}``.

    VENV/bin/python3 mift_node.pyz allreduce SPEC_JSON ME

SPEC_JSON: ``{"addrs": {host: address}, "rounds": [{"hosts": [...], "port": N}], "size_mb": 8, "iters": 3,
"timeout_s": 120}``.
"""

from __future__ import annotations

import datetime
import json
import sys
import time
from typing import Any


def measure(spec: dict[str, Any], me: str) -> list[dict[str, Any]]:
    """Run the rounds that name ``me``; return one result per round."""
    import torch  # noqa: PLC0415 - the trainer's interpreter has it; the module docstring stays importable
    import torch.distributed as dist  # noqa: PLC0415

    size_bytes = int(float(spec.get("size_mb", 8)) * 1024 * 1024)
    iters = int(spec.get("iters", 3))
    timeout = datetime.timedelta(seconds=float(spec.get("timeout_s", 120)))
    results: list[dict[str, Any]] = []
    for rnd in spec["rounds"]:
        hosts = [str(h) for h in rnd["hosts"]]
        if me not in hosts:
            continue
        world, rank = len(hosts), hosts.index(me)
        master = spec["addrs"][hosts[0]]
        try:
            dist.init_process_group(
                "gloo",
                init_method=f"tcp://{master}:{int(rnd['port'])}",
                rank=rank,
                world_size=world,
                timeout=timeout,
            )
            data = torch.ones(size_bytes // 4, dtype=torch.float32)
            dist.all_reduce(data)  # warm-up: connections made
            dist.barrier()
            start = time.perf_counter()
            for _ in range(iters):
                dist.all_reduce(data)
            took = torch.tensor([(time.perf_counter() - start) / iters], dtype=torch.float64)
            dist.all_reduce(took, op=dist.ReduceOp.MAX)  # the slowest rank bounds the collective
            seconds = float(took.item())
            # bus bandwidth as rccl-tests/nccl-tests count it for all-reduce: size x 2(n-1)/n per second
            busbw = size_bytes * 2 * (world - 1) / world / seconds / 1e9
            results.append({"hosts": hosts, "seconds": round(seconds, 6), "busbw_gbs": round(busbw, 6)})
        except Exception as err:
            results.append({"hosts": hosts, "error": " ".join(str(err).split())[:300]})
        finally:
            if dist.is_initialized():
                dist.destroy_process_group()
    return results


def main(argv: list[str] | None = None) -> int:
    """Print the results of this node's rounds as one JSON object."""
    args = sys.argv[1:] if argv is None else argv
    spec, me = json.loads(args[0]), args[1]
    print(json.dumps({"results": measure(spec, me)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
