"""The stack probe's per-GPU matmul (roles/stack_check/files/mift_stack_probe.py), with a stand-in for
``torch.cuda``: the controller has no GPU, so the devices are the CPU under other names (a TEST DOUBLE of the
GPU runtime; the arithmetic is real torch)."""

from __future__ import annotations

import importlib.util
import types
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
PROBE = Path(__file__).resolve().parents[2] / "roles" / "stack_check" / "files" / "mift_stack_probe.py"


def _probe_module() -> Any:
    spec = importlib.util.spec_from_file_location("mift_stack_probe", PROBE)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _fake_torch(count: int, broken: frozenset[int] = frozenset()) -> Any:
    """torch with ``cuda`` replaced: ``count`` devices that are the CPU; ``broken`` ones raise like a GPU
    whose kernels cannot run."""

    def device(kind: str, index: int) -> Any:
        assert kind == "cuda"
        if index in broken:
            raise RuntimeError("HIP error: invalid device function")
        return torch.device("cpu")

    cuda = types.SimpleNamespace(
        device_count=lambda: count,
        is_available=lambda: count > 0,
        get_device_name=lambda index: f"TEST DOUBLE GPU {index}",
        synchronize=lambda device=None: None,
    )
    return types.SimpleNamespace(Generator=torch.Generator, randn=torch.randn, device=device, cuda=cuda)


def test_matmul_on_every_device() -> None:
    results = _probe_module().gpu_matmul(_fake_torch(8))
    assert [r["device"] for r in results] == list(range(8))
    assert all(r["ok"] and r["error"] is None for r in results)


def test_matmul_failure_is_recorded_not_raised() -> None:
    results = _probe_module().gpu_matmul(_fake_torch(3, broken=frozenset({1})))
    assert [r["ok"] for r in results] == [True, False, True]
    assert results[1]["error"] == "RuntimeError: HIP error: invalid device function"
    assert results[1]["name"] == "TEST DOUBLE GPU 1"
