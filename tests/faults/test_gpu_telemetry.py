"""GPU faults while a job runs, through the amd-smi ``metric --json`` TEST DOUBLE with fault modes
(``mift_testsupport.amd_smi_double``, put on the hosts as /usr/local/bin/amd-smi, ahead of the AMD repository
test double): a GPU whose uncorrectable ECC count rises fails the run naming host and GPU; a hanging amd-smi
never blocks the run. The jobs sample every 2 s (job spec ``telemetry.period_s``).
"""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING, Any

import pytest

from mift_testsupport.gpu_telemetry import HOST_MODE, install_amd_smi_double, remove_amd_smi_double, rose_at
from mift_testsupport.launcher import finish

from .conftest import HOSTS

if TYPE_CHECKING:
    from collections.abc import Iterator

    from mift_testsupport.cluster import Cluster

pytestmark = [pytest.mark.rig, pytest.mark.slow]

PERIOD_S = 2.0
BOUND_S = 30.0
LONG_STEPS = 400
HUNG_DOUBLE = "pgrep -afx 'sleep 100000' || true"  # -x: not this probe's own command line


@pytest.fixture
def doubles(cluster: Cluster) -> Iterator[None]:
    """The double on every host (mode ok) for one test; taken off after it."""
    for host in HOSTS:
        install_amd_smi_double(cluster, host, "ok")
    try:
        yield
    finally:
        for host in HOSTS:
            remove_amd_smi_double(cluster, host)


def _status_gpu_lines(cluster: Cluster, run_id: str) -> list[str]:
    out = cluster.run("status", run_id, timeout=300).stdout
    return [line for line in out.splitlines() if line.strip().startswith(("HOST  GPUS", "host"))]


@pytest.mark.usefixtures("doubles")
def test_gpu_ecc_rising(cluster: Cluster, fault_record: dict[str, Any]) -> None:
    """GPU 3 of host2 reports an uncorrectable ECC error mid-run: the run fails naming host2 and GPU 3."""
    fault_record.update(
        case="gpu-ecc-rising",
        group="2 faults",
        input="amd-smi double on host2: GPU 3's uncorrectable ECC count 0 -> 1 after the first logged step "
        f"(telemetry.period_s {PERIOD_S:g})",
        expected=f"the fault seen within 2 sampling periods ({2 * PERIOD_S:g} s) of the switch; run exits 1, "
        "status failed naming host2 and GPU 3; no trainer on any host within 30 s; host2 marked in the "
        "record (gpu_after not ok), host1 not",
    )
    name = "faults-gpu-ecc"
    # recovery off: this case shows the stop that ends the run (recovery, on by default, retries a GPU error)
    job = cluster.job(
        name, max_steps=LONG_STEPS, paced=True, telemetry={"period_s": PERIOD_S}, recovery={"max_restarts": 0}
    )
    proc, log = cluster.start("run", str(job), "-i", str(cluster.inventory))
    run_id = cluster.wait_step(cluster.run_id_of(name), proc)
    t0 = time.monotonic()
    # when the mode file was written, by the host's clock (the test hosts share this machine's clock)
    switched = float(cluster.ssh(2, f"printf 'ecc-rising 1\\n' > {HOST_MODE} && stat -c %.3Y {HOST_MODE}"))
    took = cluster.wait_no_trainers(120, since=t0)
    out = finish(proc, log)
    rec = cluster.record(name)
    rose = rose_at(cluster, 2)
    state = cluster.node_state(2, run_id)
    telemetry = json.loads(cluster.node_file(2, run_id, "telemetry.json") or "{}")
    detected = float(telemetry.get("fault_at") or 0) - switched
    stopped = float(state.get("ended_at") or 0) - switched
    verdict = next((e["t"] for e in rec.get("timeline", []) if e.get("status") == "stopping"), 0) - switched
    lines = _status_gpu_lines(cluster, run_id)
    after = rec.get("gpu_after") or {}
    samples = (cluster.run_dir(name) / "nodes" / "host2" / "telemetry.jsonl").read_text().splitlines()
    host1_after, host2_after = after.get("host1", {}), after.get("host2", {})
    fault_record["observed"] = (
        f"launcher exit {proc.returncode}; status {rec.get('status')} ({rec.get('result_reason')}); "
        f"after the switch: count raised at {(rose or 0) - switched:.1f} s, seen by host2's sampler at "
        f"{detected:.1f} s, run judged failed by the launcher at {verdict:.1f} s, host2's trainer ended at "
        f"{stopped:.1f} s, no trainer on any host at {took:.1f} s; gpu_after host1 "
        f"ok={host1_after.get('ok')}, host2 ok={host2_after.get('ok')} "
        f"({'; '.join(host2_after.get('problems', []))}); {len(samples)} samples collected from host2"
    )
    print("\n".join(["", *[ln for ln in out.splitlines() if "GPU" in ln or "failed" in ln], *lines]))
    assert proc.returncode == 1, out[-3000:]
    assert rec.get("status") == "failed", rec.get("timeline")
    assert "host2: GPU 3: uncorrectable ECC errors rose from 0 to 1" in str(rec.get("result_reason"))
    assert rose is not None and 0 < detected <= 2 * PERIOD_S, (switched, rose, telemetry)
    assert 0 < verdict <= BOUND_S, rec.get("timeline")
    assert took <= BOUND_S, f"trainers left for {took:.1f} s"
    assert host2_after.get("ok") is False and host1_after.get("ok") is True, after
    assert any(line.strip().startswith("host2") and "GiB" in line for line in lines), lines


@pytest.mark.usefixtures("doubles")
def test_gpu_tool_hangs(cluster: Cluster, fault_record: dict[str, Any]) -> None:
    """amd-smi hangs on host1 from the start: the run completes, with one warning line."""
    fault_record.update(
        case="gpu-tool-hangs",
        group="2 faults",
        input=f"amd-smi double on host1 sleeps forever on every call (telemetry.period_s {PERIOD_S:g})",
        expected="run exits 0 (succeeded); exactly one warning line naming host1 and amd-smi; no hung "
        "amd-smi left on host1",
    )
    cluster.ssh(1, f"printf 'hang\\n' > {HOST_MODE}")
    name = "faults-gpu-hang"
    job = cluster.job(name, max_steps=8, telemetry={"period_s": PERIOD_S})
    t0 = time.monotonic()
    proc, log = cluster.start("run", str(job), "-i", str(cluster.inventory))
    out = finish(proc, log, timeout=900)
    took = time.monotonic() - t0
    rec = cluster.record(name)
    warnings = [line for line in out.splitlines() if "GPU telemetry" in line]
    left = cluster.ssh(1, HUNG_DOUBLE).strip()
    fault_record["observed"] = (
        f"launcher exit {proc.returncode} after {took:.0f} s; status {rec.get('status')}; warning lines: "
        f"{warnings}; hung amd-smi left on host1: {left or 'none'}"
    )
    print("\n".join(["", *warnings]))
    assert proc.returncode == 0, out[-3000:]
    assert rec.get("status") == "succeeded"
    assert warnings == [
        f"warning: host1: GPU telemetry: amd-smi metric --json: no answer in {PERIOD_S:g} s; "
        "GPU sampling off for this run"
    ], out[-3000:]
    assert not left, left
