"""``check JOB``: accept the job's nodes and the links between them before a run (launcher.engine.check)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import argparse

    from launcher.exit_codes import ExitCode


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    """Add the ``check`` subcommand."""
    from launcher.fabric import links  # noqa: PLC0415

    p = subparsers.add_parser(
        "check",
        help="accept the job's nodes and links (fabric env, RDMA ports, GPUs, all-reduce per pair)",
        description=(
            "Probe every node of the job (read-only), derive its NCCL/Gloo environment, judge its RDMA "
            "ports, GID index, ECC, PCIe and firmware, measure every GPU (bf16 matmul, copy bandwidth; "
            "nodes whose torch has a GPU backend), then the fabric: on GPU nodes a GPU all-reduce "
            "(NCCL/RCCL, one process per GPU) inside each node and across nodes over a sweep of sizes, with "
            "all_reduce_perf and ib_write_bw beside it where installed; on CPU nodes the all-reduce over TCP "
            "(gloo). Pairs run in rounds of disjoint pairs side by side. One table of links, slow ones "
            "flagged, one line per bad node, link or tool output. Figures are cached per boot and node set; "
            "plan: auto uses only the GPU ones. Exit code: 0 passed, 1 something is bad, 2 bad input."
        ),
    )
    p.add_argument("job", type=Path, help="job spec (its hosts, env and fabric policy)")
    p.add_argument("-i", "--inventory", type=Path, default=None, help="Ansible inventory")
    p.add_argument("--fresh", action="store_true", help="measure the links even when this boot has a result")
    p.add_argument(
        "--min-gbs",
        type=float,
        default=links.MIN_GBS,
        help=f"a link below this bus bandwidth (GB/s) is slow whatever the others do ({links.MIN_GBS})",
    )
    p.add_argument(
        "--size-mb", type=float, default=links.SIZE_MB, help=f"MiB per all-reduce (default {links.SIZE_MB:g})"
    )
    p.add_argument("--no-gpu-tools", action="store_true", help="do not run amd-smi on the nodes")
    p.add_argument(
        "--no-gpu-test", action="store_true", help="do not measure the GPUs (matmul, copy bandwidth)"
    )
    p.add_argument("--gpu-min-tflops", type=float, default=0.0, help="bf16 matmul floor per GPU (0: none)")
    p.add_argument(
        "--gpu-min-membw-gbs", type=float, default=0.0, help="copy bandwidth floor per GPU (0: none)"
    )
    p.add_argument(
        "--fabric",
        choices=("auto", "gpu", "tcp"),
        default="auto",
        help="what the link test measures: the GPUs' all-reduce (gpu), gloo over TCP (tcp), or gpu when "
        "every node has a GPU backend (auto, the default)",
    )
    p.add_argument(
        "--gpu-max-mib",
        type=int,
        default=1024,
        help="largest all-reduce of the GPU sweep, MiB (from 1 MiB, doubling; default 1024)",
    )
    p.add_argument("--json", action="store_true", help='one JSON object (docs/launcher.md "JSON output")')
    p.set_defaults(func=_cmd_check)
    return p


def _cmd_check(args: argparse.Namespace) -> ExitCode:
    from launcher.engine.check import run_check  # noqa: PLC0415

    return run_check(
        args.job,
        inventory=args.inventory,
        fresh=args.fresh,
        min_gbs=args.min_gbs,
        size_mb=args.size_mb,
        gpu_tools=not args.no_gpu_tools,
        gpu_test=not args.no_gpu_test,
        gpu_min_tflops=args.gpu_min_tflops,
        gpu_min_membw_gbs=args.gpu_min_membw_gbs,
        fabric=args.fabric,
        gpu_max_mib=args.gpu_max_mib,
        as_json=args.json,
    )
