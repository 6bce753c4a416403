"""The GPU path of ``launcher check`` without a GPU: the node program's gpu-allreduce
(node/gpu_allreduce.py) on this machine with its CPU TEST DOUBLE of the GPUs (gloo ranks instead of NCCL ones,
the same sweep and rounds), the judging of its answers (launcher.fabric.gpulinks), the tools' outputs (real
captures), and the planner reading a GPU record (launcher.engine.split.measured_links) built from the real
rccl-tests captures."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from launcher.engine.check_fabric import GPU_PROGRAM, choose
from launcher.engine.split import measured_links
from launcher.fabric import gpulinks, links, schedule
from launcher.fabric.perftools import all_reduce_perf
from launcher.planning.hardware import MI300X
from launcher.preflight.checks import NodeFacts
from launcher.transfer import nodeprogram

if TYPE_CHECKING:
    from collections.abc import Sequence

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
RCCL_1X8 = (FIXTURES / "nccl-tests" / "rccl_all_reduce_perf_1x8_mi300x.txt").read_text()
RCCL_2X8 = (FIXTURES / "nccl-tests" / "rccl_all_reduce_perf_2x8_mi300x.txt").read_text()
IB_WRITE = (FIXTURES / "perftest" / "ib_write_bw_bnxt_roce_gbits.txt").read_text()
MIB = 1 << 20


def _node(spec: dict[str, Any], me: str) -> subprocess.Popen[str]:
    """The node program's GPU all-reduce, as playbooks/check_allreduce.yml runs it."""
    argv = [sys.executable, str(nodeprogram.program_file()), GPU_PROGRAM, json.dumps(spec), me]
    return subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)


def test_the_node_script_on_two_nodes_of_one_test_double_rank_each() -> None:
    """The program as the playbook runs it, two "nodes" on loopback, one rank each (the one-GPU path):
    the intra-node sweep on each (busbw 0 for one rank, said as not measured), then the pair group over both
    ranks; the answers judged as the check judges them."""
    pytest.importorskip("torch")
    hosts = ["n1", "n2"]
    planned = schedule.planned_rounds(hosts, 29631)
    spec = gpulinks.node_spec(
        hosts,
        {"n1": "127.0.0.1", "n2": "127.0.0.1"},
        planned,
        intra_port=0,
        rdma_ports={},
        gid_index={},
        sizes=[MIB, 2 * MIB],
        iters=2,
        warmup=1,
    )
    procs = {}
    for i, host in enumerate(hosts):  # each node's loopback group needs its own port here (one machine)
        procs[host] = _node({**spec, "intra_port": 29641 + i, "test_double_cpu_ranks": 1}, host)
    answers = {h: json.loads(p.communicate(timeout=300)[0]) for h, p in procs.items()}
    for answer in answers.values():
        assert answer["gpus"] == 1 and answer["library"] == "gloo (TEST DOUBLE)"
        assert [r["bytes"] for r in answer["intra"]["rows"]] == [MIB, 2 * MIB]
        assert answer["intra"]["world"] == 1 and answer["intra"]["rows"][0]["busbw_gbs"] == 0.0
        assert answer["not_measured"] == [
            "intra-node links: one GPU (bus bandwidth 2(n-1)/n x algbw is 0 for n = 1; needs 2 GPUs or more)"
        ]
        assert answer["all_reduce_perf"] == {"missing": True}
        (group,) = answer["results"]
        assert group["hosts"] == hosts and group["world"] == 2 and group["wrong"] == 0
        big = group["rows"][-1]  # 2 ranks: busbw = algbw x 2(2-1)/2
        assert big["bytes"] == 2 * MIB and big["busbw_gbs"] == pytest.approx(big["algbw_gbs"], abs=0.002)
    fabric = gpulinks.merge(answers, planned)
    assert [r.label for r in fabric.results] == ["n1-n2"] and fabric.results[0].busbw_gbs
    assert fabric.bad == []
    assert "n1: all_reduce_perf (rccl-tests / nccl-tests) is not on the node: not run" in fabric.notes
    table = gpulinks.sweep_table(fabric)
    assert table[0].split() == ["busbw", "ranks", "1", "MiB", "2", "MiB"]
    assert [line.split()[:3] for line in table[1:3]] == [["n1", "(inside)", "1"], ["n2", "(inside)", "1"]]
    assert table[3].split()[:2] == ["n1-n2", "2"]


def _answer(rows: Sequence[dict[str, Any]] | None = None, **extra: Any) -> dict[str, Any]:
    intra = {
        "world": 8,
        "rows": list(rows or [{"bytes": MIB, "time_us": 10.0, "algbw_gbs": 1.0, "busbw_gbs": 1.75}]),
        "wrong": 0,
    }
    return {
        "transport": "gpu",
        "library": "RCCL",
        "gpus": 8,
        "intra": intra,
        "results": [],
        "ib_write_bw": [],
        "not_measured": [],
        **extra,
    }


def test_a_hung_group_is_a_slow_link_with_its_error_and_one_gpu_is_said() -> None:
    planned = schedule.planned_rounds(["n1", "n2"], 100)
    hung = {"hosts": ["n1", "n2"], "world": 16, "error": "hung: no answer within 300 s (workers killed)"}
    one_gpu = {**_answer(), "gpus": 1, "not_measured": ["intra-node links: one GPU (...)"], "results": [hung]}
    fabric = gpulinks.merge({"n1": _answer(results=[hung]), "n2": one_gpu}, planned)
    verdict = links.judge(fabric.results)
    assert verdict.bad == (
        "n1-n2: slow link (hung: no answer within 300 s (workers killed); below 0.050 GB/s)",
    )
    assert "n2: not measured: intra-node links: one GPU (...)" in fabric.notes


def test_tool_outputs_are_lines_and_bad_ones_name_node_and_tool() -> None:
    ok = {"rc": 0, "timed_out": False, "output": RCCL_1X8}
    cut = {"rc": 1, "timed_out": False, "output": RCCL_1X8.split("  134217728")[0]}
    hung = {"rc": 124, "timed_out": True, "timeout_s": 300.0, "output": RCCL_1X8.split("#       size")[0]}
    rows = [{"bytes": 8589934592, "time_us": 47600.0, "algbw_gbs": 180.4, "busbw_gbs": 315.7}]
    ib = {
        "hosts": ["n1", "n2"],
        "side": "client",
        "ports": ["mlx5_0/1", "mlx5_0/1"],
        "rc": 0,
        "timed_out": False,
        "output": IB_WRITE,
    }
    ib_bad = {**ib, "rc": 1, "output": IB_WRITE.split(" #bytes")[0]}
    fabric = gpulinks.merge(
        {
            "n1": _answer(rows, all_reduce_perf=ok, ib_write_bw=[ib]),
            "n2": _answer(all_reduce_perf=cut, ib_write_bw=[ib_bad]),
            "n3": _answer(all_reduce_perf=hung),
        },
        [],
    )
    assert fabric.tools == [
        "n1: all_reduce_perf (rccl-tests: Version develop:a7809b3, 8 ranks): busbw 315.69 GB/s at 8 "
        "GiB (in place "
        "315.91); torch.distributed at that size: 315.70",
        "n1:mlx5_0/1-n2:mlx5_0/1: ib_write_bw 363.47 Gb/sec average (Ethernet)",
    ]
    assert fabric.bad == [
        "n2: all_reduce_perf: truncated table: last size 67108864 bytes of 8589934592 (maxBytes) "
        "(exit status 1)",
        "n2: ib_write_bw: n1:mlx5_0/1-n2:mlx5_0/1: no result (no '#bytes #iterations BW peak' "
        "header) (exit status 1)",
        "n3: all_reduce_perf: hung: no result within 300.0 s (killed)",
    ]


def _rows(text: str) -> list[dict[str, Any]]:
    """The sweep rows of a real rccl-tests capture, 1 MiB .. 1 GiB, in the node script's shape."""
    parsed = all_reduce_perf(text)
    return [
        {"bytes": r.size_bytes, "time_us": r.time_us, "algbw_gbs": r.algbw_gbs, "busbw_gbs": r.busbw_gbs}
        for r in parsed.rows
        if MIB <= r.size_bytes <= 1024 * MIB
    ]


def _facts(hosts: list[str], nproc: int = 8) -> NodeFacts:
    return NodeFacts(
        hosts=hosts,
        train_address={h: f"10.0.0.{i}" for i, h in enumerate(hosts, 1)},
        stack={},
        gpus={},
        probe={h: {"net": {"boot_id": f"boot-{h}"}} for h in hosts},
        nproc_per_node=nproc,
    )


def _gpu_record(facts: NodeFacts) -> None:
    """A GPU record as the check saves it, its figures the real MI300X captures: one node of 8 inside, two
    nodes of 8 across."""
    planned = schedule.planned_rounds(facts.hosts, 100)
    inside = {"world": 8, "rows": _rows(RCCL_1X8), "wrong": 0}
    across = {"hosts": facts.hosts, "world": 16, "rows": _rows(RCCL_2X8), "wrong": 0}
    answers = {h: {**_answer(), "intra": inside, "results": [across]} for h in facts.hosts}
    fabric = gpulinks.merge(answers, planned)
    key = links.cache_key(facts.hosts, facts.train_address, facts.probe)
    assert key is not None
    gpulinks.save(key, facts.hosts, fabric, links.judge(fabric.results))


def test_the_planner_takes_intra_and_inter_node_bandwidth_from_the_gpu_record(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(links.CACHE_ENV, str(tmp_path))
    facts = _facts(["n1", "n2"])
    _gpu_record(facts)
    used = measured_links(MI300X, facts)
    assert used.intra_node_gbs == 313.66  # the 1 GiB row of the 1 x 8 MI300X capture
    assert used.inter_node_gbs == pytest.approx(181.74 * 2 * (2 - 1) / 2 / 8)  # 2 x 8: algbw x 2(n-1)/n / 8
    assert facts.notes == [
        "plan: intra-node bandwidth 313.66 GB/s, measured by launcher check (all-reduce bus "
        "bandwidth over the "
        "8 GPUs of n1 (the slowest node) at 1 GiB; instead of the MI300X preset's 336)",
        "plan: inter-node bandwidth 22.72 GB/s per GPU, measured by launcher check (algbw 181.74 "
        "GB/s x 2(n-1)/n "
        "/ GPUs per node, all 2 nodes, 16 ranks, at 1 GiB; instead of the MI300X preset's 48)",
    ]


def test_the_planner_never_takes_a_tcp_figure_and_says_which_preset_it_used(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(links.CACHE_ENV, str(tmp_path))
    facts = _facts(["n1", "n2"])
    used = measured_links(MI300X, facts)
    assert (used.intra_node_gbs, used.inter_node_gbs) == (336.0, 48.0)
    assert facts.notes[1] == (
        "plan: inter-node bandwidth 48 GB/s per GPU, the MI300X preset's (launcher check measured no GPU "
        "all-reduce on these nodes on this boot: not measured)"
    )
    key = links.cache_key(facts.hosts, facts.train_address, facts.probe)
    assert key is not None
    links.save(key, facts.hosts, links.judge([links.LinkResult(("n1", "n2"), 0.01, 16.0)]), nproc_per_node=8)
    facts.notes.clear()
    used = measured_links(MI300X, facts)
    assert (used.intra_node_gbs, used.inter_node_gbs) == (336.0, 48.0)  # 16 GB/s of gloo: not used
    assert facts.notes == [
        "plan: intra-node bandwidth 336 GB/s, the MI300X preset's (launcher check measured these "
        "nodes over TCP "
        "(gloo) only: not a GPU figure: not measured)",
        "plan: inter-node bandwidth 48 GB/s per GPU, the MI300X preset's (launcher check measured "
        "these nodes "
        "over TCP (gloo) only: not a GPU figure: not measured)",
    ]


def test_one_gpu_per_node_falls_back_to_the_preset_saying_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(links.CACHE_ENV, str(tmp_path))
    facts = _facts(["n1"], nproc=8)
    one = {
        **_answer(),
        "gpus": 1,
        "intra": {
            "world": 1,
            "rows": [{"bytes": MIB, "time_us": 5.0, "algbw_gbs": 200.0, "busbw_gbs": 0.0}],
            "wrong": 0,
        },
    }
    fabric = gpulinks.merge({"n1": one}, [])
    key = links.cache_key(facts.hosts, facts.train_address, facts.probe)
    assert key is not None
    gpulinks.save(key, facts.hosts, fabric, links.judge(fabric.results))
    assert measured_links(MI300X, facts).intra_node_gbs == 336.0
    assert facts.notes == [
        "plan: intra-node bandwidth 336 GB/s, the MI300X preset's (one GPU per node: not measured)"
    ]


def test_auto_measures_the_gpus_only_when_every_node_has_a_gpu_backend() -> None:
    assert choose("auto", {"a": {"backend": "cuda"}, "b": {"backend": "rocm"}}, ["a", "b"])[0] == "gpu"
    assert choose("auto", {"a": {"backend": "cuda"}, "b": {"backend": "cpu"}}, ["a", "b"]) == (
        "tcp",
        "no GPU backend on b",
    )
    assert choose("auto", None, ["a"]) == ("tcp", "the GPU test did not run (--no-gpu-test): no GPU seen")
    assert choose("gpu", None, ["a"]) == ("gpu", "--fabric gpu")
    assert choose("tcp", {"a": {"backend": "cuda"}}, ["a"]) == ("tcp", "--fabric tcp")
