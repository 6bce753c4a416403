"""GPU telemetry: the node sampler's parsers over the real captures, its decisions, the tool timeout, the
sampler with the amd-smi TEST DOUBLE, the check after the run, and what the controller shows and records.

Real captures (tests/fixtures/gpu-tools/, INDEX.md and PROVENANCE.md give their sources):

* ROCm 7 shape ``{"gpu_data": [...]}`` with ``{"value", "unit"}`` values: the only real ``amd-smi metric
  --json`` output in the corpus, ROCm/amdsmi issue #134 (MI300X, ROCm 7.0.2), printed as Python repr from pdb
  and cut by the search index inside ``usage``; the test reads GPU 0's ``gpu`` and ``usage`` lines as printed,
  closes ``usage`` before the cut (``jpeg_busy``) and wraps them as amd-smi 26.x does.
* ROCm 6 field names: no real ROCm 6 ``metric --json`` capture exists. The real ``amd-smi metric`` text
  capture of the ROCm blog (ROCm 6.2 era) is amd-smi's JSON with its keys upper-cased for the text view; the
  test turns it back (keys lower-cased, values as printed, e.g. ``"234 W"``) into the bare list ROCm 6 prints.
* ``amd-smi metric --mem-usage`` (ROCm 7.2.4, 2 x MI300X VF), the same way, in the ROCm 7 wrapper.
* ECC counts, PCIe and xGMI errors, nvidia-smi: no real capture in the corpus; the inputs of those tests are
  built here and say so.
"""

from __future__ import annotations

import ast
import json
import os
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from node_agent import agent_json, wait_state

from launcher.follow.telemetry import WarningOnce, after_fields, first_gpu_fault, gpu_lines
from launcher.follow.verdict import Judge
from launcher.node import gpu as g
from mift_testsupport import gpu_telemetry
from mift_testsupport.gpu_telemetry import metric_document

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "gpu-tools"
ROCM7_PDB_CAPTURE = (
    FIXTURES
    / "rocm7/amd-smi/EDGE_metric-json-as-python-repr_mi300x_dpx_rocm7.0.2_amdsmi-issue134_TRUNCATED.txt"
)
BLOG_METRIC = FIXTURES / "amd-smi/mi300x_x8_rocmblogs_amd-smi-overview_metric.txt"
VF_MEM_USAGE = FIXTURES / "rocm7/amd-smi/NEG_metric-mem-usage_mi300x-vf_x2_rocm7.2.4_fleet-amd-task.txt"
DOUBLE = Path(gpu_telemetry.__file__).resolve().parent / "amd_smi_double.py"


def text_view_to_json(text: str) -> list[dict[str, Any]]:
    """Return amd-smi's text view (``GPU: 0`` blocks, 4-space indents, ``KEY: value``) as the JSON objects it
    was printed from: keys lower-cased, values as printed."""
    gpus: list[dict[str, Any]] = []
    stack: list[tuple[int, dict[str, Any]]] = []
    for line in text.splitlines():
        if not line.strip():
            continue
        key, _, value = line.strip().partition(":")
        indent = len(line) - len(line.lstrip())
        if indent == 0 and key == "GPU":
            gpus.append({"gpu": int(value)})
            stack = [(0, gpus[-1])]
            continue
        while stack and stack[-1][0] >= indent:
            stack.pop()
        parent = stack[-1][1]
        if value.strip():
            parent[key.lower()] = value.strip()
        else:
            parent[key.lower()] = {}
            stack.append((indent, parent[key.lower()]))
    return gpus


def rocm7_gpu0_document() -> dict[str, Any]:
    """Return GPU 0 of the ROCm 7.0.2 pdb capture (ROCm/amdsmi issue #134): ``gpu`` and ``usage`` as printed,
    ``usage`` closed before the cut."""
    lines = ROCM7_PDB_CAPTURE.read_text(encoding="utf-8").splitlines()
    gpu = int(lines[lines.index("(Pdb) rocm_metrics['gpu_data'][0]['gpu']") + 1])
    usage_line = lines[lines.index("(Pdb) rocm_metrics['gpu_data'][0]['usage']") + 1]
    usage = ast.literal_eval(usage_line.split(", 'jpeg_busy'")[0] + "}")
    return {"gpu_data": [{"gpu": gpu, "usage": usage}]}


# --- parsers over the real captures ------------------------------------------------------------------


def test_rocm7_gpu_data_shape_reads_usage_and_leaves_the_unseen_unknown() -> None:
    (gpu,) = g.parse_amd_metric(json.dumps(rocm7_gpu0_document(), indent=4))
    assert gpu["gpu"] == 0
    assert gpu["util_pct"] == 0.0
    assert gpu["mem_util_pct"] == 0.0
    # what the cut capture does not show stays unknown, never 0
    assert gpu["power_w"] is None
    assert gpu["ecc_uncorrectable"] is None


def test_rocm6_list_shape_from_the_blog_text_capture() -> None:
    doc = text_view_to_json(BLOG_METRIC.read_text(encoding="utf-8"))
    (gpu,) = g.parse_amd_metric(json.dumps(doc))  # a bare list, as ROCm 6's amd-smi prints
    assert gpu["gpu"] == 0
    assert gpu["util_pct"] == 100.0  # GFX_ACTIVITY: 100 %
    assert gpu["mem_util_pct"] == 0.0  # UMC_ACTIVITY: 0 %
    assert gpu["power_w"] == 234.0  # SOCKET_POWER: 234 W
    assert gpu["throttle"] == "UNTHROTTLED"
    assert gpu["gfx_clock_mhz"] == 2107.0  # the highest of GFX_0..GFX_2
    assert gpu["temp_c"] is None  # the capture stops before TEMPERATURE


def test_vram_from_the_mem_usage_capture() -> None:
    doc = {"gpu_data": text_view_to_json(VF_MEM_USAGE.read_text(encoding="utf-8"))}
    gpus = g.parse_amd_metric(json.dumps(doc))
    assert [x["gpu"] for x in gpus] == [0, 1]
    assert all(x["vram_used_mib"] == 285.0 and x["vram_total_mib"] == 196288.0 for x in gpus)
    assert g.summary(gpus)["vram_used_mib"] == 570.0


def test_double_document_carries_the_watch_capture_values() -> None:
    gpus = g.parse_amd_metric(json.dumps(metric_document()))
    assert len(gpus) == 8
    # GPU 0 of amd-smi monitor --watch 5: 750 W, 69 C, 50 C, 1278 MHz, 100 %, 2.0/192.0 GB
    first = gpus[0]
    assert (first["power_w"], first["temp_c"], first["temp_mem_c"]) == (750.0, 69.0, 50.0)
    assert (first["gfx_clock_mhz"], first["util_pct"], first["vram_used_mib"]) == (1278.0, 100.0, 2048.0)
    assert all(x["ecc_uncorrectable"] == 0 for x in gpus)


def test_amd_warning_line_before_the_json_is_skipped() -> None:
    text = "WARNING: User is missing the following required groups: render, video.\n" + json.dumps(
        rocm7_gpu0_document()
    )
    assert g.parse_amd_metric(text)[0]["gpu"] == 0


@pytest.mark.parametrize("text", ["", "amd-smi: error\n", '{"cpu_data": []}', "[1, 2]"])
def test_amd_unreadable_output_raises(text: str) -> None:
    with pytest.raises(ValueError, match=r"JSON|gpu_data|Expecting"):
        g.parse_amd_metric(text)


def test_amd_ecc_pcie_xgmi_fields() -> None:
    """Built here (no real capture has them): the keys of amd-smi's ``ecc``, ``ecc_blocks``, ``pcie``,
    ``xgmi_err`` sections, in both value forms."""
    entry = {
        "gpu": 5,
        "ecc": {"total_correctable_count": 3, "total_uncorrectable_count": {"value": 1, "unit": ""}},
        "pcie": {"replay_count": 2, "nak_sent_count": "N/A"},
        "xgmi_err": 0,
    }
    (gpu,) = g.parse_amd_metric(json.dumps([entry]))
    assert (gpu["ecc_correctable"], gpu["ecc_uncorrectable"]) == (3.0, 1.0)
    assert gpu["pcie_errors"] == {"replay_count": 2}
    assert gpu["xgmi_errors"] == 0.0
    blocks = {"gpu": 0, "ecc_blocks": {"UMC": {"uncorrectable_count": 2}, "SDMA": {"uncorrectable_count": 1}}}
    assert g.parse_amd_metric(json.dumps([blocks]))[0]["ecc_uncorrectable"] == 3.0


def test_nvidia_query_line() -> None:
    """Built here: no real nvidia-smi capture is in the corpus. The columns are those of NVIDIA_FIELDS;
    nvidia-smi writes ``[N/A]`` where a GPU has no value."""
    line = "0, GPU-5e3c, 87, 651.20, 61, 74, 120034, 143771, 1980, 2619, 0x0000000000000000, 0, [N/A]\n"
    (gpu,) = g.parse_nvidia_query(line)
    assert (gpu["gpu"], gpu["util_pct"], gpu["power_w"], gpu["temp_c"], gpu["temp_mem_c"]) == (
        0,
        87,
        651.2,
        61,
        74,
    )
    assert (gpu["vram_used_mib"], gpu["vram_total_mib"], gpu["gfx_clock_mhz"]) == (120034, 143771, 1980)
    assert gpu["throttle"] == "0x0000000000000000"
    assert (gpu["ecc_correctable"], gpu["ecc_uncorrectable"]) == (0, None)
    with pytest.raises(ValueError, match="columns"):
        g.parse_nvidia_query("0, 87\n")


# --- decisions ------------------------------------------------------------------------------------------


def _gpus(ecc: list[float | None]) -> list[dict[str, Any]]:
    return [{"gpu": i, "ecc_uncorrectable": e} for i, e in enumerate(ecc)]


def test_faults_name_the_gpu() -> None:
    base = _gpus([0, 0, 0, 5])
    assert g.gpu_faults(base, _gpus([0, 0, 0, 5])) == []
    assert g.gpu_faults(base, _gpus([0, 0, 2, 5])) == ["GPU 2: uncorrectable ECC errors rose from 0 to 2"]
    assert g.gpu_faults(base, _gpus([0, 0, 0])) == ["GPU 3 disappeared (3 of 4 GPUs answer)"]
    assert g.gpu_faults(base, _gpus([0, None, 0, 5])) == []  # a count amd-smi could not read is no fault
    assert g.gpu_faults(_gpus([None, 0]), _gpus([4, 0])) == []  # nothing to compare with


# --- the tool call, its timeout, the sampler with the TEST DOUBLE -------------------------------------


@pytest.fixture
def double(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The amd-smi TEST DOUBLE with its files in ``tmp_path``; returns the mode file."""
    (tmp_path / "metric.json").write_text(json.dumps(metric_document()))
    monkeypatch.setenv("MIFT_AMD_SMI_DOC_FILE", str(tmp_path / "metric.json"))
    monkeypatch.setenv("MIFT_AMD_SMI_MODE_FILE", str(tmp_path / "mode"))
    monkeypatch.setenv("MIFT_AMD_SMI_STATE_DIR", str(tmp_path / "state"))
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "amd-smi").write_text(f'#!/bin/sh\nexec {sys.executable} {DOUBLE} "$@"\n')
    (tmp_path / "bin" / "amd-smi").chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ.get('PATH', '/usr/bin:/bin')}")
    (tmp_path / "noproc").mkdir()  # a /proc without processes, for the check after the run
    return tmp_path / "mode"


def _tool(timeout_s: float = 5.0) -> g.Tool:
    tool = g.Tool.find(timeout_s)  # the double, first in PATH
    assert tool is not None
    assert tool.argv[1:] == ["metric", "--json"]
    return tool


def test_hanging_tool_is_killed_with_its_children(double: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    double.write_text("hang\n")
    # this test's processes carry a mark of their own: a hung double of another test session (the faults
    # suite's gpu-tool-hangs case runs one on a test host, visible in this machine's /proc) is not counted
    mark = f"MIFT_TEST_MARK={uuid.uuid4().hex}"
    monkeypatch.setenv(*mark.split("=", 1))
    tool = _tool(timeout_s=1.0)
    t0 = time.monotonic()
    with pytest.raises(g.ToolError, match=r"amd-smi metric --json: no answer in 1 s") as err:
        tool.call()
    assert err.value.timed_out
    assert time.monotonic() - t0 < 4
    time.sleep(0.2)
    left = [p.name for p in Path("/proc").iterdir() if p.name.isdigit() and _marked(p, mark)]
    assert left == [], "the hung double's child outlived the timeout"


def _marked(proc: Path, mark: str) -> bool:
    if proc.name == str(os.getpid()):
        return False
    try:
        return mark.encode() in (proc / "environ").read_bytes().split(b"\0")
    except OSError:
        return False


def test_failing_and_missing_tools(double: Path, tmp_path: Path) -> None:
    double.write_text("fail\n")
    with pytest.raises(g.ToolError, match=r"exit status 1: TEST DOUBLE \(mift\): amd-smi failed"):
        _tool().call()
    with pytest.raises(g.ToolError) as err:
        g.Tool("amd-smi", str(tmp_path / "none"), g.AMD_ARGV).call()
    assert err.value.missing


def test_sampler_fails_on_rising_ecc_naming_the_gpu(double: Path, tmp_path: Path) -> None:
    double.write_text("ecc-rising 3\n")  # baseline = call 1, samples 2 and 3
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    sampler = g.Sampler(run_dir, 1.0, _tool())
    sampler.take_baseline()
    assert sampler.sample_once() == ""
    assert sampler.sample_once() == "GPU 3: uncorrectable ECC errors rose from 0 to 1"
    lines = [json.loads(x) for x in (run_dir / g.TELEMETRY_FILE).read_text().splitlines()]
    assert [x["kind"] for x in lines] == ["baseline", "sample", "sample"]
    assert len(lines[0]["gpus"]) == 8
    status = g.status_fields(run_dir)
    assert status["gpu_fault"] == "GPU 3: uncorrectable ECC errors rose from 0 to 1"
    assert status["gpu"]["gpus"] == 8
    assert status["gpu"]["power_w"] == 2014.0  # the 8 GPUs of the watch capture
    # after the run: the ECC count is still above the baseline, so the node is not healthy
    after = g.after_check(run_dir, proc_root=tmp_path / "noproc")
    assert not after["ok"]
    assert after["problems"] == ["GPU 3: uncorrectable ECC errors rose from 0 to 1"]


def test_sampler_thread_sees_a_gpu_disappear(double: Path, tmp_path: Path) -> None:
    double.write_text("gone 2\n")
    sampler = g.Sampler(tmp_path, 0.2, _tool())
    sampler.start()
    deadline = time.monotonic() + 10
    while not sampler.fault and time.monotonic() < deadline:
        time.sleep(0.05)
    sampler.stop()
    assert sampler.fault == "GPU 7 disappeared (7 of 8 GPUs answer)"


def test_hanging_tool_turns_sampling_off_with_one_warning(double: Path, tmp_path: Path) -> None:
    double.write_text("hang\n")
    sampler = g.Sampler(tmp_path, 0.2, _tool(timeout_s=1.0))
    t0 = time.monotonic()
    sampler.start()  # the baseline times out: start returns after the tool timeout, not later
    took = time.monotonic() - t0
    time.sleep(0.6)
    sampler.stop()
    assert took < 3
    assert g.status_fields(tmp_path)["telemetry_warning"] == (
        "amd-smi metric --json: no answer in 1 s; GPU sampling off for this run"
    )
    assert not (tmp_path / g.TELEMETRY_FILE).exists()
    assert g.after_check(tmp_path, proc_root=tmp_path / "noproc")["checked"] == ["processes"]


def test_stop_during_a_call_is_not_a_tool_failure(double: Path, tmp_path: Path) -> None:
    """The CI failure of stop 33: the run ended while a sample was in flight; stop() killed the call (exit
    status -9) and the sampler reported that as the tool failing. A call that stop() kills warns nothing."""
    double.write_text("hang\n")
    sampler = g.Sampler(tmp_path, 30, _tool(timeout_s=30.0))
    sampler.baseline = []
    caller = threading.Thread(target=sampler.sample_once)
    caller.start()
    deadline = time.monotonic() + 10
    while sampler.tool is not None and sampler.tool.proc is None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert sampler.tool is not None and sampler.tool.proc is not None, "the call never started"
    sampler.stop()
    caller.join(timeout=10)
    assert not caller.is_alive()
    assert sampler.state.get("warning") is None
    assert g.status_fields(tmp_path).get("telemetry_warning") is None


def test_sampler_off_and_absent_tool(tmp_path: Path) -> None:
    assert g.Sampler.for_job(tmp_path, {"telemetry_period_s": 0}) is None
    assert g.Sampler.for_job(tmp_path, {}) is None
    sampler = g.Sampler(tmp_path, 30, None)
    sampler.take_baseline()
    assert sampler.sample_once() == ""
    assert g.status_fields(tmp_path) == {"gpu": None, "telemetry_warning": None, "gpu_fault": None}


def test_after_check_names_a_process_on_a_gpu(tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    (proc / "4242" / "fd").mkdir(parents=True)
    (proc / "4242" / "comm").write_text("python3\n")
    (proc / "4242" / "fd" / "7").symlink_to("/dev/kfd")
    (proc / "99" / "fd").mkdir(parents=True)
    (proc / "99" / "fd" / "1").symlink_to("/dev/null")
    after = g.after_check(tmp_path, proc_root=proc)
    assert after == {
        "ok": False,
        "problems": ["process on a GPU: 4242 (python3): /dev/kfd"],
        "checked": ["processes"],
        "t": after["t"],
    }
    assert json.loads((tmp_path / g.AFTER_FILE).read_text())["ok"] is False


# --- the controller -------------------------------------------------------------------------------------


def test_judge_fails_the_run_naming_host_and_gpu() -> None:
    judge = Judge(["host1", "host2"])
    nodes = {
        "host1": {"state": "running"},
        "host2": {"state": "running", "gpu_fault": "GPU 3: uncorrectable ECC errors rose from 0 to 1"},
    }
    verdict = judge(nodes)
    assert (verdict.state, verdict.reason) == (
        "failed",
        "host2: GPU 3: uncorrectable ECC errors rose from 0 to 1; trainer stopped",
    )
    assert first_gpu_fault(["host1"], nodes) == ""


def test_warning_printed_once_per_node() -> None:
    once = WarningOnce()
    nodes = {"host1": {"telemetry_warning": "amd-smi metric --json: no answer in 2 s; GPU sampling off"}}
    assert once.new_lines(nodes) == [
        "warning: host1: GPU telemetry: amd-smi metric --json: no answer in 2 s; GPU sampling off"
    ]
    assert once.new_lines(nodes) == []
    assert once.new_lines({"host2": {"telemetry_warning": None}}) == []


def test_status_gpu_table() -> None:
    latest = {"t": time.time() - 12, **g.summary(g.parse_amd_metric(json.dumps(metric_document())))}
    lines = gpu_lines(["host1", "host2"], {"host1": {"gpu": latest}, "host2": {"state": "running"}})
    assert lines[0].split() == ["HOST", "GPUS", "UTIL", "POWER", "TEMP", "HBM", "TEMP", "MEMORY", "SAMPLED"]
    assert lines[1].split()[:10] == ["host1", "8", "12%", "2014", "W", "69", "C", "50", "C", "13.9/1536"]
    assert len(lines) == 2
    assert gpu_lines(["host1"], {"host1": {"state": "running"}}) == []


class _Collected:
    def __init__(self, answers: dict[str, Any]) -> None:
        self.answers = answers

    def report(self, host: str, name: str) -> Any:
        return self.answers.get(host, {}).get(name)


def test_after_fields_mark_the_node() -> None:
    collected = _Collected(
        {
            "host1": {"collect": {"gpu_after": {"ok": True, "problems": []}}},
            "host2": {
                "collect": {
                    "gpu_after": {"ok": False, "problems": ["process on a GPU: 7 (python3): /dev/kfd"]}
                }
            },
        }
    )
    checks, notes = after_fields(collected, ["host1", "host2"])  # type: ignore[arg-type]
    assert checks["host1"]["ok"] and not checks["host2"]["ok"]
    assert notes == [
        "host2: GPUs not idle or not healthy after the run: process on a GPU: 7 (python3): /dev/kfd"
    ]


def test_job_spec_default_lives_in_the_spec() -> None:
    from launcher.spec.jobspec import JobSpec, Telemetry  # noqa: PLC0415

    assert Telemetry().period_s == 30.0
    assert JobSpec(name="x", train_config=Path("t.yaml")).telemetry.period_s == 30.0
    with pytest.raises(ValueError, match="at least 1 second"):
        Telemetry(period_s=0.5)
    assert os.environ.get("MIFT_AMD_SMI_MODE_FILE") is None  # the double's files are per test


# --- the node agent with the sampler (the fake trainer, the double in PATH) ------------------------------

FAKE_TRAINER = Path(__file__).with_name("fake_trainer.py")


def _run_dir(tmp_path: Path, period_s: float, steps: int) -> Path:
    run_dir = tmp_path / "r-gpu"
    run_dir.mkdir()
    job = {
        "run_id": "r-gpu",
        "node_rank": 0,
        "output_dir": str(run_dir / "output"),
        "expect_outputs": ["adapter_model.safetensors", "all_results.json"],
        "argv": [
            sys.executable,
            str(FAKE_TRAINER),
            str(run_dir / "output"),
            "--steps",
            str(steps),
            "--step-s",
            "0.1",
        ],
        "telemetry_period_s": period_s,
    }
    (run_dir / "job.json").write_text(json.dumps(job))
    (run_dir / "env.json").write_text("{}")
    return run_dir


def test_agent_stops_the_trainer_on_a_gpu_fault(double: Path, tmp_path: Path) -> None:
    double.write_text("ecc-rising 3\n")  # the baseline, one good sample, then GPU 3 breaks
    run_dir = _run_dir(tmp_path, 1.0, steps=600)
    assert agent_json("start", str(run_dir))["ok"]
    status = wait_state(run_dir, {"failed", "finished"})
    assert status["state"] == "failed"
    assert status["gpu_fault"] == "GPU 3: uncorrectable ECC errors rose from 0 to 1"
    assert status["reason"] == "GPU 3: uncorrectable ECC errors rose from 0 to 1"
    assert status["last_log"].get("current_steps", 0) < 600  # stopped, not finished
    assert status["processes"] == 0
    assert status["gpu"]["gpus"] == 8
    collected = agent_json("collect", str(run_dir))
    assert collected["gpu_after"]["ok"] is False
    log = (run_dir / "trainer.log").read_text()
    assert "mift_agent: GPU 3: uncorrectable ECC errors rose from 0 to 1; stopping the trainer" in log


def test_agent_run_completes_with_a_hanging_tool(double: Path, tmp_path: Path) -> None:
    double.write_text("hang\n")
    run_dir = _run_dir(tmp_path, 2.0, steps=5)
    assert agent_json("start", str(run_dir))["ok"]
    status = wait_state(run_dir, {"failed", "finished"})
    assert status["state"] == "finished"
    assert (
        status["telemetry_warning"]
        == "amd-smi metric --json: no answer in 2 s; GPU sampling off for this run"
    )
    assert status["gpu_fault"] is None
    after = agent_json("collect", str(run_dir))["gpu_after"]
    # the hung tool is not called again after the run; processes on this machine's GPUs (if any) may show
    assert after["checked"] == ["processes"]
    assert all(p.startswith("process on a GPU: ") for p in after["problems"])


def test_gpu_plot_beside_the_loss_curve(tmp_path: Path) -> None:
    from launcher.follow.telemetry import gpu_series  # noqa: PLC0415
    from launcher.rundir.plot import plot_gpus  # noqa: PLC0415

    gpus = g.parse_amd_metric(json.dumps(metric_document()))
    for host, t0 in (("host1", 1000.0), ("host2", 1001.0)):
        (tmp_path / host).mkdir()
        lines = [{"t": t0 + 30 * i, "kind": "sample", "gpus": gpus} for i in range(3)]
        (tmp_path / host / g.TELEMETRY_FILE).write_text(
            "".join(json.dumps(x) + "\n" for x in lines) + "not json\n"
        )
    series = gpu_series(tmp_path, ["host1", "host2", "host3"])
    assert sorted(series) == ["host1", "host2"]
    assert series["host1"] == [(0.0, 12.5, 2014.0), (30.0, 12.5, 2014.0), (60.0, 12.5, 2014.0)]
    assert series["host2"][0] == (1.0, 12.5, 2014.0)
    assert plot_gpus(series, tmp_path / "gpu.png", "t")
    assert (tmp_path / "gpu.png").read_bytes()[:4] == b"\x89PNG"
    assert not plot_gpus({}, tmp_path / "none.png", "t")
