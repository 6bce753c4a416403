"""The CI measuring tools: ``tools/repeat.py`` (the flake hunt's tally) and ``bench/cpu_accounting.py`` (a CI
run's CPU by kind of process, from acct(5) records), on files written here in their real formats; and lint's
``tools/import_report.py`` layer check over this repo's pyproject.toml."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

REPO = Path(__file__).resolve().parents[2]


def load(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[path.stem] = module
    spec.loader.exec_module(module)
    return module


repeat = load(REPO / "tools" / "repeat.py")
accounting = load(REPO / "bench" / "cpu_accounting.py")
import_report = load(REPO / "tools" / "import_report.py")


def test_every_module_of_the_launcher_is_in_a_layer_and_a_new_top_level_one_is_not() -> None:
    name, layers = import_report.layer_names(REPO / "pyproject.toml", "launcher")
    assert name and "launcher.engine" in layers and "launcher.node" in layers  # "a | b" lines split
    modules = {"launcher", "launcher.engine", "launcher.engine.run", "launcher.exceptions"}
    assert import_report.outside_layers(modules, "launcher", layers) == []
    stray = {*modules, "launcher.staging", "launcher.enginex"}  # a prefix of a layer's name is not in it
    assert import_report.outside_layers(stray, "launcher", layers) == ["launcher.enginex", "launcher.staging"]


def test_comp_t_is_a_13_bit_mantissa_and_a_base_8_exponent() -> None:
    assert accounting.comp_t(0) == 0
    assert accounting.comp_t(100) == 100
    assert accounting.comp_t((1 << 13) | 5) == 40  # 5 * 8
    assert accounting.comp_t((2 << 13) | 0x1FFF) == 0x1FFF * 64


def record(pid: int, ppid: int, comm: str, btime: int, etime_s: float, cpu_ticks: int) -> bytes:
    """One acct_v3 record as the kernel writes it (version 3; utime in ticks, stime 0)."""
    fields = (0, 3, 0, 0, 0, 0, pid, ppid, btime, etime_s * accounting.AHZ, cpu_ticks, *[0] * 7)
    return accounting.RECORD.pack(*fields, comm.encode())


def test_each_process_counts_to_its_nearest_named_ancestor_and_reused_pids_do_not_mislead(
    tmp_path: Path,
) -> None:
    pacct = tmp_path / "pacct"
    pacct.write_bytes(
        b"".join(
            [
                # a rank (recorded under a thread's name) under torchrun under llamafactory-cli under sshd
                record(30, 20, "pt_gloo_runloop", 1000, 50, 700),
                record(20, 10, "pt_elastic", 1000, 52, 90),
                record(10, 5, "llamafactory-cl", 1000, 53, 290),
                record(5, 1, "sshd", 999, 60, 1),
                # an Ansible module on a host: python3 under sh under another ssh session
                record(41, 40, "python3", 2000, 1, 12),
                record(40, 6, "sh", 2000, 1, 0),
                record(6, 1, "sshd", 1999, 3, 1),
                # pid 10 again, long after llamafactory-cli ended: a poll's ansible-playbook and its fork
                record(11, 10, "ansible-playboo", 3000, 1, 20),
                record(10, 2, "ansible-playboo", 3000, 2, 60),
            ]
        )
        + b"\0" * 10  # a record cut short at the end is left out
    )
    procs = accounting.read_pacct(pacct)
    assert len(procs) == 9 and procs[0].cpu_s == 7.0 and procs[0].end == 1050.0
    by_pid = accounting.parent_index(procs)
    groups = [accounting.group(p, by_pid) for p in procs]
    trainer = "trainer (llamafactory-cli, torchrun, ranks)"
    host = "host: ssh session (ansible modules, agent, test commands)"
    ansible = "controller: ansible"
    assert groups == [trainer, trainer, trainer, host, host, host, host, ansible, ansible], groups
    out = subprocess.run(
        [sys.executable, str(REPO / "bench" / "cpu_accounting.py"), str(pacct)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "9 processes ended" in out and "12 CPU-s in all" in out, out
    group_rows = out.split("\n\n")[1].splitlines()[1:]  # CPU-s, share, processes, group
    shares = {row.split(maxsplit=3)[3]: row.split()[1] for row in group_rows}
    assert (
        shares[trainer] == "92.0%" and shares["controller: ansible"] == "6.8%" and shares[host] == "1.2%"
    ), out


def test_repeat_tallies_which_tests_failed_in_which_run(tmp_path: Path) -> None:
    tests = tmp_path / "t"
    tests.mkdir()
    flag = tmp_path / "fail-next"
    flag.write_text("")
    # the first run fails (the flag is there, and the test removes it); the second passes
    (tests / "test_flaky.py").write_text(
        "import pathlib\n"
        f"FLAG = pathlib.Path({str(flag)!r})\n"
        "def test_flaky():\n"
        "    failing = FLAG.exists()\n"
        "    FLAG.unlink(missing_ok=True)\n"
        "    assert not failing, 'the flag was up'\n"
        "def test_steady():\n"
        "    pass\n"
    )
    proc = subprocess.run(
        [sys.executable, str(REPO / "tools" / "repeat.py"), "2", "--keep", str(tmp_path / "j"), str(tests)],
        capture_output=True,
        text=True,
        check=False,
        cwd=tmp_path,
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "run 1/2: 2 tests, 1 failed" in proc.stdout and "run 2/2: 2 tests, 0 failed" in proc.stdout
    assert "2 runs of 2 tests" in proc.stdout and "1 with a failure" in proc.stdout
    tally = proc.stdout.split("with a failure\n", 1)[1].splitlines()
    assert tally[0].startswith("  1 of 2 (runs [1]): ") and tally[0].endswith("test_flaky::test_flaky"), tally
    assert tally[1].strip() == "AssertionError: the flag was up", tally
    first, second = (repeat.outcomes(tmp_path / "j" / f"run-{n}.xml") for n in (1, 2))
    assert sorted(m for m in first.values() if m) == ["AssertionError: the flag was up"], first
    assert len(second) == 2 and not any(second.values()), second


def test_repeat_that_ran_nothing_does_not_say_zero_failures(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    proc = subprocess.run(
        [sys.executable, str(REPO / "tools" / "repeat.py"), "1", str(tmp_path / "empty")],
        capture_output=True,
        text=True,
        check=False,
        cwd=tmp_path,
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "no test ran" in proc.stdout


compare = load(REPO / "tools" / "ci_compare.py")


def ci_row(name: str, start: int, wall: float, rc: int, cpu: int, hosts: int | str) -> str:
    """One row of .ci/run's stage table, in its format (record, cpu_used)."""
    took = f"{wall:7.1f} s  rc={rc}  cpu  90%"
    return f"   {name:34s} {f'start +{start} s':>14s} {took}  cpu-s {cpu:5d} (hosts {hosts:>5})"


CI_OUT = "\n".join(
    (
        "== stage: lint",
        "... its output ...",
        "== stage timings (start: seconds into CI)",
        ci_row("lint", 63, 86.5, 0, 94, "-"),
        ci_row("faults", 1400, 1010.4, 0, 853, 618) + "  top: 168.57s test_x",
        f"   {'total':34s} {'':14s} 2410.6 s",
        "== stage logs: /tmp/mift-ci.x",
    )
)
SLURM_ROW = ci_row("slurm-e2e", 766, 633.5, 1, 554, 370)


def ci_compare(*args: Path | str) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, str(REPO / "tools" / "ci_compare.py"), *map(str, args)]
    return subprocess.run(argv, capture_output=True, text=True, check=False)


def test_ci_compare_reads_the_stage_table_of_a_ci_output() -> None:
    table = compare.read_table(CI_OUT)
    assert table.total_s == 2410.6
    assert table.stages["faults"] == compare.Stage("faults", 1010.4, 0, 853, 618)
    assert list(table.stages) == ["lint", "faults"]


def test_ci_compare_lists_each_stage_before_and_after_with_the_difference(tmp_path: Path) -> None:
    after = CI_OUT.replace("cpu-s   853 (hosts   618)", "cpu-s   700 (hosts   500)").replace(
        "2410.6 s", "2000.0 s"
    )
    after = after.replace("== stage logs", f"{SLURM_ROW}\n== stage logs")
    (tmp_path / "a.out").write_text(CI_OUT)
    (tmp_path / "b.out").write_text(after)
    out = ci_compare(tmp_path / "a.out", tmp_path / "b.out")
    assert out.returncode == 0, out.stderr
    rows = {line.split()[0]: line for line in out.stdout.splitlines()[1:]}
    assert rows["faults"].split()[-1] == "-153"
    assert rows["slurm-e2e"].endswith("rc!=0") and " - " in rows["slurm-e2e"]  # in the second run only
    assert "947 (  618)" in rows["all"] and "1348 (  870)" in rows["all"] and "2000.0" in rows["all"]


def test_ci_compare_says_in_one_line_when_a_file_has_no_table(tmp_path: Path) -> None:
    (tmp_path / "a.out").write_text("== stage: lint\nboom\n")
    out = ci_compare(tmp_path / "a.out", tmp_path / "a.out")
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.strip().splitlines() == [f"error: {tmp_path / 'a.out'}: no '== stage timings' table"]


def test_ci_compare_lists_the_costliest_cases_of_both_runs(tmp_path: Path) -> None:
    before = CI_OUT.replace(
        "... its output ...",
        "cpu 40.0 s (hosts 30.0) tests/faults/test_a.py::test_one\n"
        "cpu 9.5 s (hosts 0.0) tests/unit/t.py::test_u",
    )
    after = CI_OUT.replace("... its output ...", "cpu 12.0 s (hosts -) tests/faults/test_a.py::test_one")
    (tmp_path / "a.out").write_text(before)
    (tmp_path / "b.out").write_text(after)
    assert compare.read_cases(after) == {"lint tests/faults/test_a.py::test_one": 12.0}
    out = ci_compare(tmp_path / "a.out", tmp_path / "b.out", "--cases", "5")
    assert out.returncode == 0, out.stderr
    cases = out.stdout.split("\n\n")[1].splitlines()
    assert cases[1].split() == ["40.0", "12.0", "lint", "test_one"]
    assert cases[2].split() == ["9.5", "-", "lint", "test_u"]
