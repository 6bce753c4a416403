"""The PCIe ACS script of the rdma role (roles/rdma/files/mift_pcie_acs.py).

Which bridges it clears, decided from ``lspci -D -nn -vvv`` text: a real capture of a host without PCI
bridges and constructed TEST DOUBLES with ACS (provenance: tests/fixtures/lspci/README.md). lspci and setpci
themselves are TEST DOUBLES here (a recording runner, or stand-in executables on PATH).
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "roles" / "rdma" / "files" / "mift_pcie_acs.py"
FIXTURES = REPO / "tests" / "fixtures" / "lspci"
REAL_NO_BRIDGE = (FIXTURES / "kvm_virtio_no_bridge.txt").read_text(encoding="utf-8")
ACS_TEST_DOUBLE = (FIXTURES / "bridges_acs_TEST_DOUBLE.txt").read_text(encoding="utf-8")
NOT_ROOT_TEST_DOUBLE = (FIXTURES / "bridge_not_root_TEST_DOUBLE.txt").read_text(encoding="utf-8")
ACSCTL_ON = "SrcValid+ TransBlk- ReqRedir+ CmpltRedir+ UpstreamFwd+ EgressCtrl- DirectTrans-"
ACS_ON = [("0000:00:01.1", "root port"), ("0000:02:00.0", "downstream"), ("0001:80:01.1", "domain 1")]

_spec = importlib.util.spec_from_file_location("mift_pcie_acs", SCRIPT)
assert _spec is not None
assert _spec.loader is not None
acs = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = acs  # dataclasses look their module up
_spec.loader.exec_module(acs)


def test_real_capture_without_bridges_has_nothing_to_change() -> None:
    assert acs.acs_enabled_bridges(REAL_NO_BRIDGE) == []
    assert acs.bridge_count(REAL_NO_BRIDGE) == 0  # its Host bridge [0600] is not a PCI-to-PCI bridge


def test_bridges_with_srcvalid_on_are_chosen_in_lspci_order() -> None:
    bridges = acs.acs_enabled_bridges(ACS_TEST_DOUBLE)
    assert [b.bdf for b in bridges] == [bdf for bdf, _ in ACS_ON]
    assert bridges[0].acsctl == ACSCTL_ON
    # left alone: the upstream port with every flag off, the bridge without ACS, the GPU endpoint, the NIC
    assert acs.bridge_count(ACS_TEST_DOUBLE) == 5


@pytest.mark.parametrize(
    "header",
    [
        "0000:00:01.1 PCI bridge [0604]: TEST DOUBLE [ffff:0001]",  # -nn with pci.ids
        "0000:00:01.1 Class [0604]: Device [ffff:0001]",  # -nn without the pci.ids names
        "00:01.1 PCI bridge: TEST DOUBLE",  # neither -D nor -nn
    ],
)
def test_a_bridge_is_known_by_its_class_in_every_lspci_form(header: str) -> None:
    text = f"{header}\n\tCapabilities: [2a0 v1] Access Control Services\n\t\tACSCtl:\tSrcValid+ TransBlk-\n"
    assert [b.bdf for b in acs.acs_enabled_bridges(text)] == [header.split(maxsplit=1)[0]]


def test_srcvalid_off_with_other_flags_on_is_left_alone() -> None:
    text = "0000:00:01.1 PCI bridge [0604]: TEST DOUBLE\n\t\tACSCtl:\tSrcValid- TransBlk- ReqRedir+\n"
    assert acs.acs_enabled_bridges(text) == []


def test_lspci_run_by_another_user_than_root_is_refused() -> None:
    with pytest.raises(acs.AcsError) as caught:
        acs.acs_enabled_bridges(NOT_ROOT_TEST_DOUBLE)
    assert str(caught.value) == "lspci could not read the capabilities of 0000:00:01.1 (run as root)"


class RecordingRunnerTestDouble:
    """Stands in for lspci and setpci: prints the given lspci text, records every setpci call."""

    def __init__(self, lspci_text: str, readback: str = "0000") -> None:
        self.lspci_text = lspci_text
        self.readback = readback
        self.calls: list[list[str]] = []

    def __call__(self, argv: list[str]) -> subprocess.CompletedProcess[str]:
        self.calls.append(argv)
        if argv[0] == "lspci":
            return subprocess.CompletedProcess(argv, 0, self.lspci_text, "")
        out = "" if argv[-1].endswith("=0000") else self.readback + "\n"
        return subprocess.CompletedProcess(argv, 0, out, "")


def _run(monkeypatch: pytest.MonkeyPatch, runner: RecordingRunnerTestDouble, *, dry_run: bool) -> list[str]:
    monkeypatch.setattr(acs, "_run", runner)
    monkeypatch.setattr(acs, "_tool", lambda name: name)
    lines: list[str] = []
    acs.run(dry_run=dry_run, emit=lines.append)
    return lines


def test_each_bridge_is_cleared_read_back_and_named_in_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    runner = RecordingRunnerTestDouble(ACS_TEST_DOUBLE)
    lines = _run(monkeypatch, runner, dry_run=False)
    assert runner.calls[0] == ["lspci", "-D", "-nn", "-vvv"]
    want_calls = []
    for bdf, _ in ACS_ON:
        want_calls += [["setpci", "-s", bdf, "ECAP_ACS+0x6.w=0000"], ["setpci", "-s", bdf, "ECAP_ACS+0x6.w"]]
    assert runner.calls[1:] == want_calls
    assert lines == [
        "mift-pcie-acs: 0000:00:01.1: ACS disabled (ACSCtl was: SrcValid+ TransBlk- ReqRedir+ CmpltRedir+ "
        "UpstreamFwd+ EgressCtrl- DirectTrans-)",
        "mift-pcie-acs: 0000:02:00.0: ACS disabled (ACSCtl was: SrcValid+ TransBlk- ReqRedir+ CmpltRedir+ "
        "UpstreamFwd+ EgressCtrl- DirectTrans-)",
        "mift-pcie-acs: 0001:80:01.1: ACS disabled (ACSCtl was: SrcValid+ TransBlk- ReqRedir- CmpltRedir- "
        "UpstreamFwd- EgressCtrl- DirectTrans-)",
    ]


def test_dry_run_names_the_bridges_and_writes_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    runner = RecordingRunnerTestDouble(ACS_TEST_DOUBLE)
    lines = _run(monkeypatch, runner, dry_run=True)
    assert runner.calls == [["lspci", "-D", "-nn", "-vvv"]]
    assert [line.split(": ")[1] for line in lines] == [bdf for bdf, _ in ACS_ON]
    assert all(": ACS would be disabled (ACSCtl: SrcValid+ " in line for line in lines)


def test_nothing_enabled_prints_one_none_line(monkeypatch: pytest.MonkeyPatch) -> None:
    runner = RecordingRunnerTestDouble(REAL_NO_BRIDGE)
    assert _run(monkeypatch, runner, dry_run=False) == [
        "mift-pcie-acs: none: no PCI bridge with ACS enabled (ACSCtl SrcValid+), 0 bridges"
    ]
    assert len(runner.calls) == 1


def test_a_bridge_that_keeps_acs_after_the_write_stops_the_script(monkeypatch: pytest.MonkeyPatch) -> None:
    runner = RecordingRunnerTestDouble(ACS_TEST_DOUBLE, readback="001d")
    lines: list[str] = []
    monkeypatch.setattr(acs, "_run", runner)
    monkeypatch.setattr(acs, "_tool", lambda name: name)
    with pytest.raises(acs.AcsError) as caught:
        acs.run(dry_run=False, emit=lines.append)
    assert str(caught.value) == "0000:00:01.1: ACS Control reads '001d' after writing 0000"
    assert lines == []


def test_the_role_reports_changed_exactly_for_the_bridge_lines(monkeypatch: pytest.MonkeyPatch) -> None:
    """_rdma_acs_changed_line (roles/rdma/vars/main.yml) is the changed_when of the role's run."""
    role_vars = yaml.safe_load((REPO / "roles" / "rdma" / "vars" / "main.yml").read_text(encoding="utf-8"))
    changed = re.compile(role_vars["_rdma_acs_changed_line"], re.MULTILINE)
    for dry_run in (False, True):
        lines = _run(monkeypatch, RecordingRunnerTestDouble(ACS_TEST_DOUBLE), dry_run=dry_run)
        assert [bool(changed.search(line)) for line in lines] == [True, True, True]
    none = _run(monkeypatch, RecordingRunnerTestDouble(REAL_NO_BRIDGE), dry_run=False)
    assert changed.search("\n".join(none)) is None


def _stand_ins(tmp_path: Path, lspci_text: str) -> dict[str, str]:
    """lspci and setpci TEST DOUBLE executables on PATH; setpci appends its arguments to setpci.log."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (tmp_path / "lspci.txt").write_text(lspci_text, encoding="utf-8")
    (bin_dir / "lspci").write_text(f'#!/bin/sh\ncat "{tmp_path}/lspci.txt"\n', encoding="utf-8")
    (bin_dir / "setpci").write_text(
        f'#!/bin/sh\necho "$*" >> "{tmp_path}/setpci.log"\ncase "$3" in *=*) ;; *) echo 0000 ;; esac\n',
        encoding="utf-8",
    )
    for tool in ("lspci", "setpci"):
        (bin_dir / tool).chmod(0o755)
    return {**os.environ, "PATH": f"{bin_dir}:/usr/bin:/bin"}


def test_command_line_clears_each_bridge_through_setpci(tmp_path: Path) -> None:
    env = _stand_ins(tmp_path, ACS_TEST_DOUBLE)
    done = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True, env=env, check=False)
    assert (done.returncode, done.stderr) == (0, "")
    assert [line.split(": ")[1] for line in done.stdout.splitlines()] == [bdf for bdf, _ in ACS_ON]
    log = (tmp_path / "setpci.log").read_text(encoding="utf-8").splitlines()
    assert log[::2] == [f"-s {bdf} ECAP_ACS+0x6.w=0000" for bdf, _ in ACS_ON]


def test_command_line_errors_are_one_line(tmp_path: Path) -> None:
    env = {**os.environ, "PATH": str(tmp_path)}  # no lspci
    done = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True, env=env, check=False)
    assert (done.returncode, done.stdout, done.stderr) == (
        1,
        "",
        "error: mift-pcie-acs: lspci not found (install pciutils)\n",
    )
    usage = subprocess.run([sys.executable, SCRIPT, "--now"], capture_output=True, text=True, check=False)
    assert usage.returncode == 2
    assert usage.stderr == "error: mift-pcie-acs: usage: mift_pcie_acs.py [--dry-run], got --now\n"
