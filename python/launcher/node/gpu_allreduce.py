#!/usr/bin/env python3
"""GPU all-reduce bandwidth inside this node and across nodes, through torch.distributed's NCCL backend (RCCL
on ROCm), one process per GPU (``launcher check`` on GPU nodes).

Run by ``playbooks/check_allreduce.yml`` on every node at once, with the trainer's interpreter and the job's
derived NCCL environment (``NCCL_SOCKET_IFNAME``, ``NCCL_IB_HCA``, ``NCCL_IB_GID_INDEX``). This process stays
stdlib-only: it asks a child interpreter how many GPUs torch sees, then forks one worker per GPU for each
measurement (a forked child of a process that never imported torch initialises its GPU cleanly).

1. Intra-node: every GPU of this node, on loopback, over the sweep of sizes (default 1 MiB to 1 GiB, x2).
2. ``all_reduce_perf`` (rccl-tests / nccl-tests) over the same sizes, when the node has it (``$PATH``,
   ``$MIFT_ALL_REDUCE_PERF``, /opt/rccl-tests/build, /opt/nccl-tests/build): its output goes back as text, the
   controller parses it.
3. Inter-node: the groups of the spec that name this node, in order (rounds of disjoint pairs, then all
nodes):
   every GPU of each node in the group, ranks node by node; after a pair's sweep, ``ib_write_bw`` (perftest)
   per pair of RDMA ports (port i of the first node with port i of the second), when both have it.

Figures as nccl-tests defines them (doc/PERFORMANCE.md of NVIDIA/nccl-tests): ``algbw = S / t`` (bytes per
second / 1e9), ``busbw = algbw * 2(n-1)/n`` for all-reduce, n the ranks; t the slowest rank's mean over the
timed iterations after the warm-ups. One GPU gives busbw 0 (no link between GPUs): the answer says what it
could not measure. Prints one JSON object on stdout (the workers' and tools' output goes to files, never
there).

    VENV/bin/python3 - SPEC_JSON ME < mift_gpu_allreduce.py

SPEC_JSON: ``{"addrs": {host: address}, "rounds": [{"round", "hosts", "port"}], "intra_port": N, "sizes":
[bytes, ...], "iters": 20, "warmup": 5, "timeout_s": 300, "tools": {"all_reduce_perf": true, "ib_write_bw":
{"ports": {host: [{"device", "port"}]}, "gid_index": {host: N}, "seconds": 2}}}``.
"""

from __future__ import annotations

import datetime
import json
import multiprocessing
import os
import queue as queue_module
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Callable
    from multiprocessing.queues import Queue as _Queue

MIB = 1024 * 1024
DEFAULT_SIZES = [MIB << i for i in range(11)]  # 1 MiB .. 1 GiB
TAIL = 24_000  # characters of a tool's output sent back
PERF_PATHS = ("/opt/rccl-tests/build/all_reduce_perf", "/opt/nccl-tests/build/all_reduce_perf")


def _tail(path: Path) -> str:
    try:
        return path.read_text(errors="replace")[-TAIL:]
    except OSError:
        return ""


def probe_torch() -> dict[str, Any]:
    """Return what torch sees (GPUs, names, versions), asked in a child so that this process never imports
    it."""
    code = (
        "import json, torch\n"
        "n = torch.cuda.device_count() if torch.cuda.is_available() else 0\n"
        "nccl = getattr(torch.cuda, 'nccl', None)\n"
        "try:\n    ver = '.'.join(map(str, nccl.version())) if n and nccl else ''\n"
        "except Exception:\n    ver = ''\n"
        "print(json.dumps({'gpus': n, 'names': [torch.cuda.get_device_name(i) for i in range(n)],"
        " 'torch': torch.__version__, 'hip': bool(getattr(torch.version, 'hip', None)),"
        " 'nccl_version': ver}))\n"
    )
    try:
        proc = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, timeout=180, check=False
        )
    except subprocess.TimeoutExpired:
        return {"gpus": 0, "error": "torch did not answer within 180 s"}
    if proc.returncode != 0:
        lines = (proc.stderr or proc.stdout).strip().splitlines() or [f"exit status {proc.returncode}"]
        return {"gpus": 0, "error": lines[-1][:300]}
    return dict(json.loads(proc.stdout.strip().splitlines()[-1]))


def _sweep(spec: dict[str, Any], world: int, device: str, sync: Callable[[], None]) -> list[dict[str, Any]]:
    """Time the all-reduce at each size of the spec (warm-ups, then the mean of the timed iterations, the
    slowest rank's); return one row per size: bytes, time, algbw and busbw as nccl-tests defines them."""
    import torch  # noqa: PLC0415 - imported in the forked worker only
    import torch.distributed as dist  # noqa: PLC0415

    sizes = [int(s) for s in spec.get("sizes") or DEFAULT_SIZES]
    iters, warmup = int(spec.get("iters", 20)), int(spec.get("warmup", 5))
    buf = torch.zeros(max(sizes) // 4, dtype=torch.float32, device=device)
    rows = []
    for size in sizes:
        data = buf[: size // 4]
        for _ in range(warmup):
            dist.all_reduce(data)
        sync()
        dist.barrier()
        start = time.perf_counter()
        for _ in range(iters):
            dist.all_reduce(data)
        sync()
        took = torch.tensor([(time.perf_counter() - start) / iters], dtype=torch.float64, device=device)
        dist.all_reduce(took, op=dist.ReduceOp.MAX)  # the slowest rank bounds the collective
        seconds = float(took.item())
        algbw = size / seconds / 1e9
        rows.append(
            {
                "bytes": size,
                "time_us": round(seconds * 1e6, 2),
                "algbw_gbs": round(algbw, 3),
                "busbw_gbs": round(algbw * 2 * (world - 1) / world, 3),
            }
        )
    del buf
    return rows


def _worker(
    local_rank: int,
    rank: int,
    world: int,
    *,
    init: str,
    spec: dict[str, Any],
    log: str,
    queue: _Queue[dict[str, Any]],
) -> None:
    """One rank: the sweep on GPU ``local_rank``; the first rank of the node puts the rows on ``queue``.

    With ``spec["test_double_cpu_ranks"]`` (TEST DOUBLE of the GPUs, for the unit tests on a machine without
    one) the ranks are CPU processes on gloo; everything else is the same code.
    """
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    answer: dict[str, Any] = {"rank": rank}
    try:
        import torch  # noqa: PLC0415 - imported in the forked worker only
        import torch.distributed as dist  # noqa: PLC0415

        cpu = bool(spec.get("test_double_cpu_ranks"))
        device = "cpu" if cpu else "cuda"

        def sync() -> None:
            if not cpu:
                torch.cuda.synchronize()

        if not cpu:
            torch.cuda.set_device(local_rank)
        timeout = datetime.timedelta(seconds=float(spec.get("timeout_s", 300)))
        backend = "gloo" if cpu else "nccl"
        dist.init_process_group(backend, init_method=init, rank=rank, world_size=world, timeout=timeout)
        rows = _sweep(spec, world, device, sync)
        check = torch.full((1024,), float(rank + 1), dtype=torch.float32, device=device)
        dist.all_reduce(check)
        expected = world * (world + 1) / 2
        wrong = int((check != expected).sum().item())
        del check
        answer.update(rows=rows, world=world, wrong=wrong)
    except Exception as err:  # the answer names it
        answer["error"] = " ".join(f"{type(err).__name__}: {err}".split())[:400]
    finally:
        try:
            import torch.distributed as dist  # noqa: PLC0415

            if dist.is_initialized():
                dist.destroy_process_group()
        except Exception:  # noqa: S110 - nothing left to report
            pass
    if local_rank == 0 or "error" in answer:
        queue.put(answer)


def collective(
    gpus: int, *, node_index: int, nodes: int, master: str, port: int, spec: dict[str, Any], work: Path
) -> dict[str, Any]:
    """Run one all-reduce group with this node's ``gpus`` GPUs as ranks ``node_index * gpus ...``; return the
    first local rank's rows, or the first error (a worker that does not answer in time is killed:
    ``hung``)."""
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    world = nodes * gpus
    init = f"tcp://{master}:{port}"
    log = work / f"nccl-{port}.log"
    procs = [
        ctx.Process(
            target=_worker,
            args=(i, node_index * gpus + i, world),
            kwargs={"init": init, "spec": spec, "log": str(log), "queue": queue},
            daemon=True,
        )
        for i in range(gpus)
    ]
    for proc in procs:
        proc.start()
    timeout = float(spec.get("timeout_s", 300))
    deadline = time.monotonic() + timeout + 30
    good: dict[str, Any] | None = None
    error: str | None = None
    while time.monotonic() < deadline:
        try:
            got = queue.get(timeout=1)
        except queue_module.Empty:  # look again, unless every worker is gone
            if not any(p.is_alive() for p in procs):
                break
            continue
        if "error" in got:
            error = str(got["error"])
        else:
            good = got
        break
    settle = time.monotonic() + 20
    for proc in procs:
        proc.join(timeout=max(0.1, settle - time.monotonic()))
    hung = [p for p in procs if p.is_alive()]
    for proc in hung:
        proc.kill()
        proc.join(5)
    if good is not None and error is None:
        return {"world": world, "rows": good["rows"], "wrong": good["wrong"]}
    if error is None:
        error = (
            f"hung: no answer within {timeout:.0f} s (workers killed)"
            if hung
            else "workers exited without answer"
        )
    tail = _tail(log).strip().splitlines()[-3:]
    return {"world": world, "error": error, "log_tail": tail}


def _perf_path() -> str | None:
    for candidate in (os.environ.get("MIFT_ALL_REDUCE_PERF"), shutil.which("all_reduce_perf"), *PERF_PATHS):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    return None


def run_tool(argv: list[str], timeout: float, log: Path) -> dict[str, Any]:
    """Run a benchmark tool; return its exit status, whether it was killed at ``timeout``, its output's
    tail."""
    with log.open("w") as out:
        try:
            proc = subprocess.run(argv, stdout=out, stderr=subprocess.STDOUT, timeout=timeout, check=False)
            rc, timed_out = proc.returncode, False
        except subprocess.TimeoutExpired:
            rc, timed_out = 124, True
        except OSError as err:
            out.write(f"{err}\n")
            rc, timed_out = 127, False
    return {"argv": argv, "rc": rc, "timed_out": timed_out, "timeout_s": timeout, "output": _tail(log)}


def all_reduce_perf(gpus: int, spec: dict[str, Any], work: Path) -> dict[str, Any]:
    """Run ``all_reduce_perf`` over this node's GPUs and the spec's sizes (one process, ``-g GPUS``)."""
    path = _perf_path()
    if path is None:
        return {"missing": True}
    sizes = [int(s) for s in spec.get("sizes") or DEFAULT_SIZES]
    argv = [path, "-b", str(min(sizes)), "-e", str(max(sizes)), "-f", "2", "-g", str(gpus)]
    return run_tool(argv, float(spec.get("timeout_s", 300)), work / "all_reduce_perf.log")


def ib_write_bw(rnd: dict[str, Any], me: str, spec: dict[str, Any], work: Path) -> list[dict[str, Any]]:
    """Run ``ib_write_bw`` for each pair of RDMA ports of a pair group: the group's first node serves, the
    second is the client (it retries while the server is not yet listening)."""
    tool = (spec.get("tools") or {}).get("ib_write_bw")
    if not tool or len(rnd["hosts"]) != 2 or shutil.which("ib_write_bw") is None:
        return []
    first, second = rnd["hosts"]
    ports = tool.get("ports") or {}
    pairs = list(zip(ports.get(first) or [], ports.get(second) or [], strict=False))
    seconds = int(tool.get("seconds", 2))
    out = []
    for i, (a, b) in enumerate(pairs):
        mine = a if me == first else b
        gid = (tool.get("gid_index") or {}).get(me)
        argv = ["ib_write_bw", "-d", str(mine["device"]), "-i", str(mine["port"]), "-F", "--report_gbits"]
        argv += ["-D", str(seconds), "-p", str(int(rnd["port"]) + 1000 + i)]
        argv += ["-x", str(gid)] if gid is not None else []
        log = work / f"ib-{rnd['port']}-{i}.log"
        if me == first:
            result = run_tool(argv, seconds + 40, log)
        else:
            argv.append(str(spec["addrs"][first]))
            deadline = time.monotonic() + 20
            while True:
                result = run_tool(argv, seconds + 20, log)
                if result["rc"] == 0 or result["timed_out"] or time.monotonic() > deadline:
                    break
                time.sleep(0.5)
        out.append(
            {
                "hosts": [first, second],
                "side": "server" if me == first else "client",
                "ports": [f"{a['device']}/{a['port']}", f"{b['device']}/{b['port']}"],
                **result,
            }
        )
    return out


def measure(spec: dict[str, Any], me: str) -> dict[str, Any]:
    """Run this node's part of the check; return its answer."""
    double = int(spec.get("test_double_cpu_ranks") or 0)
    seen: dict[str, Any] = (
        {"gpus": double, "names": ["TEST DOUBLE: CPU rank"] * double} if double else probe_torch()
    )
    gpus = int(seen.get("gpus") or 0)
    answer: dict[str, Any] = {
        "transport": "gpu",
        "library": "gloo (TEST DOUBLE)" if double else "RCCL" if seen.get("hip") else "NCCL",
        "torch": seen,
        "gpus": gpus,
        "results": [],
        "ib_write_bw": [],
        "not_measured": [],
    }
    if gpus == 0:
        answer["error"] = seen.get("error") or "no GPU visible to torch"
        return answer
    with tempfile.TemporaryDirectory(prefix="mift-gpu-allreduce-") as tmp:
        work = Path(tmp)
        t0 = time.monotonic()
        answer["intra"] = collective(
            gpus,
            node_index=0,
            nodes=1,
            master="127.0.0.1",
            port=int(spec["intra_port"]),
            spec=spec,
            work=work,
        )
        answer["intra"]["seconds"] = round(time.monotonic() - t0, 2)
        if gpus < 2:
            answer["not_measured"].append(
                "intra-node links: one GPU (bus bandwidth 2(n-1)/n x algbw is 0 for n = 1; needs 2 GPUs "
                "or more)"
            )
        tools = spec.get("tools") or {}
        if tools.get("all_reduce_perf", True):
            answer["all_reduce_perf"] = all_reduce_perf(gpus, spec, work)
        for rnd in spec.get("rounds") or []:
            hosts = [str(h) for h in rnd["hosts"]]
            if me not in hosts:
                continue
            t0 = time.monotonic()
            result = collective(
                gpus,
                node_index=hosts.index(me),
                nodes=len(hosts),
                master=str(spec["addrs"][hosts[0]]),
                port=int(rnd["port"]),
                spec=spec,
                work=work,
            )
            result.update(hosts=hosts, round=rnd.get("round"), seconds=round(time.monotonic() - t0, 2))
            answer["results"].append(result)
            if "rows" in result:
                answer["ib_write_bw"].extend(ib_write_bw(rnd, me, spec, work))
    if not spec.get("rounds"):
        answer["not_measured"].append("inter-node links: one node")
    return answer


def main(argv: list[str] | None = None) -> int:
    """Print this node's answer as one JSON object."""
    args = sys.argv[1:] if argv is None else argv
    spec, me = json.loads(args[0]), args[1]
    print(json.dumps(measure(spec, me)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
