"""The per-node GPU check of ``launcher check`` (``launcher/node/gpu_check.py``): its threshold decision,
its process scan, and its answer where torch sees no GPU. The measurement itself needs a GPU (measured on an
H200: bench/gpu/results/points/p29_gpu_check.md)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from launcher.node import gpu as mift_gpu
from launcher.node import gpu_check as check

SCRIPT = Path(check.__file__)


def _gpu(index: int, tflops: float, membw: float) -> dict[str, object]:
    return {"gpu": index, "name": "GPU", "tflops": tflops, "membw_gbs": membw}


def test_eight_even_gpus_pass() -> None:
    gpus = [_gpu(i, 700.0 + i, 4300.0 - i) for i in range(8)]
    assert check.judge(gpus, min_tflops=600, min_membw_gbs=3500) == []


def test_a_gpu_below_the_floor_is_named_with_its_number_and_the_floor() -> None:
    problems = check.judge([_gpu(0, 790.0, 4300.0)], min_tflops=2000)
    assert problems == ["GPU 0: bf16 matmul 790 TFLOP/s below the floor 2000"]


def test_a_gpu_slower_than_its_siblings_is_named_even_without_a_floor() -> None:
    gpus = [_gpu(0, 700.0, 4300.0), _gpu(1, 700.0, 4300.0), _gpu(2, 500.0, 4300.0), _gpu(3, 700.0, 2000.0)]
    problems = check.judge(gpus)
    assert problems == [
        "GPU 2: bf16 matmul 500 TFLOP/s below 80% of the best GPU's 700",
        "GPU 3: memory copy 2000 GB/s below 80% of the best GPU's 4300",
    ]


def test_the_slow_fraction_is_a_threshold_not_a_tolerance() -> None:
    gpus = [_gpu(0, 700.0, 4300.0), _gpu(1, 565.0, 4300.0)]  # 80.7% of the best
    assert check.judge(gpus) == []
    assert check.judge(gpus, slow_fraction=0.9) == [
        "GPU 1: bf16 matmul 565 TFLOP/s below 90% of the best GPU's 700"
    ]


def test_a_floor_counts_once_per_gpu_not_again_as_slow() -> None:
    gpus = [_gpu(0, 700.0, 4300.0), _gpu(1, 100.0, 4300.0)]
    assert check.judge(gpus, min_tflops=600) == ["GPU 1: bf16 matmul 100 TFLOP/s below the floor 600"]


def test_a_gpu_whose_measurement_failed_is_bad_and_the_others_still_judged() -> None:
    gpus = [{"gpu": 0, "error": "CUDA out of memory"}, _gpu(1, 700.0, 4300.0)]
    assert check.judge(gpus, min_membw_gbs=5000) == [
        "GPU 0: CUDA out of memory",
        "GPU 1: memory copy 4300 GB/s below the floor 5000",
    ]


def test_no_gpu_is_bad() -> None:
    assert check.judge([]) == ["no GPU visible to torch"]


def test_device_pattern_is_the_samplers() -> None:
    # the script travels alone to the node: it keeps its own copy of the pattern, held equal here
    assert check.GPU_DEVICE_RE.pattern == mift_gpu.GPU_DEVICE_RE.pattern


def test_processes_holding_a_gpu_device_are_listed_but_not_the_check_itself(tmp_path: Path) -> None:
    dev = tmp_path / "dev"
    for pid, target, name in (
        ("11", "/dev/nvidia0", "python3"),
        ("12", "/dev/null", "bash"),
        ("13", "/dev/kfd", "me"),
    ):
        fd = tmp_path / pid / "fd"
        fd.mkdir(parents=True)
        os.symlink(target, fd / "3")
        (tmp_path / pid / "comm").write_text(name + "\n")
    dev.mkdir()
    assert check.gpu_processes(tmp_path, exclude=13) == ["11 (python3)"]


@pytest.mark.skipif(
    subprocess.run(
        [sys.executable, "-c", "import torch; raise SystemExit(torch.cuda.is_available())"], check=False
    ).returncode
    != 0,
    reason="a GPU is visible: this test is of a node without one",
)
def test_without_a_gpu_the_script_prints_one_json_line_and_fails() -> None:
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--min-tflops", "600"],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert proc.returncode == 1
    lines = proc.stdout.splitlines()
    assert len(lines) == 1
    answer = json.loads(lines[0])
    assert answer["ok"] is False
    assert answer["problems"][-1] == "no GPU visible to torch"
    assert answer["thresholds"]["min_tflops"] == 600
